// BLAKE2b (RFC 7693), unkeyed, any digest length 1..64 bytes. 64-bit words are kept as pairs
// of 32-bit halves (low, high) in a Uint32Array, so no BigInt on the hot path: a 16 MiB record
// hashes in well under a second.
(function (root) {
  'use strict';

  const IV = new Uint32Array([
    0xf3bcc908, 0x6a09e667, 0x84caa73b, 0xbb67ae85, 0xfe94f82b, 0x3c6ef372, 0x5f1d36f1, 0xa54ff53a,
    0xade682d1, 0x510e527f, 0x2b3e6c1f, 0x9b05688c, 0xfb41bd6b, 0x1f83d9ab, 0x137e2179, 0x5be0cd19,
  ]);

  const SIGMA = [
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
    [14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3],
    [11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4],
    [7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8],
    [9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13],
    [2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9],
    [12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11],
    [13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10],
    [6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5],
    [10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0],
  ];
  // Rounds 10 and 11 repeat rounds 0 and 1. Indices doubled: word i lives at [2i, 2i+1].
  const SIGMA2 = [];
  for (let r = 0; r < 12; r++) SIGMA2.push(SIGMA[r % 10].map((i) => 2 * i));

  const v = new Uint32Array(32);
  const m = new Uint32Array(32);

  // v[a] += v[b] (+ carry between the halves)
  function add(a, b) {
    const lo = v[a] + v[b];
    const hi = v[a + 1] + v[b + 1] + (lo >= 0x100000000 ? 1 : 0);
    v[a] = lo;
    v[a + 1] = hi;
  }
  function addM(a, x) {
    const lo = v[a] + m[x];
    const hi = v[a + 1] + m[x + 1] + (lo >= 0x100000000 ? 1 : 0);
    v[a] = lo;
    v[a + 1] = hi;
  }

  function G(a, b, c, d, x, y) {
    let lo, hi;
    add(a, b);
    addM(a, x);
    // d = rotr64(d ^ a, 32)
    lo = v[d] ^ v[a];
    hi = v[d + 1] ^ v[a + 1];
    v[d] = hi;
    v[d + 1] = lo;
    add(c, d);
    // b = rotr64(b ^ c, 24)
    lo = v[b] ^ v[c];
    hi = v[b + 1] ^ v[c + 1];
    v[b] = (lo >>> 24) ^ (hi << 8);
    v[b + 1] = (hi >>> 24) ^ (lo << 8);
    add(a, b);
    addM(a, y);
    // d = rotr64(d ^ a, 16)
    lo = v[d] ^ v[a];
    hi = v[d + 1] ^ v[a + 1];
    v[d] = (lo >>> 16) ^ (hi << 16);
    v[d + 1] = (hi >>> 16) ^ (lo << 16);
    add(c, d);
    // b = rotr64(b ^ c, 63) = rotl64(b ^ c, 1)
    lo = v[b] ^ v[c];
    hi = v[b + 1] ^ v[c + 1];
    v[b] = (hi >>> 31) ^ (lo << 1);
    v[b + 1] = (lo >>> 31) ^ (hi << 1);
  }

  function compress(h, block, offset, counter, last) {
    for (let i = 0; i < 16; i++) {
      v[i] = h[i];
      v[i + 16] = IV[i];
    }
    // t (128-bit byte counter; the high 64 bits stay 0 below 2^53 bytes)
    v[24] ^= counter >>> 0;
    v[25] ^= Math.floor(counter / 0x100000000);
    if (last) {
      v[28] = ~v[28];
      v[29] = ~v[29];
    }
    for (let i = 0; i < 32; i++) {
      const p = offset + 4 * i;
      m[i] = block[p] | (block[p + 1] << 8) | (block[p + 2] << 16) | (block[p + 3] << 24);
    }
    for (let r = 0; r < 12; r++) {
      const s = SIGMA2[r];
      G(0, 8, 16, 24, s[0], s[1]);
      G(2, 10, 18, 26, s[2], s[3]);
      G(4, 12, 20, 28, s[4], s[5]);
      G(6, 14, 22, 30, s[6], s[7]);
      G(0, 10, 20, 30, s[8], s[9]);
      G(2, 12, 22, 24, s[10], s[11]);
      G(4, 14, 16, 26, s[12], s[13]);
      G(6, 8, 18, 28, s[14], s[15]);
    }
    for (let i = 0; i < 16; i++) h[i] ^= v[i] ^ v[i + 16];
  }

  // BLAKE2b of `data` (a Uint8Array), `outlen` bytes (default 64).
  function blake2b(data, outlen) {
    if (outlen === undefined) outlen = 64;
    if (!(data instanceof Uint8Array)) throw new TypeError('blake2b: data must be a Uint8Array');
    if (!Number.isInteger(outlen) || outlen < 1 || outlen > 64) throw new RangeError('blake2b: outlen must be 1..64');
    const h = new Uint32Array(IV);
    h[0] ^= 0x01010000 ^ outlen; // parameter block: digest length, no key, fanout 1, depth 1
    const n = data.length;
    let off = 0;
    // Every full block but the last is compressed as not-last; the last (possibly empty or
    // partial) block is padded with zeros.
    while (n - off > 128) {
      compress(h, data, off, off + 128, false);
      off += 128;
    }
    const tail = new Uint8Array(128);
    tail.set(data.subarray(off));
    compress(h, tail, 0, n, true);
    const out = new Uint8Array(outlen);
    for (let i = 0; i < outlen; i++) out[i] = h[i >> 2] >>> (8 * (i & 3));
    return out;
  }

  const api = { blake2b };
  root.FerryBlake2b = api;
  if (typeof module === 'object' && module.exports) module.exports = api;
})(globalThis);
