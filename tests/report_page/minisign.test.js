// The page's minisign parsing and its check of one record, with node's WebCrypto Ed25519.
'use strict';
const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const path = require('node:path');
const M = require('../../ferryctl/report_page/minisign.js');
const { keyPair, sign, recordId } = require('./signer.js');

const subtle = globalThis.crypto.subtle;
const measurements = path.join(__dirname, '../../docs/measurements');
const real = (name) => ({
  data: new Uint8Array(fs.readFileSync(path.join(measurements, name + '.json'))),
  sig: fs.readFileSync(path.join(measurements, name + '.json.minisig'), 'utf8'),
  pub: fs.readFileSync(path.join(measurements, name + '.pub'), 'utf8'),
});

function report(kp, body) {
  const data = Buffer.from(body || JSON.stringify({ format: 'ferry-overlap-report/1', issued_at: '2026-12-04T10:00:00Z', n: Math.random() }) + '\n');
  return { data: new Uint8Array(data), sig: sign(kp, data, 'ferry report overlap ' + recordId(data)), pub: kp.pub };
}

test('parses a public key: its id as minisign prints it', () => {
  const k = M.parsePublicKey(real('h200-overlap-2026-12-03').pub);
  assert.strictEqual(k.idHex, 'C5EECC22AF91BEFE');
  assert.strictEqual(k.key.length, 32);
  const kp = keyPair([1, 2, 3, 4, 5, 6, 7, 0xab]);
  assert.strictEqual(M.parsePublicKey(kp.pub).idHex, 'AB07060504030201');
  assert.strictEqual(M.parsePublicKey('\n  ' + kp.pub.split('\n')[1] + '  \n').idHex, 'AB07060504030201', 'the key line alone, pasted with spaces');
});

test('refuses what is not an Ed25519 minisign public key', () => {
  const line = real('h200-overlap-2026-12-03').pub.split('\n')[1];
  for (const bad of ['', 'untrusted comment: x\n', line.slice(0, -4), line.slice(0, 20), 'not*base64', Buffer.from('XX' + 'a'.repeat(40)).toString('base64')]) {
    assert.throws(() => M.parsePublicKey(bad), Error, JSON.stringify(bad));
  }
});

test('parses a signature file: key id, trusted comment', () => {
  const s = M.parseSignature(real('h200-overlap-2026-12-03').sig);
  assert.strictEqual(s.keyIdHex, 'C5EECC22AF91BEFE');
  assert.strictEqual(s.trustedComment, 'ferry report overlap FRY-7PEYV-FEST3-ZQ81S-MAXF8');
  assert.strictEqual(s.signature.length, 64);
  assert.strictEqual(s.globalSignature.length, 64);
  const crlf = M.parseSignature(real('h200-overlap-2026-12-03').sig.replace(/\n/g, '\r\n'));
  assert.strictEqual(crlf.trustedComment, s.trustedComment);
});

test('refuses damaged signature files', () => {
  const lines = real('h200-overlap-2026-12-03').sig.split('\n');
  const cases = {
    'too few lines': lines.slice(0, 3).join('\n'),
    'truncated signature': [lines[0], lines[1].slice(0, -8), lines[2], lines[3]].join('\n'),
    'truncated global signature': [lines[0], lines[1], lines[2], lines[3].slice(0, 40)].join('\n'),
    'no trusted comment line': [lines[0], lines[1], 'trusted: x', lines[3]].join('\n'),
    'unknown algorithm': [lines[0], Buffer.concat([Buffer.from('XY'), Buffer.from(lines[1], 'base64').subarray(2)]).toString('base64'), lines[2], lines[3]].join('\n'),
  };
  for (const [what, text] of Object.entries(cases)) assert.throws(() => M.parseSignature(text), Error, what);
});

test('the record id matches ferryctl\'s (libsodium SHA-256) for real records', async () => {
  assert.strictEqual(await M.recordId(subtle, real('h200-overlap-2026-12-03').data), 'FRY-7PEYV-FEST3-ZQ81S-MAXF8');
  assert.strictEqual(await M.recordId(subtle, real('h200-tune-2026-12-02').data), 'FRY-6BNG7-PA99V-MW86Q-8ZJMF');
});

