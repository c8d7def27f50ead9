// BLAKE2b of the report page against RFC 7693's vectors, OpenSSL's BLAKE2b-512 (node:crypto),
// and the hashes libsodium signed in real ferry records.
'use strict';
const test = require('node:test');
const assert = require('node:assert');
const crypto = require('node:crypto');
const fs = require('node:fs');
const path = require('node:path');
const { blake2b } = require('../../ferryctl/report_page/blake2b.js');

const hex = (b) => Buffer.from(b).toString('hex');
const measurements = path.join(__dirname, '../../docs/measurements');

test('RFC 7693 Appendix A: BLAKE2b-512("abc")', () => {
  assert.strictEqual(hex(blake2b(new TextEncoder().encode('abc'))),
    'ba80a53f981c4d0d6a2797b69f12f6e94c212f14685ac4b74b12bb6fdbffa2d1' +
    '7d87c5392aab792dc252d5de4533cc9518d38aa8dbf1925ab92386edd4009923');
});

test('BLAKE2b-512 of the empty string (the reference implementation\'s vector)', () => {
  assert.strictEqual(hex(blake2b(new Uint8Array(0))),
    '786a02f742015903c6c6fd852552d272912f4740e15847618a86e217f71f5419' +
    'd25e1031afee585313896444934eb04b903a685b1448b755d56f701afe9be2ce');
});

test('shorter digests: BLAKE2b-256("abc") is a different hash, not a prefix', () => {
  assert.strictEqual(hex(blake2b(new TextEncoder().encode('abc'), 32)),
    'bddd813c634239723171ef3fee98579b94964e3bb1cb3e427262c8c068d52319');
});

test('random data around every block boundary equals OpenSSL\'s BLAKE2b-512', () => {
  const sizes = [1, 63, 64, 111, 112, 127, 128, 129, 255, 256, 257, 383, 384, 385, 1023, 1024, 1025, 65537];
  for (const n of sizes) {
    const data = crypto.randomBytes(n);
    const want = crypto.createHash('blake2b512').update(data).digest('hex');
    assert.strictEqual(hex(blake2b(new Uint8Array(data))), want, 'size ' + n);
  }
});

// FERRY_SODIUM_BLAKE2B: tests/report_page/sodium_blake2b.c, built by ctest's build.
test('equals libsodium\'s crypto_generichash (BLAKE2b-512) for lengths around every block boundary', (t) => {
  const tool = process.env.FERRY_SODIUM_BLAKE2B;
  if (!tool) return t.skip('FERRY_SODIUM_BLAKE2B not set (run through ctest)');
  const sizes = [0, 1, 3, 127, 128, 129, 255, 256, 257, 1000, 4096, 100003];
  const out = require('node:child_process').execFileSync(tool, sizes.map(String)).toString().trim().split('\n');
  assert.strictEqual(out.length, sizes.length);
  for (const line of out) {
    const [n, want] = line.split(' ');
    const data = new Uint8Array(Number(n)).map((_, j) => j % 251);
    assert.strictEqual(hex(blake2b(data)), want, 'length ' + n);
  }
});

test('a one-bit change anywhere changes the hash', () => {
  const data = new Uint8Array(crypto.randomBytes(300));
  const base = hex(blake2b(data));
  for (const at of [0, 127, 128, 299]) {
    const d = data.slice();
    d[at] ^= 1;
    assert.notStrictEqual(hex(blake2b(d)), base, 'byte ' + at);
  }
});

test('libsodium\'s prehash of real signed records: Ed25519 verifies over this BLAKE2b', () => {
  for (const name of ['h200-overlap-2026-12-03', 'h200-overlap-2026-12-02', 'h200-tune-2026-12-02']) {
    const data = fs.readFileSync(path.join(measurements, name + '.json'));
    const sigLine = fs.readFileSync(path.join(measurements, name + '.json.minisig'), 'utf8').split('\n')[1];
    const pubLine = fs.readFileSync(path.join(measurements, name + '.pub'), 'utf8').split('\n')[1];
    const sig = Buffer.from(sigLine, 'base64').subarray(10);
    const raw = Buffer.from(pubLine, 'base64').subarray(10);
    const key = crypto.createPublicKey({ key: Buffer.concat([Buffer.from('302a300506032b6570032100', 'hex'), raw]), format: 'der', type: 'spki' });
    assert.ok(crypto.verify(null, blake2b(new Uint8Array(data)), key, sig), name);
  }
});

test('refuses what is not bytes or a digest length out of range', () => {
  assert.throws(() => blake2b('abc'), TypeError);
  assert.throws(() => blake2b(new Uint8Array(1), 0), RangeError);
  assert.throws(() => blake2b(new Uint8Array(1), 65), RangeError);
});
