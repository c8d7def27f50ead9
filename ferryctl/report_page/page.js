// The page's start: reads the records embedded in it, checks each on open, and re-checks
// against a public key the reader pastes or drops. The verdict starts as "not verified" and
// becomes "verified" only when every check of every record succeeded.
(function (root) {
  'use strict';
  const M = root.FerryMinisign, V = root.FerryVerdict, R = root.FerryRender;
  const $ = (id) => document.getElementById(id);
  const subtle = root.crypto && root.crypto.subtle;

  function fromBase64(b64) {
    const out = M.decodeBase64(b64 || '');
    if (!out) throw new Error('the page\'s embedded data is damaged');
    return out;
  }
  const text = (bytes) => new TextDecoder('utf-8', { fatal: false }).decode(bytes);

  function showVerdict(view) {
    const v = $('verdict');
    v.className = 'verdict ' + view.cls;
    v.dataset.status = view.status;
    v.replaceChildren(R.el('strong', { id: 'verdict-title' }, view.title), R.el('p', { id: 'verdict-detail' }, view.detail));
  }

  function failClosed(err) {
    generation++;
    showVerdict({ cls: 'bad', status: 'error', title: 'Not verified: the check did not complete', detail: String(err && err.message || err) });
    document.body.dataset.state = 'done';
  }

  const data = JSON.parse($('ferry-data').textContent);
  const records = data.records.map((r) => {
    const bytes = fromBase64(r.data_b64);
    let parsed = null;
    try {
      parsed = JSON.parse(text(bytes));
    } catch (e) {
      parsed = null;
    }
    return { file: text(fromBase64(r.file_b64)), bytes, sig: text(fromBase64(r.sig_b64)), record: parsed };
  });
  // Each record's SHA-256, taken once for every check (its record id, the chain's links); none
  // without WebCrypto, where every check says so.
  const digests = subtle ? Promise.all(records.map((e) => M.sha256(subtle, e.bytes))) : Promise.resolve(records.map(() => null));

  function showKey(pubText, source) {
    let line;
    try {
      const k = M.parsePublicKey(pubText);
      line = 'Key ' + k.idHex + (source === 'embedded'
        ? ': embedded in this file by whoever made it, so it can prove the record is intact, not who signed it.'
        : ': the key you gave.');
    } catch (e) {
      line = pubText ? 'The key ' + (source === 'embedded' ? 'embedded in this file' : 'you gave') + ' is not usable: ' + e.message
        : 'No key yet: this file carries none.';
    }
    $('key-used').textContent = line;
  }

  function renderSingle(e, result) {
    const r = e.record || {};
    $('record-id').textContent = result.status === 'verified' ? result.recordId : (result.claim ? result.claim.id : 'not verified');
    $('issued-at').textContent = r.issued_at || '-';
    $('record-kind').textContent = r.format || 'unknown';
    $('record-file').textContent = e.file;
    $('content').replaceChildren(...(e.record ? R.record(e.record) : [R.el('p', {}, 'the record is not JSON')]));
  }

  function renderChain(entries, chain) {
    $('record-id').textContent = entries.length + ' records';
    $('issued-at').textContent = entries.length ? (entries[0].record || {}).issued_at + ' to ' + (entries[entries.length - 1].record || {}).issued_at : '-';
    $('record-kind').textContent = 'snapshot chain';
    $('record-file').textContent = entries.length ? entries[0].file + ' .. ' + entries[entries.length - 1].file : '-';
    const problems = R.el('ul', { id: 'chain-problems' }, chain.problems.map((p) => R.el('li', { class: 'fail' }, (p.file ? p.file + ': ' : '') + p.text)));
    const notes = R.el('ul', { id: 'chain-notes' }, chain.notes.map((n) => R.el('li', {}, n)));
    const rows = entries.map((e) => {
      const r = e.record || {};
      const ok = e.result.status === 'verified';
      return [String(r.seq), ok ? e.result.recordId : '-', r.issued_at || '-', r.policy ? r.policy.name + ' (' + r.policy.hash + ')' : '-',
        R.ms((r.reported_by_clients || r.metrics || {}).exposed_p99_seconds),
        R.el('span', { class: ok ? 'pass' : 'fail' }, ok ? 'verified' : V.verdictView(e.result, 'embedded').title)];
    });
    $('content').replaceChildren(
      R.section('The chain', chain.problems.length ? problems : R.el('p', { class: 'pass' }, 'every record verified, in sequence, each naming the one before it'), notes),
      R.section('Records', R.table(rows, ['seq', 'record id', 'issued', 'policy', 'exposed p99', 'verdict'])),
      R.chainCharts(entries.map((e) => (e.result.status === 'verified' ? e.record : null))));
    const last = entries.filter((e) => e.record && e.result.status === 'verified').pop();
    if (last) $('content').append(R.section('The latest record (sequence ' + last.record.seq + ')', R.record(last.record)));
  }

  // Each check has a number; only the newest one's results are shown (a key pasted while an
  // earlier check still runs must not be answered by that earlier check).
  let generation = 0;
  async function check(pubText, source) {
    const gen = ++generation;
    document.body.dataset.state = 'checking';
    showVerdict({ cls: 'warn', status: 'checking', title: 'Checking...', detail: 'checking the signatures' });
    showKey(pubText, source);
    const sums = await digests;
    const results = [];
    for (let i = 0; i < records.length; i++) results.push(await M.verifyRecord(subtle, records[i].bytes, records[i].sig, pubText, sums[i]));
    if (gen !== generation) return;
    if (data.kind === 'chain') {
      const entries = records.map((e, i) => Object.assign({}, e, { result: results[i], sha256: sums[i] ? M.hex(sums[i]) : null }));
      const chain = V.checkChain(entries);
      renderChain(entries, chain);
      const firstBad = results.find((r) => r.status !== 'verified');
      if (firstBad) {
        const view = V.verdictView(firstBad, source);
        view.detail = (entries.find((e) => e.result === firstBad) || {}).file + ': ' + view.detail;
        showVerdict(view);
      } else if (!chain.ok) {
        showVerdict({ cls: 'bad', status: 'failed', title: 'Does not verify: the chain is broken', detail: chain.problems.map((p) => (p.file ? p.file + ': ' : '') + p.text).join('; ') });
      } else {
        const v = V.verdictView(results[results.length - 1], source);
        v.title = v.title + ': all ' + results.length + ' records, hash chain intact' + (chain.notes.length ? '; ferryd restarted the chain' : '');
        if (chain.notes.length) v.detail = chain.notes.join('. ') + '. ' + v.detail;
        showVerdict(v);
      }
    } else {
      renderSingle(records[0], results[0]);
      showVerdict(V.verdictView(results[0], source));
    }
    if ($('verdict').dataset.status !== 'verified') {
      $('content').prepend(R.el('p', { class: 'fail', id: 'unverified-note' }, 'Not verified: what follows is what the file claims, unchecked.'));
    }
    document.body.dataset.state = 'done';
  }

  function recheck(pubText) {
    check(pubText, 'given').catch(failClosed);
  }

  $('pub-check').addEventListener('click', () => recheck($('pub-input').value));
  const drop = $('key-panel');
  drop.addEventListener('dragover', (ev) => {
    ev.preventDefault();
    drop.classList.add('dragging');
  });
  drop.addEventListener('dragleave', () => drop.classList.remove('dragging'));
  drop.addEventListener('drop', (ev) => {
    ev.preventDefault();
    drop.classList.remove('dragging');
    const f = ev.dataTransfer && ev.dataTransfer.files && ev.dataTransfer.files[0];
    if (f) {
      f.text().then((t) => {
        $('pub-input').value = t;
        recheck(t);
      }, failClosed);
    } else if (ev.dataTransfer) {
      const t = ev.dataTransfer.getData('text/plain');
      $('pub-input').value = t;
      recheck(t);
    }
  });
  $('pub-input').addEventListener('paste', () => setTimeout(() => recheck($('pub-input').value), 0));

  const embedded = data.pub_b64 ? text(fromBase64(data.pub_b64)) : '';
  check(embedded, 'embedded').catch(failClosed);
})(globalThis);