test('real signed records from the H200 verify, with their key ids', async () => {
  for (const [name, id] of [['h200-overlap-2026-12-03', 'C5EECC22AF91BEFE'], ['h200-overlap-2026-12-02', '9781FEE384F03F3E'], ['h200-tune-2026-12-02', '075CBEA50F44E75E']]) {
    const r = real(name);
    const v = await M.verifyRecord(subtle, r.data, r.sig, r.pub);
    assert.strictEqual(v.status, 'verified', name + ': ' + v.reason);
    assert.strictEqual(v.keyIdHex, id);
  }
});

test('every edited byte of a record fails as "the data"', async () => {
  const r = real('h200-overlap-2026-12-03');
  for (const at of [0, 1, 100, Math.floor(r.data.length / 2), r.data.length - 1]) {
    const d = r.data.slice();
    d[at] ^= 0x01;
    const v = await M.verifyRecord(subtle, d, r.sig, r.pub);
    assert.strictEqual(v.status, 'failed', 'byte ' + at);
    assert.strictEqual(v.part, 'data', 'byte ' + at);
  }
  const longer = new Uint8Array(r.data.length + 1);
  longer.set(r.data);
  longer[r.data.length] = 0x0a;
  assert.strictEqual((await M.verifyRecord(subtle, longer, r.sig, r.pub)).part, 'data', 'a byte appended');
});

test('an edited trusted comment fails as "the comment"', async () => {
  const r = real('h200-overlap-2026-12-03');
  const sig = r.sig.replace('ferry report overlap', 'ferry report tune');
  const v = await M.verifyRecord(subtle, r.data, sig, r.pub);
  assert.strictEqual(v.status, 'failed');
  assert.strictEqual(v.part, 'comment');
});

test('another key fails as "the key", naming both ids; the same id with other key bytes, or a changed signature, fails as either', async () => {
  const r = real('h200-overlap-2026-12-03');
  const other = keyPair();
  const v = await M.verifyRecord(subtle, r.data, r.sig, other.pub);
  assert.strictEqual(v.status, 'failed');
  assert.strictEqual(v.part, 'key');
  assert.match(v.reason, new RegExp('C5EECC22AF91BEFE.*' + other.idHex));
  const sameId = keyPair(Buffer.from(M.parsePublicKey(r.pub).id));
  const w = await M.verifyRecord(subtle, r.data, r.sig, sameId.pub);
  assert.strictEqual(w.status, 'failed');
  assert.strictEqual(w.part, 'key-or-signature', 'not "the data was changed": the record is the signed one');
  // The signature's bytes changed (its length kept): it is not the data that changed either.
  const lines = r.sig.split('\n');
  const raw = Buffer.from(lines[1], 'base64');
  raw[40] ^= 1;
  const changed = [lines[0], raw.toString('base64'), lines[2], lines[3]].join('\n');
  assert.strictEqual((await M.verifyRecord(subtle, r.data, changed, r.pub)).part, 'key-or-signature');
});

test('a truncated or damaged signature fails as "the signature"', async () => {
  const r = real('h200-overlap-2026-12-03');
  const lines = r.sig.split('\n');
  for (const sig of [[lines[0], lines[1].slice(0, 60), lines[2], lines[3]].join('\n'), lines.slice(0, 2).join('\n'), '']) {
    const v = await M.verifyRecord(subtle, r.data, sig, r.pub);
    assert.strictEqual(v.status, 'failed');
    assert.strictEqual(v.part, 'signature');
  }
});

test('a signature over another record\'s id fails (the trusted comment names the record)', async () => {
  const kp = keyPair();
  const data = Buffer.from('{"format": "ferry-overlap-report/1"}\n');
  const sig = sign(kp, data, 'ferry report overlap FRY-00000-00000-00000-00000');
  const v = await M.verifyRecord(subtle, new Uint8Array(data), sig, kp.pub);
  assert.strictEqual(v.status, 'failed');
  assert.match(v.reason, /record id/);
  const foreign = sign(kp, data, 'something else');
  assert.strictEqual((await M.verifyRecord(subtle, new Uint8Array(data), foreign, kp.pub)).part, 'comment');
});

