"""The CPU's bulk Philox draws (:mod:`dpaudit.dpsgd.philox`), compiled with numba: the
words of Philox-4x32-10 and their Box-Muller normals, every (run, step) of a draw in one
call per thread, in pieces of :data:`PIECE` counter blocks whose loops the compiler turns
into SIMD instructions (the ten rounds over eight blocks at once, the transform over eight
pairs).

The normals are :func:`dpaudit.dpsgd.philox.box_muller_fdlibm`'s, operation for
operation: the same float64 operations in the same order, none fused (numba contracts no
multiply-add without ``fastmath``), so the two are the same bits (tested on millions of
words). Compiled once per machine: ``cache=True`` keeps the machine code beside this file
(or in numba's cache folder), so a later process loads it in a fraction of a second. The
cache is renewed when this file changes, not when another module's globals do: the
transform's coefficients come as an argument (:data:`CONSTANTS`), never frozen into it
(Philox's own constants define the generator, and are frozen).
"""

from __future__ import annotations

import numba
import numpy as np

from .philox import COS, LN2_HI, LN2_LO, LOG, M0, M1, MASK, ROUNDS, SIN, SQRT2, TURN, W0, W1

#: Counter blocks of one piece: its scratch arrays (a few tens of kB) stay in the cache.
PIECE = 512
_JIT = dict(cache=True, nogil=True, error_model="numpy")
#: The transform's coefficients, in the order :func:`_radius` and :func:`_pairs` take them.
CONSTANTS = LOG + SIN + COS + (LN2_HI, LN2_LO, SQRT2, TURN)


@numba.njit(**_JIT)
def _block_words(w, first, n, c1, c2, k0, k1):
    """Words of counter blocks (first + i, c1, c2, 0), i < n, under key (k0, k1) into w[j,
    i] (int64 (4, PIECE)): :func:`dpaudit.dpsgd.philox.philox4x32`'s int64 arithmetic."""
    for i in range(n):
        a, b, c, d = first + i, c1, c2, np.int64(0)
        ka, kb = k0, k1
        for _ in range(ROUNDS):
            p0 = a * M0
            p1 = c * M1
            a, b, c, d = ((p1 >> 32) ^ b ^ ka) & MASK, p1 & MASK, ((p0 >> 32) ^ d ^ kb) & MASK, \
                p0 & MASK
            ka = (ka + W0) & MASK
            kb = (kb + W1) & MASK
        w[0, i] = a
        w[1, i] = b
        w[2, i] = c
        w[3, i] = d


@numba.njit(**_JIT)
def _radius(wa, m, r, n, c):
    """r[i] = sqrt(-2 ln((wa[i] + 1) 2^-32)) (:func:`philox.box_muller_fdlibm`); ``c``
    :data:`CONSTANTS`."""
    LG1, LG2, LG3, LG4, LG5, LG6, LG7 = c[0], c[1], c[2], c[3], c[4], c[5], c[6]
    LN2_HI, LN2_LO, SQRT2 = c[19], c[20], c[21]
    for i in range(n):
        m[i] = np.float64(wa[i] + 1)
    bits = m.view(np.int64)
    for i in range(n):  # m = 2^e x, x in [1, 2): the exponent e in r, x in m
        b = bits[i]
        r[i] = np.float64((b >> 52) - 1023)
        bits[i] = (b & 0xFFFFFFFFFFFFF) | (1023 << 52)
    for i in range(n):
        x = m[i]
        big = x >= SQRT2
        x = x * 0.5 if big else x
        k = (r[i] + 1.0 if big else r[i]) - 32.0
        f = x - 1.0
        s = f / (2.0 + f)
        z = s * s
        w = z * z
        t1 = w * (LG2 + w * (LG4 + w * LG6))
        t2 = z * (LG1 + w * (LG3 + w * (LG5 + w * LG7)))
        R = t2 + t1
        hfsq = 0.5 * f * f
        r[i] = np.sqrt(-2.0 * (s * (hfsq + R) + k * LN2_LO - hfsq + f + k * LN2_HI))


@numba.njit(**_JIT)
def _pairs(wb, r, oc, os, n, c):
    """oc[i], os[i] = r[i] (cos, sin)(2 pi wb[i] 2^-32) rounded to float32
    (:func:`philox.box_muller_fdlibm`); ``c`` :data:`CONSTANTS`."""
    S1, S2, S3, S4, S5, S6 = c[7], c[8], c[9], c[10], c[11], c[12]
    C1, C2, C3, C4, C5, C6 = c[13], c[14], c[15], c[16], c[17], c[18]
    TURN = c[22]
    for i in range(n):
        v = wb[i]
        q = (v + (1 << 29)) >> 30
        a = np.float64(v - (q << 30)) * TURN
        z = a * a
        w = z * z
        rs = S2 + z * (S3 + z * S4) + z * w * (S5 + z * S6)
        sn = a + z * a * (S1 + z * rs)
        rc = z * (C1 + z * (C2 + z * C3)) + w * w * (C4 + z * (C5 + z * C6))
        hz = 0.5 * z
        wc = 1.0 - hz
        cs = wc + (((1.0 - wc) - hz) + z * rc)
        odd = (q & 1) == 1
        co = sn if odd else cs
        si = cs if odd else sn
        oc[i] = np.float32(co * np.float64(1 - ((q + 1) & 2)) * r[i])
        os[i] = np.float32(si * np.float64(1 - (q & 2)) * r[i])


@numba.njit(**_JIT)
def draw(words, normals, keys, steps, stream, blocks, first, every, c):
    """The (run, step) tasks first, first + every, ... (t = k S + s) of a draw: word j of
    block (i, steps[s], stream, 0) under keys[k] into words[k, s, 4 i + j] (int64 (K, S, 4
    blocks)); or, where ``normals`` (float32, that shape) is not empty, the words' normals
    into it instead, value 4 i + 2 p + (0, 1) the (cosine, sine) of block i's word pair p.
    ``c``: :data:`CONSTANTS`."""
    S = len(steps)
    normal = normals.size > 0
    w = np.empty((4, PIECE), np.int64)
    m, r = np.empty(PIECE), np.empty(PIECE)
    oc, os = np.empty((2, PIECE), np.float32), np.empty((2, PIECE), np.float32)
    for t in range(first, len(keys) * S, every):
        k, s = t // S, t % S
        for lo in range(0, blocks, PIECE):
            n = min(PIECE, blocks - lo)
            _block_words(w, lo, n, steps[s], stream, keys[k, 0], keys[k, 1])
            if not normal:
                o = words[k, s]
                for i in range(n):
                    for j in range(4):
                        o[4 * (lo + i) + j] = w[j, i]
                continue
            for p in range(2):
                _radius(w[2 * p], m, r, n, c)
                _pairs(w[2 * p + 1], r, oc[p], os[p], n, c)
            o = normals[k, s]
            for i in range(n):
                b = 4 * (lo + i)
                o[b] = oc[0, i]
                o[b + 1] = os[0, i]
                o[b + 2] = oc[1, i]
                o[b + 3] = os[1, i]
