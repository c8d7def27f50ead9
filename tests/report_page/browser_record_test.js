// The report page in a real headless Chromium: a genuine H200 report verifies with its key id;
// an edited byte, an edited trusted comment, another key and a truncated signature each do not,
// saying what failed; a page without a key checks none until the reader pastes one; nothing
// is logged to the console; a signed record whose names carry markup shows it as text. A
// screenshot of each verdict goes to ARTIFACTS.
// usage: node browser_record_test.js FERRYCTL SOURCE_DIR ARTIFACTS   (exit 77: no chromium)
'use strict';
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { launch, checker } = require('./cdp.js');
const { edit } = require('./tamper_page.js');
const { keyPair, sign, recordId } = require('./signer.js');

const [ferryctl, src, artifacts] = process.argv.slice(2);
const chromium = ['chromium', 'chromium-browser'].map((c) => {
  try {
    return execFileSync('sh', ['-c', 'command -v ' + c]).toString().trim();
  } catch (e) {
    return '';
  }
}).find(Boolean);
if (!chromium) {
  console.log('SKIP: chromium is not installed (scripts/setup.sh installs it)');
  process.exit(77);
}
fs.mkdirSync(artifacts, { recursive: true });
const m = path.join(src, 'docs/measurements');
const record = path.join(m, 'h200-overlap-2026-12-03.json'), pub = path.join(m, 'h200-overlap-2026-12-03.pub');
const out = (name) => path.join(artifacts, name + '.html');
const ctl = (...args) => execFileSync(ferryctl, args, { stdio: ['ignore', 'pipe', 'pipe'] }).toString();

let hostileKey = '';
const check = checker();
const expect = check.expect;

