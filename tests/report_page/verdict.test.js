// What the page says for each result, and the snapshot chain's checks, with records signed by an
// independent signer and checked with node's WebCrypto Ed25519.
'use strict';
const test = require('node:test');
const assert = require('node:assert');
const M = require('../../ferryctl/report_page/minisign.js');
const { verdictView, checkChain } = require('../../ferryctl/report_page/verdict.js');
const { keyPair, sign, recordId, sha256Hex } = require('./signer.js');

const subtle = globalThis.crypto.subtle;
const NO_PREV = '0'.repeat(64);

test('only a verified result is green and says "Verified by key"; the key\'s source is named', () => {
  const ok = verdictView({ status: 'verified', keyIdHex: 'C5EECC22AF91BEFE' }, 'embedded');
  assert.strictEqual(ok.cls, 'ok');
  assert.strictEqual(ok.title, 'Verified by key C5EECC22AF91BEFE');
  assert.match(ok.detail, /embedded in this file/);
  assert.match(ok.detail, /proves only that the record is intact/);
  assert.match(verdictView({ status: 'verified', keyIdHex: 'AB' }, 'given').detail, /the key you gave/);
  for (const r of [{ status: 'failed', part: 'data' }, { status: 'unsupported' }, { status: 'no-key' }, { status: 'checking' },
    { status: 'VERIFIED' }, {}, null, undefined]) {
    const v = verdictView(r, 'embedded');
    assert.notStrictEqual(v.cls, 'ok', JSON.stringify(r));
    assert.doesNotMatch(v.title, /^Verified/, JSON.stringify(r));
  }
});

test('a failure says what failed: the data, the comment, another key, the signature', () => {
  const words = { data: 'the data was changed', comment: 'the trusted comment was changed', key: 'another key', signature: 'the signature is damaged',
    'key-or-signature': 'another key with the same id, or a changed signature' };
  for (const [part, w] of Object.entries(words)) {
    const v = verdictView({ status: 'failed', part, reason: 'why ' + part }, 'embedded');
    assert.strictEqual(v.cls, 'bad');
    assert.strictEqual(v.title, 'Does not verify: ' + w);
    assert.strictEqual(v.detail, 'why ' + part);
  }
  const u = verdictView({ status: 'unsupported', reason: 'no Ed25519' }, 'embedded');
  assert.strictEqual(u.cls, 'warn');
  assert.match(u.title, /no Ed25519/);
  assert.match(u.detail, /Nothing on this page is verified/);
});

// A chain of n snapshot records as ferryd writes them, signed, checked by the page's code.
async function chain(n, kp) {
  const out = [];
  let prev = NO_PREV;
  for (let seq = 1; seq <= n; seq++) {
    const body = Buffer.from(JSON.stringify({ format: 'ferry-snapshot/2', seq, chain: 'FRY-CHAIN', issued_at: '2026-12-04T10:00:0' + seq + 'Z',
      key_id: kp.idHex, reported_by_clients: { exposed_p50_seconds: 1e-5 * seq, exposed_p99_seconds: 2e-5 * seq }, prev_sha256: prev }) + '\n');
    out.push({ file: 'snapshot-' + String(seq).padStart(6, '0') + '.json', body, sig: sign(kp, body, 'ferry snapshot ' + recordId(body) + ' seq ' + seq) });
    prev = sha256Hex(body);
  }
  return out;
}
async function entries(files, pub) {
  return Promise.all(files.map(async (f) => ({ file: f.file, record: JSON.parse(f.body), sha256: sha256Hex(f.body),
    result: await M.verifyRecord(subtle, new Uint8Array(f.body), f.sig, pub) })));
}

test('an untouched chain holds', async () => {
  const kp = keyPair();
  const c = await checkChain(await entries(await chain(5, kp), kp.pub));
  assert.deepStrictEqual(c.problems, []);
  assert.strictEqual(c.ok, true);
});

test('a removed middle record is named', async () => {
  const kp = keyPair();
  const files = await chain(5, kp);
  const c = checkChain(await entries([files[0], files[1], files[3], files[4]], kp.pub));
  assert.strictEqual(c.ok, false);
  assert.deepStrictEqual(c.problems, [{ file: 'snapshot-000004.json', text: 'sequence 4 follows 2: record 3 is missing' }]);
  const two = checkChain(await entries([files[0], files[3]], kp.pub));
  assert.match(two.problems[0].text, /records 2\.\.3 are missing/);
});

