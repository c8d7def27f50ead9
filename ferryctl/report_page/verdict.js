// What a check's result says to a reader, in words and a colour class; and what a snapshot
// chain's records say as a set (replays, order, gaps, the hash chain), as `ferryctl verify` does.
(function (root) {
  'use strict';

  const PART_WORDS = {
    data: 'the data was changed',
    comment: 'the trusted comment was changed',
    key: 'another key',
    'key-or-signature': 'another key with the same id, or a changed signature',
    signature: 'the signature is damaged',
  };

  // keySource: 'embedded' (the key came in this file), 'given' (the reader pasted or dropped it).
  // Returns {cls: 'ok'|'bad'|'warn', status, title, detail}. Only status 'verified' is green.
  function verdictView(result, keySource) {
    const r = result || {};
    if (r.status === 'verified') {
      const detail =
        keySource === 'given'
          ? 'Checked against the key you gave (key id ' + r.keyIdHex + '). If that is the key the operator published, ' +
            'the operator signed this record and not one byte of it, or of its trusted comment, has changed since.'
          : 'Checked against the key embedded in this file (key id ' + r.keyIdHex + '). A key in the same file proves ' +
            'only that the record is intact, not who signed it: paste or drop the operator\'s published .pub below to ' +
            'check that the operator signed it.';
      return { cls: 'ok', status: 'verified', title: 'Verified by key ' + r.keyIdHex, detail };
    }
    if (r.status === 'failed') {
      const what = PART_WORDS[r.part] || 'the check failed';
      return { cls: 'bad', status: 'failed', title: 'Does not verify: ' + what, detail: r.reason || what };
    }
    if (r.status === 'unsupported') {
      return {
        cls: 'warn',
        status: 'unsupported',
        title: 'Cannot check here: this browser has no Ed25519 signatures',
        detail: 'Nothing on this page is verified. Open it in a current Chrome, Edge, Firefox or Safari, or check the ' +
          'record with minisign -V. (' + (r.reason || 'no Ed25519') + ')',
      };
    }
    if (r.status === 'no-key') {
      return {
        cls: 'warn',
        status: 'no-key',
        title: 'Not checked: no public key',
        detail: 'This file carries no public key. Paste or drop the operator\'s published .pub below' +
          (r.signedByHex ? ' (the signature names key ' + r.signedByHex + ')' : '') + '.',
      };
    }
    return { cls: 'warn', status: 'error', title: 'Not verified: the check did not complete', detail: r.reason || 'unknown error' };
  }

  const NO_PREV = '0'.repeat(64);
  const missing = (from, to) => (from === to ? 'record ' + from + ' is' : 'records ' + from + '..' + to + ' are');

  // entries: [{file, result, record (parsed JSON or null), sha256}] in the order of their files'
  // sequence numbers. Returns {ok, problems: [{file, text}], notes: [text]}.
  function checkChain(entries) {
    const problems = [];
    const notes = [];
    if (entries.length === 0) return { ok: false, problems: [{ file: '', text: 'no snapshot records' }], notes };
    for (const e of entries) {
      if (!e.result || e.result.status !== 'verified') {
        problems.push({ file: e.file, text: 'does not verify: ' + verdictView(e.result, 'embedded').detail });
        continue;
      }
      const r = e.record;
      if (!r || (r.format !== 'ferry-snapshot/1' && r.format !== 'ferry-snapshot/2' && r.format !== 'ferry-snapshot/3')) {
        problems.push({ file: e.file, text: 'not a ferry snapshot record' });
      } else if (r.seq !== e.result.claim.seq) {
        problems.push({ file: e.file, text: 'its sequence (' + r.seq + ') differs from the signed one (' + e.result.claim.seq + ')' });
      } else if (r.key_id !== e.result.keyIdHex) {
        problems.push({ file: e.file, text: 'the record names key ' + r.key_id + ', not the key that signed it' });
      }
    }
    if (problems.length) return { ok: false, problems, notes };
    const seen = new Map();
    for (const e of entries) {
      if (seen.has(e.record.seq)) {
        problems.push({ file: e.file, text: 'sequence ' + e.record.seq + ' again, as in ' + seen.get(e.record.seq) + ' (replayed record)' });
      } else {
        seen.set(e.record.seq, e.file);
      }
    }
    for (let i = 1; i < entries.length; i++) {
      const p = entries[i - 1].record, v = entries[i].record;
      if (v.seq < p.seq) {
        problems.push({ file: entries[i].file, text: 'sequence ' + v.seq + ' after ' + p.seq + ' (records out of order)' });
      }
    }
    if (problems.length) return { ok: false, problems, notes };
    const isHead = (r) => r.prev_sha256 === NO_PREV && (r.seq === 1 || !!r.previous_chain_broken);
    for (let i = 1; i < entries.length; i++) {
      const p = entries[i - 1], v = entries[i];
      if (isHead(v.record)) {
        const gap = v.record.seq - p.record.seq - 1;
        notes.push('a new chain ' + v.record.chain + ' starts at sequence ' + v.record.seq + ' (' + v.file +
          '): ferryd says the chain before it broke: ' + v.record.previous_chain_broken +
          (gap > 0 ? '; ' + missing(p.record.seq + 1, v.record.seq - 1) + ' not here' : ''));
        continue;
      }
      if (v.record.seq !== p.record.seq + 1) {
        problems.push({ file: v.file, text: 'sequence ' + v.record.seq + ' follows ' + p.record.seq + ': ' + missing(p.record.seq + 1, v.record.seq - 1) + ' missing' });
      } else if (v.record.prev_sha256 !== p.sha256) {
        problems.push({ file: v.file, text: 'its previous-record hash is not ' + p.file + '\'s (chain broken)' });
      }
    }
    const first = entries[0];
    if (first.record.seq === 1 && first.record.prev_sha256 !== NO_PREV) {
      problems.push({ file: first.file, text: 'the first record of a chain must not name a previous one' });
    } else if (!isHead(first.record)) {
      problems.push({ file: first.file, text: 'sequence ' + first.record.seq + ' is not the head of its chain: the records before it are missing' });
    } else if (first.record.seq > 1) {
      notes.unshift('the records start with a new chain ' + first.record.chain + ' at sequence ' + first.record.seq + ' (' + first.file +
        '): ferryd says the chain before it broke: ' + first.record.previous_chain_broken + '; ' + missing(1, first.record.seq - 1) + ' not here');
    }
    return { ok: problems.length === 0, problems, notes };
  }

  const api = { verdictView, checkChain };
  root.FerryVerdict = api;
  if (typeof module === 'object' && module.exports) module.exports = api;
})(globalThis);
