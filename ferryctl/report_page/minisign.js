// minisign's formats and the check of one signed record, as `minisign -V` and `ferryctl verify` do it:
//   public key:  "untrusted comment: ..." / base64("Ed" || key id (8, little-endian) || key (32))
//   signature:   "untrusted comment: ..." / base64("ED" || key id || Ed25519(BLAKE2b-512(data)))
//                "trusted comment: ..."   / base64(Ed25519(signature || trusted comment))
// The legacy form ("Ed": Ed25519 over the data itself) is refused, as ferryctl verify refuses it:
// ferry signs only "ED", and the algorithm bytes are not signed, so a prehashed signature relabelled
// "Ed" verifies over the 64 bytes of the hash as if they were a record. Every path that is not a
// complete, successful check ends in a verdict other than 'verified'.
(function (root) {
  'use strict';
  const blake2b = (root.FerryBlake2b || (typeof require === 'function' ? require('./blake2b.js') : {})).blake2b;

  function decodeBase64(text) {
    if (!/^[A-Za-z0-9+/]*={0,2}$/.test(text) || text.length % 4 !== 0) return null;
    const bin = atob(text);
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }

  function lines(text) {
    return text.split('\n').map((l) => (l.endsWith('\r') ? l.slice(0, -1) : l));
  }

  // As minisign prints it: most significant byte first.
  function keyIdHex(id) {
    let s = '';
    for (let i = 7; i >= 0; i--) s += id[i].toString(16).padStart(2, '0');
    return s.toUpperCase();
  }

  // {id, key} or throws Error with what is wrong.
  function parsePublicKey(text) {
    const body = lines(String(text).trim()).filter((l) => l !== '' && !l.startsWith('untrusted comment:'));
    if (body.length === 0) throw new Error('no key in the text given');
    const raw = decodeBase64(body[0].trim());
    if (!raw || raw.length !== 42) throw new Error('not a minisign public key (its base64 line does not hold 42 bytes)');
    if (raw[0] !== 0x45 || raw[1] !== 0x64) throw new Error('not an Ed25519 minisign public key');
    return { id: raw.slice(2, 10), key: raw.slice(10, 42), idHex: keyIdHex(raw.slice(2, 10)) };
  }

  // {keyId, signature, trustedComment, globalSignature} or throws.
  function parseSignature(text) {
    const l = lines(String(text));
    if (l.length < 4 || !l[0].startsWith('untrusted comment:') || !l[2].startsWith('trusted comment: ')) {
      throw new Error('not a minisign signature file');
    }
    const sig = decodeBase64(l[1]);
    if (!sig || sig.length !== 74) throw new Error('the signature line is truncated or malformed (not 74 bytes)');
    const algo = String.fromCharCode(sig[0], sig[1]);
    if (algo === 'Ed') throw new Error('a legacy (not prehashed, "Ed") signature: ferry signs only prehashed ("ED") ones');
    if (algo !== 'ED') throw new Error('unknown signature algorithm "' + algo + '"');
    const global = decodeBase64(l[3]);
    if (!global || global.length !== 64) throw new Error('the trusted comment\'s signature is truncated or malformed');
    return {
      keyId: sig.slice(2, 10),
      keyIdHex: keyIdHex(sig.slice(2, 10)),
      signature: sig.slice(10, 74),
      trustedComment: l[2].slice('trusted comment: '.length),
      globalSignature: global,
    };
  }

  async function sha256(subtle, bytes) {
    return new Uint8Array(await subtle.digest('SHA-256', bytes));
  }

  const hex = (bytes) => Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');

  async function sha256Hex(subtle, bytes) {
    return hex(await sha256(subtle, bytes));
  }

  // The record id ferry gives a record: "FRY-" and four groups of five Crockford base32
  // characters of the first 100 bits of its SHA-256 (`h`, the digest's bytes).
  function recordIdOfDigest(h) {
    const alphabet = '0123456789ABCDEFGHJKMNPQRSTVWXYZ';
    let out = 'FRY';
    for (let i = 0; i < 20; i++) {
      if (i % 5 === 0) out += '-';
      const bit = i * 5;
      const w = (h[bit >> 3] << 8) | h[(bit >> 3) + 1];
      out += alphabet[(w >> (11 - (bit % 8))) & 31];
    }
    return out;
  }

  async function recordId(subtle, bytes) {
    return recordIdOfDigest(await sha256(subtle, bytes));
  }

  // What a ferry record's trusted comment says: {kind: 'report'|'snapshot', what, id, seq}.
  function parseTrustedComment(tc) {
    let m = /^ferry report (\S+) (FRY-[0-9A-Z-]+)$/.exec(tc);
    if (m) return { kind: 'report', what: m[1], id: m[2] };
    // As ferryd writes it: no leading zeros, and below 10^15 (a Number holds it exactly).
    m = /^ferry snapshot (FRY-[0-9A-Z-]+) seq (0|[1-9]\d{0,14})$/.exec(tc);
    if (m) return { kind: 'snapshot', what: 'snapshot', id: m[1], seq: Number(m[2]) };
    return null;
  }

  function fail(part, reason, extra) {
    return Object.assign({ status: 'failed', part, reason }, extra || {});
  }

  // Checks `data` (Uint8Array) against the .minisig text and the public key text.
  // Returns {status: 'verified'|'failed'|'unsupported'|'no-key', part, reason, keyIdHex,
  // signedByHex, trustedComment, claim}. `subtle` is a WebCrypto SubtleCrypto; `digest`, where
  // the caller has it already, is the SHA-256 of `data`.
  async function verifyRecord(subtle, data, sigText, pubText, digest) {
    if (!subtle) return { status: 'unsupported', reason: 'this browser offers no WebCrypto (crypto.subtle)' };
    let sig;
    try {
      sig = parseSignature(sigText);
    } catch (e) {
      return fail('signature', 'the signature: ' + e.message);
    }
    if (pubText === undefined || pubText === null || String(pubText).trim() === '') {
      return { status: 'no-key', reason: 'no public key to check against', signedByHex: sig.keyIdHex };
    }
    let pub;
    try {
      pub = parsePublicKey(pubText);
    } catch (e) {
      return fail('key', 'the public key: ' + e.message, { signedByHex: sig.keyIdHex });
    }
    const ids = { keyIdHex: pub.idHex, signedByHex: sig.keyIdHex, trustedComment: sig.trustedComment };
    if (pub.idHex !== sig.keyIdHex) {
      return fail('key', 'signed by key ' + sig.keyIdHex + ', not by key ' + pub.idHex, ids);
    }
    let key;
    try {
      key = await subtle.importKey('raw', pub.key, { name: 'Ed25519' }, false, ['verify']);
    } catch (e) {
      if (e && e.name === 'NotSupportedError') {
        return Object.assign({ status: 'unsupported', reason: 'this browser cannot check Ed25519 signatures (' + e.message + ')' }, ids);
      }
      return fail('key', 'the public key cannot be used: ' + (e && e.message), ids);
    }
    let dataOk, commentOk;
    try {
      dataOk = (await subtle.verify({ name: 'Ed25519' }, key, sig.signature, blake2b(data, 64))) === true;
      const tc = new TextEncoder().encode(sig.trustedComment);
      const msg = new Uint8Array(64 + tc.length);
      msg.set(sig.signature, 0);
      msg.set(tc, 64);
      commentOk = (await subtle.verify({ name: 'Ed25519' }, key, sig.globalSignature, msg)) === true;
    } catch (e) {
      if (e && e.name === 'NotSupportedError') {
        return Object.assign({ status: 'unsupported', reason: 'this browser cannot check Ed25519 signatures (' + e.message + ')' }, ids);
      }
      return fail('signature', 'the check itself failed: ' + (e && e.message), ids);
    }
    // Both fail for a key other than the signer's that carries its id, or a changed signature; a
    // changed record leaves the trusted comment's signature (over signature || comment) intact.
    if (!dataOk && !commentOk) {
      return fail('key-or-signature', 'neither the record\'s signature nor the trusted comment\'s matches key ' + pub.idHex +
        ': another key with the same id signed it, or the signature was changed', ids);
    }
    if (!dataOk) {
      return fail('data', 'the record\'s bytes do not match the signature: the record was changed after it was signed', ids);
    }
    if (!commentOk) {
      return fail('comment', 'the trusted comment was changed after signing (its signature does not match)', ids);
    }
    const claim = parseTrustedComment(sig.trustedComment);
    if (!claim) return fail('comment', 'the trusted comment is not a ferry record\'s: "' + sig.trustedComment + '"', ids);
    const id = recordIdOfDigest(digest || await sha256(subtle, data));
    if (id !== claim.id) return fail('data', 'record id ' + claim.id + ' does not match the record\'s hash (' + id + ')', ids);
    return Object.assign({ status: 'verified', claim, recordId: id }, ids);
  }

  const api = { decodeBase64, hex, keyIdHex, parsePublicKey, parseSignature, parseTrustedComment, recordId, sha256, sha256Hex, verifyRecord };
  root.FerryMinisign = api;
  if (typeof module === 'object' && module.exports) module.exports = api;
})(globalThis);
