// A headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe:
// JSON messages ended by NUL on fds 3 and 4), with nothing but node: opens a page, waits for its
// checks to finish, reads the verdict, collects every console message, error and CSP report,
// pastes a key, takes a screenshot.
'use strict';
const { spawn } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

async function launch(chromium) {
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'ferry-chromium-'));
  // --no-sandbox: Chromium's sandbox cannot start as root in a container.
  const proc = spawn(chromium, ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--no-default-browser-check',
    '--disable-extensions', '--disable-background-networking', '--remote-debugging-pipe', '--user-data-dir=' + profile, 'about:blank'],
  { stdio: ['ignore', 'ignore', 'pipe', 'pipe', 'pipe'] });
  let stderr = '';
  proc.stderr.on('data', (d) => { stderr += d; });
  const toChrome = proc.stdio[3], fromChrome = proc.stdio[4];
  let nextId = 1, buffer = '';
  const pending = new Map(), listeners = [];
  fromChrome.on('data', (chunk) => {
    buffer += chunk.toString('utf8');
    let nul;
    while ((nul = buffer.indexOf('\0')) >= 0) {
      const msg = JSON.parse(buffer.slice(0, nul));
      buffer = buffer.slice(nul + 1);
      if (msg.id && pending.has(msg.id)) {
        const { resolve, reject } = pending.get(msg.id);
        pending.delete(msg.id);
        if (msg.error) reject(new Error(msg.error.message));
        else resolve(msg.result);
      } else if (msg.method) {
        for (const l of listeners) l(msg);
      }
    }
  });
  const exited = new Promise((resolve) => proc.on('exit', resolve));
  const send = (method, params, sessionId) => new Promise((resolve, reject) => {
    const id = nextId++;
    pending.set(id, { resolve, reject });
    toChrome.write(JSON.stringify({ id, method, params: params || {}, sessionId }) + '\0');
  });

  // before: a script run in the page before its own (to take a browser feature away).
  async function open(url, before) {
    const { targetId } = await send('Target.createTarget', { url: 'about:blank' });
    const { sessionId } = await send('Target.attachToTarget', { targetId, flatten: true });
    const s = (method, params) => send(method, params, sessionId);
    const console = [];
    listeners.push((m) => {
      if (m.sessionId !== sessionId) return;
      if (m.method === 'Runtime.consoleAPICalled') console.push(m.params.type + ': ' + m.params.args.map((a) => a.value ?? a.description).join(' '));
      if (m.method === 'Runtime.exceptionThrown') console.push('exception: ' + (m.params.exceptionDetails.exception || {}).description);
      if (m.method === 'Log.entryAdded') console.push(m.params.entry.level + ': ' + m.params.entry.text);
    });
    await s('Runtime.enable');
    await s('Log.enable');
    await s('Page.enable');
    await s('Emulation.setDeviceMetricsOverride', { width: 1000, height: 1100, deviceScaleFactor: 1, mobile: false });
    if (before) await s('Page.addScriptToEvaluateOnNewDocument', { source: before });
    await s('Page.navigate', { url });
    const evaluate = async (expr) => (await s('Runtime.evaluate', { expression: expr, returnByValue: true, awaitPromise: true })).result.value;
    async function settled() {
      for (let i = 0; i < 100; i++) {
        if ((await evaluate('document.body && document.body.dataset.state')) === 'done') return true;
        await new Promise((r) => setTimeout(r, 50));
      }
      return false;
    }
    async function verdict(untilDone = true) {
      return {
        settled: untilDone ? await settled() : false,
        status: await evaluate('document.getElementById("verdict").dataset.status'),
        cls: await evaluate('document.getElementById("verdict").className'),
        title: await evaluate('document.getElementById("verdict-title").textContent'),
        detail: await evaluate('document.getElementById("verdict-detail").textContent'),
        keyUsed: await evaluate('document.getElementById("key-used").textContent'),
        text: await evaluate('document.body.innerText'),
        svgs: await evaluate('document.querySelectorAll("svg").length'),
        console: console.slice(),
      };
    }
    async function pasteKey(text) {
      await evaluate('(() => { const t = document.getElementById("pub-input"); t.value = ' + JSON.stringify(text) +
        '; document.getElementById("pub-check").click(); })()');
    }
    // Drags text onto the key panel and drops it there, as a reader drops a .pub's text.
    async function dropKey(text) {
      const box = await evaluate('(() => { const r = document.getElementById("key-panel").getBoundingClientRect(); ' +
        'return [r.x + r.width / 2, r.y + r.height / 2]; })()');
      const data = { items: [{ mimeType: 'text/plain', data: text }], dragOperationsMask: 1 };
      for (const type of ['dragEnter', 'dragOver', 'drop']) await s('Input.dispatchDragEvent', { type, x: box[0], y: box[1], data });
    }
    // The viewport (the verdict is at the top), or with `full` the whole page.
    async function screenshot(file, full) {
      let params = { format: 'png' };
      if (full) {
        const { cssContentSize: c } = await s('Page.getLayoutMetrics');
        params = { format: 'png', captureBeyondViewport: true, clip: { x: 0, y: 0, width: c.width, height: c.height, scale: 1 } };
      }
      const { data } = await s('Page.captureScreenshot', params);
      fs.writeFileSync(file, Buffer.from(data, 'base64'));
    }
    const close = () => send('Target.closeTarget', { targetId });
    return { verdict, pasteKey, dropKey, screenshot, evaluate, close };
  }

  async function close() {
    try {
      await send('Browser.close');
    } catch (e) {
      proc.kill('SIGKILL');
    }
    await exited;
    fs.rmSync(profile, { recursive: true, force: true });
  }
  return { open, close, stderr: () => stderr };
}

// The browser tests' checks: expect(what, cond, got) prints a FAIL line and counts it;
// failures() says how many, for the exit status.
function checker() {
  let failures = 0;
  return {
    expect(what, cond, got) {
      if (cond) return;
      failures++;
      console.log('FAIL: ' + what + (got === undefined ? '' : ': got ' + JSON.stringify(got)));
    },
    failures: () => failures,
  };
}

module.exports = { launch, checker };