test('a legacy "Ed" signature is refused, as ferryctl verify refuses it: a prehashed one relabelled "Ed" would verify over its hash', async () => {
  const crypto = require('node:crypto');
  const { blake2b } = require('../../ferryctl/report_page/blake2b.js');
  const kp = keyPair();
  const r = report(kp);
  const lines = r.sig.split('\n');
  const raw = Buffer.from(lines[1], 'base64');
  // The algorithm bytes are not signed: relabel the record's signature "Ed" and offer its hash as the data.
  const relabelled = [lines[0], Buffer.concat([Buffer.from('Ed'), raw.subarray(2)]).toString('base64'), lines[2], lines[3]].join('\n');
  const hash = blake2b(r.data, 64);
  const v = await M.verifyRecord(subtle, hash, relabelled, r.pub);
  assert.strictEqual(v.status, 'failed');
  assert.strictEqual(v.part, 'signature', v.reason);
  assert.match(v.reason, /legacy/);
  // A genuine legacy signature (Ed25519 over the data itself, trusted comment and all) is refused too.
  const tc = 'ferry report overlap ' + recordId(Buffer.from(r.data));
  const sig = crypto.sign(null, Buffer.from(r.data), kp.privateKey);
  const global = crypto.sign(null, Buffer.concat([sig, Buffer.from(tc)]), kp.privateKey);
  const legacy = 'untrusted comment: legacy\n' + Buffer.concat([Buffer.from('Ed'), kp.id, sig]).toString('base64') +
    '\ntrusted comment: ' + tc + '\n' + global.toString('base64') + '\n';
  const w = await M.verifyRecord(subtle, r.data, legacy, kp.pub);
  assert.strictEqual(w.status, 'failed');
  assert.strictEqual(w.part, 'signature', w.reason);
  assert.throws(() => M.parseSignature(legacy), /legacy/);
});

test('records signed by an independent signer verify; no key is "no-key", not verified', async () => {
  const kp = keyPair();
  const r = report(kp);
  const v = await M.verifyRecord(subtle, r.data, r.sig, r.pub);
  assert.strictEqual(v.status, 'verified', v.reason);
  assert.strictEqual(v.keyIdHex, kp.idHex);
  assert.strictEqual(v.recordId, recordId(Buffer.from(r.data)));
  assert.strictEqual((await M.verifyRecord(subtle, r.data, r.sig, '')).status, 'no-key');
  assert.strictEqual((await M.verifyRecord(subtle, r.data, r.sig, undefined)).status, 'no-key');
});

test('a WebCrypto without Ed25519 is "unsupported", never verified', async () => {
  const kp = keyPair();
  const r = report(kp);
  const notSupported = () => Promise.reject(Object.assign(new Error('Algorithm: Unrecognized name'), { name: 'NotSupportedError' }));
  const noImport = { importKey: notSupported, verify: subtle.verify.bind(subtle), digest: subtle.digest.bind(subtle) };
  assert.strictEqual((await M.verifyRecord(noImport, r.data, r.sig, r.pub)).status, 'unsupported');
  const noVerify = { importKey: subtle.importKey.bind(subtle), verify: notSupported, digest: subtle.digest.bind(subtle) };
  assert.strictEqual((await M.verifyRecord(noVerify, r.data, r.sig, r.pub)).status, 'unsupported');
  assert.strictEqual((await M.verifyRecord(undefined, r.data, r.sig, r.pub)).status, 'unsupported');
  const lying = { importKey: subtle.importKey.bind(subtle), verify: () => Promise.resolve('yes'), digest: subtle.digest.bind(subtle) };
  assert.notStrictEqual((await M.verifyRecord(lying, r.data, r.sig, r.pub)).status, 'verified', 'only a strict true counts');
  const throwing = { importKey: subtle.importKey.bind(subtle), verify: () => Promise.reject(new Error('boom')), digest: subtle.digest.bind(subtle) };
  assert.strictEqual((await M.verifyRecord(throwing, r.data, r.sig, r.pub)).status, 'failed');
});