test('a replayed record, records out of order, a broken hash chain and a missing head are named', async () => {
  const kp = keyPair();
  const f = await chain(4, kp);
  const replay = checkChain(await entries([f[0], f[1], f[1], f[2]], kp.pub));
  assert.match(replay.problems[0].text, /sequence 2 again, as in snapshot-000002\.json \(replayed record\)/);
  const order = checkChain(await entries([f[0], f[2], f[1], f[3]], kp.pub));
  assert.match(order.problems.map((p) => p.text).join(';'), /sequence 2 after 3 \(records out of order\)/);
  // A record 3 re-signed with a previous-record hash that is not record 2's.
  const forged = JSON.parse(f[2].body);
  forged.prev_sha256 = 'ab'.repeat(32);
  const body = Buffer.from(JSON.stringify(forged) + '\n');
  const swapped = { file: f[2].file, body, sig: sign(kp, body, 'ferry snapshot ' + recordId(body) + ' seq 3') };
  const broken = checkChain(await entries([f[0], f[1], swapped, f[3]], kp.pub));
  assert.deepStrictEqual(broken.problems.map((p) => p.file), ['snapshot-000003.json', 'snapshot-000004.json']);
  assert.match(broken.problems[0].text, /previous-record hash is not snapshot-000002\.json's \(chain broken\)/);
  const headless = checkChain(await entries(f.slice(1), kp.pub));
  assert.match(headless.problems[0].text, /sequence 2 is not the head of its chain/);
});

test('a record that does not verify makes the chain fail, whatever else holds', async () => {
  const kp = keyPair();
  const f = await chain(3, kp);
  // record 2 with record 3's signature
  const c = checkChain(await entries([f[0], { file: f[1].file, body: f[1].body, sig: f[2].sig }, f[2]], kp.pub));
  assert.strictEqual(c.ok, false);
  assert.match(c.problems[0].text, /does not verify/);
  const other = keyPair();
  const d = checkChain(await entries(f, other.pub));
  assert.strictEqual(d.ok, false);
  assert.strictEqual(d.problems.length, 3);
  assert.strictEqual(checkChain([]).ok, false);
});

test('a new chain after a broken one is a note, not a failure', async () => {
  const kp = keyPair();
  const f = await chain(2, kp);
  const head = Buffer.from(JSON.stringify({ format: 'ferry-snapshot/2', seq: 3, chain: 'FRY-NEW', previous_chain_broken: 'record 2 did not verify',
    key_id: kp.idHex, prev_sha256: NO_PREV }) + '\n');
  const c = checkChain(await entries([...f, { file: 'snapshot-000003.json', body: head, sig: sign(kp, head, 'ferry snapshot ' + recordId(head) + ' seq 3') }], kp.pub));
  assert.strictEqual(c.ok, true, JSON.stringify(c.problems));
  assert.match(c.notes[0], /a new chain FRY-NEW starts at sequence 3/);
});

test('records missing before a new chain, or before the first record when it starts one, are named', async () => {
  const kp = keyPair();
  const f = await chain(4, kp);
  const head = (seq, why) => {
    const body = Buffer.from(JSON.stringify({ format: 'ferry-snapshot/2', seq, chain: 'FRY-NEW', previous_chain_broken: why,
      key_id: kp.idHex, prev_sha256: NO_PREV }) + '\n');
    return { file: 'snapshot-' + String(seq).padStart(6, '0') + '.json', body, sig: sign(kp, body, 'ferry snapshot ' + recordId(body) + ' seq ' + seq) };
  };
  // Records 3 and 4 removed before the new chain's head at 5: each record and link that is there holds.
  const c = checkChain(await entries([f[0], f[1], head(5, 'record 4 did not verify')], kp.pub));
  assert.strictEqual(c.ok, true, JSON.stringify(c.problems));
  assert.match(c.notes[0], /a new chain FRY-NEW starts at sequence 5/);
  assert.match(c.notes[0], /records 3\.\.4 are not here/);
  const d = checkChain(await entries([f[0], f[1], f[2], f[3], head(5, 'x')], kp.pub));
  assert.doesNotMatch(d.notes[0], /not here/, 'nothing missing, nothing named');
  // Only the new chain's head and what follows it: the records before it are named as not here.
  const e = checkChain(await entries([head(5, 'record 4 did not verify')], kp.pub));
  assert.strictEqual(e.ok, true, JSON.stringify(e.problems));
  assert.strictEqual(e.notes.length, 1);
  assert.match(e.notes[0], /start with a new chain FRY-NEW at sequence 5.*records 1\.\.4 are not here/);
});
