// Test helper: edits what a report page embeds, as someone holding the file could.
'use strict';
const fs = require('node:fs');

const RE = /(<script type="application\/json" id="ferry-data">)(.*?)(<\/script>)/s;

function edit(htmlFile, outFile, change) {
  const html = fs.readFileSync(htmlFile, 'utf8');
  const m = RE.exec(html);
  if (!m) throw new Error(htmlFile + ': no embedded data');
  const data = JSON.parse(m[2]);
  const b = (s) => Buffer.from(s, 'base64');
  const rec = data.records[0];
  const view = { data: b(rec.data_b64), sig: b(rec.sig_b64).toString('utf8'), pub: b(data.pub_b64).toString('utf8') };
  change(view);
  rec.data_b64 = view.data.toString('base64');
  rec.sig_b64 = Buffer.from(view.sig).toString('base64');
  data.pub_b64 = Buffer.from(view.pub).toString('base64');
  fs.writeFileSync(outFile, html.replace(RE, (_, a, __, c) => a + JSON.stringify(data) + c));
}

module.exports = { edit };
