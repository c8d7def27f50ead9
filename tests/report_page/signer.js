// Test helper: minisign key pairs and signatures made with node:crypto's Ed25519 (not the page's
// code), so that the page's checks are tested against an independent signer.
'use strict';
const crypto = require('node:crypto');
const { blake2b } = require('../../ferryctl/report_page/blake2b.js');

function keyPair(idBytes) {
  const { publicKey, privateKey } = crypto.generateKeyPairSync('ed25519');
  const raw = publicKey.export({ format: 'der', type: 'spki' }).subarray(12);
  const id = Buffer.from(idBytes || crypto.randomBytes(8));
  const idHex = Buffer.from(id).reverse().toString('hex').toUpperCase();
  const pub = 'untrusted comment: minisign public key ' + idHex + '\n' +
    Buffer.concat([Buffer.from('Ed'), id, raw]).toString('base64') + '\n';
  return { id, idHex, pub, privateKey };
}

function sign(kp, data, trustedComment) {
  const sig = crypto.sign(null, blake2b(new Uint8Array(data)), kp.privateKey);
  const global = crypto.sign(null, Buffer.concat([sig, Buffer.from(trustedComment)]), kp.privateKey);
  return 'untrusted comment: signature from test key\n' + Buffer.concat([Buffer.from('ED'), kp.id, sig]).toString('base64') +
    '\ntrusted comment: ' + trustedComment + '\n' + global.toString('base64') + '\n';
}

// ferry's record id, computed here independently of the page's.
function recordId(data) {
  const h = crypto.createHash('sha256').update(data).digest();
  let bits = '';
  for (const b of h.subarray(0, 13)) bits += b.toString(2).padStart(8, '0');
  let out = 'FRY';
  for (let i = 0; i < 20; i++) {
    if (i % 5 === 0) out += '-';
    out += '0123456789ABCDEFGHJKMNPQRSTVWXYZ'[parseInt(bits.slice(5 * i, 5 * i + 5), 2)];
  }
  return out;
}

const sha256Hex = (data) => crypto.createHash('sha256').update(data).digest('hex');

module.exports = { keyPair, sign, recordId, sha256Hex };