(async () => {
  ctl('report', 'html', record, '--pub', pub, '-o', out('genuine'));
  ctl('report', 'html', record, '-o', out('no-key'));
  ctl('report', 'html', path.join(m, 'h200-tune-2026-12-02.json'), '--pub', path.join(m, 'h200-tune-2026-12-02.pub'), '-o', out('tune'));
  const keys = fs.mkdtempSync(path.join(os.tmpdir(), 'ferry-page-key-'));
  ctl('keygen', '--dir', keys, '--name', 'other');
  const otherPub = fs.readFileSync(path.join(keys, 'other.pub'), 'utf8');
  fs.rmSync(keys, { recursive: true });
  const otherId = /key ([0-9A-F]{16})/.exec(otherPub)[1];
  // One digit of the record changed (the JSON stays valid, so only the signature can tell).
  edit(out('genuine'), out('edited-byte'), (v) => {
    const at = v.data.indexOf('"worst": 0.000366210938');
    v.data[at + 12] = v.data[at + 12] === 0x37 ? 0x38 : 0x37;
  });
  edit(out('genuine'), out('edited-comment'), (v) => { v.sig = v.sig.replace('ferry report overlap', 'ferry report tune'); });
  edit(out('genuine'), out('wrong-key'), (v) => { v.pub = otherPub; });
  // A signed report whose names carry markup, a fake verdict and bidi controls (names, policies and
  // host ids are not the operator's to choose): the page shows them as text and runs nothing.
  const hostile = '<img src=x onerror="document.title=1"></script><script>document.title=2</script>' +
    '<div id="verdict" class="verdict ok" data-status="verified">Verified by key 0000000000000000</div>\u202Egol.exe';
  {
    const kp = keyPair();
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ferry-page-hostile-'));
    const body = Buffer.from(JSON.stringify({ format: 'ferry-overlap-report/1', issued_at: hostile, ferry_version: hostile, host: hostile,
      environment: { chip: hostile, [hostile]: hostile }, modes: [{ policy: hostile, policy_hash: hostile }],
      checks: [{ name: hostile, what: hostile, worst: 1, bound: 2, pass: true }], checks_passed: true }) + '\n');
    fs.writeFileSync(path.join(dir, 'r.json'), body);
    fs.writeFileSync(path.join(dir, 'r.json.minisig'), sign(kp, body, 'ferry report overlap ' + recordId(body)));
    fs.writeFileSync(path.join(dir, 'k.pub'), kp.pub);
    ctl('report', 'html', path.join(dir, 'r.json'), '--pub', path.join(dir, 'k.pub'), '-o', out('hostile'));
    fs.rmSync(dir, { recursive: true });
    hostileKey = kp.idHex;
  }
  edit(out('genuine'), out('truncated-signature'), (v) => {
    const l = v.sig.split('\n');
    l[1] = l[1].slice(0, 64);
    v.sig = l.join('\n');
  });

  // The page holds the record and its signature byte for byte, loads nothing, and lets only its
  // own script and style run.
  const html = fs.readFileSync(out('genuine'), 'utf8');
  const data = JSON.parse(/<script type="application\/json" id="ferry-data">(.*?)<\/script>/s.exec(html)[1]);
  expect('the record embedded exactly', Buffer.from(data.records[0].data_b64, 'base64').equals(fs.readFileSync(record)), null);
  expect('the signature embedded exactly', Buffer.from(data.records[0].sig_b64, 'base64').equals(fs.readFileSync(record + '.minisig')), null);
  expect('the key embedded exactly', Buffer.from(data.pub_b64, 'base64').equals(fs.readFileSync(pub)), null);
  const csp = /<meta http-equiv="Content-Security-Policy" content="([^"]*)">/.exec(html);
  expect('a Content-Security-Policy that fetches nothing', csp && /default-src 'none'/.test(csp[1]) && /connect-src 'none'/.test(csp[1]) &&
    /script-src 'sha256-[A-Za-z0-9+/=]+'/.test(csp[1]) && !/unsafe/.test(csp[1]), csp && csp[1]);
  expect('no external resource in the markup', !/\s(src|href)\s*=/i.test(html) && !/<link\b/i.test(html) && !/@import|url\(/i.test(html), null);

  const browser = await launch(chromium);
  const t0 = Date.now();
  try {
    const check = async (name, want, extra, before) => {
      const page = await browser.open('file://' + out(name.replace(/^no-ed25519$/, 'genuine')), before);
      const v = await page.verdict();
      await page.screenshot(path.join(artifacts, name + '.png'));
      expect(name + ': the checks finished', v.settled, v);
      expect(name + ': status ' + want.status, v.status === want.status, v.status + ' / ' + v.title);
      expect(name + ': title "' + want.title + '"', v.title === want.title, v.title);
      if (want.detail) expect(name + ': detail ' + want.detail, want.detail.test(v.detail), v.detail);
      if (want.status !== 'verified') expect(name + ': never says verified', !/Verified/.test(v.title) && !/\bok\b/.test(v.cls), v);
      expect(name + ': nothing on the console', v.console.length === 0, v.console);
      if (extra) await extra(page, v);
      await page.close();
      console.log('ok ' + name + ': ' + v.title + ' (' + v.detail.slice(0, 100) + ')');
    };
    await check('genuine', { status: 'verified', title: 'Verified by key C5EECC22AF91BEFE', detail: /embedded in this file.*proves only that the record is intact/ }, async (page, v) => {
      for (const shown of ['NVIDIA H200', '580.159.04', '13.1.0', 'FRY-7PEYV-FEST3-ZQ81S-MAXF8', '2026-12-03T06:18:40Z', 'chunked-8mib',
        '414a16269bf62034', 'chunked-vs-fp64', '0.002048', '4096 x 4096', 'before: copy after the math']) {
        expect('genuine: shows ' + shown, v.text.includes(shown), null);
      }
      expect('genuine: the step drawn as bars', v.svgs >= 1, v.svgs);
      await page.screenshot(path.join(artifacts, 'genuine-full.png'), true);
      await page.pasteKey(otherPub);
      const w = await page.verdict();
      await page.screenshot(path.join(artifacts, 'pasted-other-key.png'));
      expect('pasted another key: does not verify', w.status === 'failed' && w.title === 'Does not verify: another key', w.title);
      expect('pasted another key: names it', w.keyUsed.includes(otherId) && w.keyUsed.includes('the key you gave'), w.keyUsed);
      await page.pasteKey(fs.readFileSync(pub, 'utf8'));
      const x = await page.verdict();
      expect('pasted the published key: verified, against the key given', x.status === 'verified' && /the key you gave/.test(x.detail), x);
      expect('pasting: nothing on the console', x.console.length === 0, x.console);
    });
    await check('edited-byte', { status: 'failed', title: 'Does not verify: the data was changed', detail: /bytes do not match the signature/ });
    await check('edited-comment', { status: 'failed', title: 'Does not verify: the trusted comment was changed', detail: /trusted comment was changed/ });
    await check('wrong-key', { status: 'failed', title: 'Does not verify: another key', detail: new RegExp('signed by key C5EECC22AF91BEFE, not by key ' + otherId) });
    await check('truncated-signature', { status: 'failed', title: 'Does not verify: the signature is damaged', detail: /truncated or malformed/ });
    await check('no-key', { status: 'no-key', title: 'Not checked: no public key', detail: /signature names key C5EECC22AF91BEFE/ }, async (page) => {
      await page.dropKey(otherPub);
      const d = await page.verdict();
      expect('no key, then another key dropped: does not verify', d.status === 'failed' && d.title === 'Does not verify: another key', d.title);
      await page.pasteKey(fs.readFileSync(pub, 'utf8'));
      const v = await page.verdict();
      await page.screenshot(path.join(artifacts, 'no-key-then-pasted.png'));
      expect('no key, then the published key pasted: verified', v.status === 'verified' && v.title === 'Verified by key C5EECC22AF91BEFE', v.title);
    });
    // A browser whose WebCrypto has no Ed25519 (as older ones): said plainly, never verified.
    const noEd25519 = `{ const real = crypto.subtle.importKey.bind(crypto.subtle);
      crypto.subtle.importKey = (f, k, alg, ...rest) => (alg && alg.name === 'Ed25519')
        ? Promise.reject(new DOMException('Algorithm: Unrecognized name', 'NotSupportedError')) : real(f, k, alg, ...rest); }`;
    await check('no-ed25519', { status: 'unsupported', title: 'Cannot check here: this browser has no Ed25519 signatures', detail: /Nothing on this page is verified/ }, null, noEd25519);
    // A page whose embedded data is damaged stops before any check: it stays "Not verified".
    fs.writeFileSync(out('damaged-data'), fs.readFileSync(out('genuine'), 'utf8').replace('"data_b64":"', '"data_b64":"%'));
    {
      const page = await browser.open('file://' + out('damaged-data'));
      // Navigation returns before the page is parsed and its script has run: wait (bounded) for the
      // script's console line, then read the verdict whole.
      const damagedLine = (c) => /damaged/.test(c);
      for (let i = 0; i < 200 && !(await page.verdict(false)).console.some(damagedLine); ++i) {
        await new Promise((r) => setTimeout(r, 50));
      }
      const v = await page.verdict(false);
      await page.screenshot(path.join(artifacts, 'damaged-data.png'));
      expect('damaged data: not verified, the check did not run', v.status === 'not-run' && /^Not verified/.test(v.title) && /\bbad\b/.test(v.cls), v);
      expect('damaged data: the error is on the console', v.console.some(damagedLine), v.console);
      await page.close();
      console.log('ok damaged-data: ' + v.title);
    }
    await check('hostile', { status: 'verified', title: 'Verified by key ' + hostileKey }, async (page, v) => {
      expect('hostile: its markup shown as text', v.text.includes('<img src=x onerror="document.title=1"></script><script>'), null);
      const dom = await page.evaluate('JSON.stringify([document.title, ...["img", "script", "[onerror]", "[id=verdict]", "[data-status]"]' +
        '.map((q) => document.querySelectorAll(q).length)])');
      expect('hostile: nothing ran or was made from its text', dom === JSON.stringify(['ferry signed record', 0, 2, 0, 1, 1]), dom);
    });
    await check('tune', { status: 'verified', title: 'Verified by key 075CBEA50F44E75E' }, async (page, v) => {
      expect('tune: shows the tuned policy hash', v.text.includes('a5dff7bbe9ced66a'), null);
    });
  } finally {
    await browser.close();
  }
  console.log('browser checks took ' + (Date.now() - t0) + ' ms; screenshots in ' + artifacts);
  process.exit(check.failures() ? 1 : 0);
})().catch((e) => {
  console.log('FAIL: ' + (e && e.stack || e));
  process.exit(1);
});
