// Draws what a record says: every value placed with textContent or an SVG attribute, never as
// markup, so a record cannot inject anything into the page.
(function (root) {
  'use strict';
  const SVG = 'http://www.w3.org/2000/svg';

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    for (const c of children.flat(Infinity)) {
      if (c === null || c === undefined) continue;
      e.append(c instanceof Node ? c : String(c));
    }
    return e;
  }
  function svg(tag, attrs, text) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    if (text !== undefined) e.textContent = text;
    return e;
  }

  const ms = (s) => (typeof s === 'number' ? (s * 1e3).toFixed(s < 1e-4 ? 4 : 3) + ' ms' : '-');
  const num = (x) => (typeof x === 'number' ? (Math.abs(x) >= 1e4 || (x !== 0 && Math.abs(x) < 1e-3) ? x.toExponential(3) : String(+x.toPrecision(6))) : String(x));
  const mib = (b) => (typeof b === 'number' ? (b / 1048576).toFixed(b % 1048576 ? 2 : 0) + ' MiB' : '-');
  const gbps = (x) => (typeof x === 'number' ? (x / 1e9).toFixed(2) + ' GB/s' : '-');

  function table(rows, head) {
    const t = el('table', {});
    if (head) t.append(el('tr', {}, head.map((h) => el('th', {}, h))));
    for (const r of rows) t.append(el('tr', {}, r.map((c) => el('td', {}, c))));
    return t;
  }
  function section(title, ...body) {
    return el('section', {}, el('h2', {}, title), body);
  }

  // The environment block, whichever record it came in (environment, or a snapshot's gpu).
  const ENV_LABELS = [
    ['chip', 'GPU'], ['gpu_uuid', 'GPU UUID'], ['driver', 'NVIDIA driver'], ['driver_cuda', 'CUDA (driver)'],
    ['cuda_runtime', 'CUDA runtime'], ['cublas', 'cuBLAS'], ['copy_engines', 'copy engines'], ['ferry', 'ferry'],
    ['daemon_backend', 'ferryd backend'], ['host_id', 'host id'], ['host_id_source', 'host id from'],
  ];
  function environmentSection(env, extra) {
    const rows = [];
    const seen = new Set();
    for (const [k, label] of ENV_LABELS) {
      if (env[k] === undefined) continue;
      seen.add(k);
      const why = env[k + '_reason'];
      rows.push([label, String(env[k]) + (why ? ' (' + why + ')' : '')]);
    }
    for (const [k, v] of Object.entries(env)) {
      if (!seen.has(k) && !k.endsWith('_reason')) rows.push([k, String(v)]);
    }
    for (const r of extra || []) rows.push(r);
    return section('Where it ran', table(rows));
  }

  // Bars to one scale: groups [{label, bars: [{name, seconds, cls}]}].
  function stepBars(groups) {
    const max = Math.max(1e-12, ...groups.flatMap((g) => g.bars.map((b) => b.seconds || 0)));
    const rowH = 18, labelW = 270, barW = 440, valueW = 110;
    const n = groups.reduce((a, g) => a + g.bars.length + 1, 0);
    const s = svg('svg', { class: 'bars', viewBox: '0 0 ' + (labelW + barW + valueW) + ' ' + n * rowH, role: 'img' });
    let y = 0;
    for (const g of groups) {
      s.append(svg('text', { x: 0, y: y + 13, class: 'group' }, g.label));
      y += rowH;
      for (const b of g.bars) {
        s.append(svg('text', { x: 12, y: y + 13 }, b.name));
        const w = Math.max(b.seconds > 0 ? 1 : 0, (barW * (b.seconds || 0)) / max);
        s.append(svg('rect', { x: labelW, y: y + 3, width: w.toFixed(1), height: rowH - 6, class: b.cls }));
        s.append(svg('text', { x: labelW + w + 6, y: y + 13 }, ms(b.seconds)));
        y += rowH;
      }
    }
    return s;
  }

  function policiesOf(modes) {
    const seen = new Map();
    for (const m of modes || []) if (m.policy) seen.set(m.policy, m.policy_hash || '');
    return [...seen.entries()];
  }

  function overlapReport(r) {
    const out = [];
    out.push(environmentSection(r.environment || {}, [['ferry', r.ferry_version], ['host', r.host || '-'], ['ferryd backend', r.daemon_backend || '-']]));
    out.push(section('Policy', table(policiesOf(r.modes).map(([p, h]) => [p, 'hash ' + h]), ['policy', 'its hash'])));
    const w = r.workload || {};
    out.push(section('Workload', table([
      ['matrix', w.n + ' x ' + w.n + ' FP32 (matmul), its output copied to the host'],
      ['bytes per copy', mib(w.bytes)],
      ['steps x rounds', w.steps + ' x ' + w.rounds + ' (+' + w.warmup + ' warm-up)'],
      ['compute streams', w.compute_streams === undefined ? '-' : String(w.compute_streams)],
      ['blocks', Array.isArray(w.blocks) ? String(w.blocks.length) : '-'],
    ])));
    const compute = (r.compute_seconds || {}).median;
    const modes = r.modes || [];
    const serial = modes.find((m) => m.strategy === 'serial' && m.path === 'in-process');
    const groups = [];
    if (serial) {
      groups.push({ label: 'before: copy after the math (in-process, serial)', bars: [
        { name: 'compute', seconds: compute, cls: 'compute' },
        { name: 'copy', seconds: r.copy_seconds, cls: 'copy' },
        { name: 'exposed', seconds: serial.exposed_seconds, cls: 'exposed' },
        { name: 'step', seconds: serial.step_seconds.median, cls: 'step' }] });
    }
    for (const m of modes.filter((m) => m.path === 'ferryd' && m.strategy === 'pipelined')) {
      const alone = modes.find((c) => c.path === 'ferryd' && c.strategy === 'copy' && c.policy === m.policy);
      groups.push({ label: 'after: through ferryd, policy ' + m.policy + ' (pipelined)', bars: [
        { name: 'compute', seconds: compute, cls: 'compute' },
        { name: 'copy', seconds: alone ? alone.step_seconds.median : undefined, cls: 'copy' },
        { name: 'exposed', seconds: m.exposed_seconds, cls: 'exposed' },
        { name: 'step', seconds: m.step_seconds.median, cls: 'step' }] });
    }
    out.push(section('The step, to scale (medians)', stepBars(groups)));
    out.push(checksSection(r.checks, r.checks_passed));
    return out;
  }

  function checksSection(checks, passed) {
    const rows = (checks || []).map((c) => [c.name, c.what || '', num(c.worst), num(c.bound),
      el('span', { class: c.pass ? 'pass' : 'fail' }, c.pass ? 'pass' : 'FAIL')]);
    return section('Checks (' + (passed ? 'all passed' : 'NOT all passed') + ')', table(rows, ['check', 'what', 'worst', 'bound', '']));
  }

  function tuneReport(r) {
    const out = [environmentSection(r.environment || {})];
    out.push(section('Policy', table([['tuned policy hash', r.policy_hash], ['its settings', el('pre', {}, r.policy_canonical || '')]])));
    const groups = [];
    for (const [label, e] of [['before: the policy it started from', r.start], ['after: the tuned policy', r.best]]) {
      if (!e) continue;
      groups.push({ label: label + ' (' + e.label + ')', bars: [
        { name: 'compute', seconds: e.compute_seconds, cls: 'compute' },
        { name: 'exposed, pipelined', seconds: e.pipelined_exposed_seconds, cls: 'exposed' },
        { name: 'exposed, in-step', seconds: e.in_step_exposed_seconds, cls: 'exposed' }] });
    }
    out.push(section('The step, to scale', stepBars(groups)));
    out.push(section('What changed', table([
      ['environment', (r.environment_changes || []).join('; ') || 'nothing'],
      ['settings', (r.setting_changes || []).join('; ') || 'nothing']])));
    out.push(section('Candidates', table((r.candidates || []).map((c) => [c.label, c.verdict, ms(c.pipelined_exposed_seconds),
      ms(c.in_step_exposed_seconds), c.checks_passed ? 'pass' : 'FAIL']), ['candidate', 'verdict', 'exposed (pipelined)', 'exposed (in-step)', 'checks'])));
    return out;
  }

  function snapshotRecord(r) {
    const env = r.environment || Object.assign({ chip: (r.gpu || {}).name, gpu_uuid: (r.gpu || {}).uuid }, r.gpu || {});
    delete env.name;
    delete env.uuid;
    const out = [environmentSection(env, [['ferry', r.ferry_version], r.environment ? null : ['host id', r.host_id]].filter(Boolean))];
    out.push(section('Policy', table([[r.policy ? r.policy.name : '-', 'hash ' + (r.policy ? r.policy.hash : '-')]], ['policy', 'its hash'])));
    const m = r.measured_by_ferryd || r.metrics || {};
    const c = r.reported_by_clients || {};
    out.push(section('Window', table([
      ['sequence', String(r.seq)], ['chain', r.chain || '-'],
      ['from / to', (r.window || {}).start + ' to ' + (r.window || {}).end],
      ['copies (failed)', m.copies + ' (' + m.copies_failed + ')'],
      ['bandwidth h2d / d2h', gbps(m.bandwidth_h2d_bytes_per_second) + ' / ' + gbps(m.bandwidth_d2h_bytes_per_second)],
      ['exposed reports accepted', String(c.exposed_reports_accepted)]])));
    out.push(section('Times, to scale', stepBars([{ label: 'this window', bars: [
      { name: 'copy p50', seconds: m.copy_p50_seconds, cls: 'copy' },
      { name: 'copy p99', seconds: m.copy_p99_seconds, cls: 'copy' },
      { name: 'exposed p50 (clients)', seconds: c.exposed_p50_seconds, cls: 'exposed' },
      { name: 'exposed p99 (clients)', seconds: c.exposed_p99_seconds, cls: 'exposed' }] }])));
    return out;
  }

  function record(r) {
    const f = String(r.format || '');
    if (f.startsWith('ferry-overlap-report/')) return overlapReport(r);
    if (f.startsWith('ferry-tune-report/')) return tuneReport(r);
    if (f.startsWith('ferry-snapshot/')) return snapshotRecord(r);
    return [section('Record', el('p', {}, 'a record of an unknown format: ' + f))];
  }

  // A line chart of series [{name, cls, points: [[x, y]]}] against sequence numbers.
  function lineChart(title, unit, series) {
    const W = 720, H = 200, L = 70, R = 150, T = 24, B = 30;
    const s = svg('svg', { class: 'chart', viewBox: '0 0 ' + W + ' ' + H, role: 'img' });
    s.append(svg('text', { x: 0, y: 14, class: 'group' }, title));
    const pts = series.flatMap((x) => x.points);
    if (pts.length === 0) return s;
    const xs = pts.map((p) => p[0]), ys = pts.map((p) => p[1]);
    const x0 = Math.min(...xs), x1 = Math.max(x0 + 1, ...xs), y1 = Math.max(1e-12, ...ys);
    const X = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
    const Y = (y) => H - B - (y / y1) * (H - T - B);
    s.append(svg('line', { x1: L, y1: H - B, x2: W - R, y2: H - B, class: 'axis' }));
    s.append(svg('line', { x1: L, y1: T, x2: L, y2: H - B, class: 'axis' }));
    s.append(svg('text', { x: L - 6, y: T + 4, 'text-anchor': 'end' }, unit(y1)));
    s.append(svg('text', { x: L - 6, y: H - B + 4, 'text-anchor': 'end' }, unit(0)));
    s.append(svg('text', { x: L, y: H - 8 }, 'seq ' + x0));
    s.append(svg('text', { x: W - R, y: H - 8, 'text-anchor': 'end' }, 'seq ' + x1));
    series.forEach((sr, i) => {
      s.append(svg('polyline', { points: sr.points.map((p) => X(p[0]).toFixed(1) + ',' + Y(p[1]).toFixed(1)).join(' '), class: 'line ' + sr.cls }));
      for (const p of sr.points) s.append(svg('circle', { cx: X(p[0]).toFixed(1), cy: Y(p[1]).toFixed(1), r: 2.5, class: 'dot ' + sr.cls }));
      s.append(svg('text', { x: W - R + 10, y: T + 14 + 16 * i, class: sr.cls + '-text' }, sr.name));
    });
    return s;
  }

  function chainCharts(records) {
    const pick = (f) => records.filter((r) => r && typeof r.seq === 'number').map((r) => [r.seq, f(r)]).filter((p) => typeof p[1] === 'number');
    const clients = (r) => r.reported_by_clients || r.metrics || {};
    const ferryd = (r) => r.measured_by_ferryd || r.metrics || {};
    return section('Over the chain',
      lineChart('exposed copy time (clients\' reports)', ms, [
        { name: 'p50', cls: 'exposed', points: pick((r) => clients(r).exposed_p50_seconds) },
        { name: 'p99', cls: 'p99', points: pick((r) => clients(r).exposed_p99_seconds) }]),
      lineChart('bandwidth (measured by ferryd)', gbps, [
        { name: 'host to GPU', cls: 'copy', points: pick((r) => ferryd(r).bandwidth_h2d_bytes_per_second) },
        { name: 'GPU to host', cls: 'compute', points: pick((r) => ferryd(r).bandwidth_d2h_bytes_per_second) }]));
  }

  const api = { el, table, section, record, chainCharts, ms };
  root.FerryRender = api;
})(globalThis);
