// The chain page in a real headless Chromium (run by report_page_chain_test.sh with a chain a
// real ferryd signed): the untouched chain verifies with its chart; a removed middle snapshot
// and a replayed one are named; a restarted chain names the records missing before it; nothing
// on the console; screenshots to ARTIFACTS.
// usage: node browser_chain_test.js FERRYCTL SNAPSHOT_DIR KEY.pub ARTIFACTS
'use strict';
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { launch, checker } = require('./cdp.js');
const { keyPair, sign, recordId, sha256Hex } = require('./signer.js');

const [ferryctl, snaps, pub, artifacts] = process.argv.slice(2);
const chromium = execFileSync('sh', ['-c', 'command -v chromium || command -v chromium-browser']).toString().trim();
const keyId = /key ([0-9A-F]{16})/.exec(fs.readFileSync(pub, 'utf8'))[1];
const files = fs.readdirSync(snaps).filter((f) => /^snapshot-\d+\.json$/.test(f)).sort();
const n = files.length;
const work = fs.mkdtempSync(path.join(os.tmpdir(), 'ferry-chain-page-'));

// A copy of the chain with `change(dir)` applied, and its page.
function variant(name, change) {
  const d = path.join(work, name);
  fs.mkdirSync(d);
  for (const f of fs.readdirSync(snaps)) fs.copyFileSync(path.join(snaps, f), path.join(d, f));
  change(d);
  const page = path.join(artifacts, 'chain-' + name + '.html');
  const said = execFileSync(ferryctl, ['report', 'html', '--chain', d, '--pub', pub, '-o', page], { stdio: ['ignore', 'pipe', 'pipe'] }).toString();
  // ferryctl checks each record's signature, not the links: it must not call the chain verified.
  expect(name + ': ferryctl says it checked each record\'s signature, not the chain', /, each record's signature verified by key /.test(said) &&
    /the chain's links are checked by the page and by ferryctl verify/.test(said), said);
  return page;
}

let restartedKey = '';
const check = checker();
const expect = check.expect;

(async () => {
  const pages = {
    intact: variant('intact', () => {}),
    'middle-removed': variant('middle-removed', (d) => {
      fs.rmSync(path.join(d, 'snapshot-000003.json'));
      fs.rmSync(path.join(d, 'snapshot-000003.json.minisig'));
    }),
    replayed: variant('replayed', (d) => {
      fs.copyFileSync(path.join(d, 'snapshot-000002.json'), path.join(d, 'snapshot-000004.json'));
      fs.copyFileSync(path.join(d, 'snapshot-000002.json.minisig'), path.join(d, 'snapshot-000004.json.minisig'));
    }),
  };
  // A chain ferryd restarted after records 3 and 4 (signed here: ferryd restarts only over a broken tail).
  {
    const kp = keyPair();
    const d = path.join(work, 'restarted');
    fs.mkdirSync(d);
    fs.writeFileSync(path.join(d, 'key.pub'), kp.pub);
    let prev = '0'.repeat(64);
    for (const [seq, extra] of [[1, {}], [2, {}], [5, { chain: 'FRY-NEW', previous_chain_broken: 'snapshot-000004.json does not verify' }]]) {
      if (extra.previous_chain_broken) prev = '0'.repeat(64);
      const body = Buffer.from(JSON.stringify(Object.assign({ format: 'ferry-snapshot/3', seq, chain: 'FRY-OLD', key_id: kp.idHex, prev_sha256: prev }, extra)) + '\n');
      const file = path.join(d, 'snapshot-' + String(seq).padStart(6, '0') + '.json');
      fs.writeFileSync(file, body);
      fs.writeFileSync(file + '.minisig', sign(kp, body, 'ferry snapshot ' + recordId(body) + ' seq ' + seq));
      prev = sha256Hex(body);
    }
    pages.restarted = path.join(artifacts, 'chain-restarted.html');
    execFileSync(ferryctl, ['report', 'html', '--chain', d, '--pub', path.join(d, 'key.pub'), '-o', pages.restarted], { stdio: ['ignore', 'pipe', 'pipe'] });
    restartedKey = kp.idHex;
  }
  // One snapshot on its own is a record page like a report's.
  const single = path.join(artifacts, 'snapshot-000002.html');
  execFileSync(ferryctl, ['report', 'html', path.join(snaps, 'snapshot-000002.json'), '--pub', pub, '-o', single], { stdio: ['ignore', 'pipe', 'pipe'] });
  const browser = await launch(chromium);
  try {
    {
      const page = await browser.open('file://' + single);
      const v = await page.verdict();
      await page.screenshot(path.join(artifacts, 'snapshot-000002.png'), true);
      expect('one snapshot: verified', v.status === 'verified' && v.title === 'Verified by key ' + keyId, v.title);
      expect('one snapshot: its window, environment and policy shown', /sequence\s+2/.test(v.text) && /host id/.test(v.text) && /chunked/.test(v.text), v.text);
      expect('one snapshot: nothing on the console', v.console.length === 0, v.console);
      console.log('ok snapshot-000002: ' + v.title);
      await page.close();
    }
    for (const [name, file] of Object.entries(pages)) {
      const page = await browser.open('file://' + file);
      const v = await page.verdict();
      await page.screenshot(path.join(artifacts, 'chain-' + name + '.png'), true);
      expect(name + ': the checks finished', v.settled, v);
      expect(name + ': nothing on the console', v.console.length === 0, v.console);
      if (name === 'intact') {
        expect('intact: verified, every record and the chain', v.status === 'verified' &&
          v.title === 'Verified by key ' + keyId + ': all ' + n + ' records, hash chain intact', v.title);
        expect('intact: the chart of exposed time and bandwidth', v.svgs >= 2 && /exposed copy time/.test(v.text) && /bandwidth/.test(v.text), v.svgs);
      } else if (name === 'restarted') {
        expect('restarted: verified, and says ferryd restarted the chain', v.status === 'verified' &&
          v.title === 'Verified by key ' + restartedKey + ': all 3 records, hash chain intact; ferryd restarted the chain', v.title);
        expect('restarted: the records missing before the new chain named in the verdict', v.detail.includes('a new chain FRY-NEW starts at sequence 5') &&
          v.detail.includes('snapshot-000004.json does not verify; records 3..4 are not here'), v.detail);
      } else {
        expect(name + ': does not verify', v.status === 'failed' && v.title === 'Does not verify: the chain is broken', v.title);
        expect(name + ': never verified', !/Verified/.test(v.title), v.title);
      }
      if (name === 'middle-removed') {
        expect('middle removed: named', v.detail.includes('snapshot-000004.json: sequence 4 follows 2: record 3 is missing'), v.detail);
        expect('middle removed: named on the page', v.text.includes('record 3 is missing'), null);
      }
      if (name === 'replayed') {
        expect('replayed: named', v.detail.includes('snapshot-000004.json: sequence 2 again, as in snapshot-000002.json (replayed record)'), v.detail);
      }
      console.log('ok chain ' + name + ': ' + v.title + ' (' + v.detail.slice(0, 120) + ')');
      await page.close();
    }
  } finally {
    await browser.close();
    fs.rmSync(work, { recursive: true, force: true });
  }
  process.exit(check.failures() ? 1 : 0);
})().catch((e) => {
  console.log('FAIL: ' + (e && e.stack || e));
  process.exit(1);
});
