"""The counter-based random generator of every trained run: Philox-4x32-10 (Salmon, Moraes,
Dror and Shaw 2011, "Parallel random numbers: as easy as 1, 2, 3") in torch integer
operations, and the distributions the trainer draws from it.

A draw is a pure function of (run seed, stream, step, index): the run's seed is the
Philox key (its low and high 32 bits), and the 128-bit counter is (index block, step,
stream, 0), each block giving four 32-bit words. So the draws of every run of a call are
computed at once, in a fixed number of tensor operations whatever the number of runs; a
run's draws do not depend on which runs are trained beside it, on how its steps are
chunked, or on the device: the words are the same bits on the CPU and on CUDA (tested
against Random123's known answers and an independent Philox), and the floating-point
transforms below agree to float rounding. Distinct keys give independent streams
(Salmon et al.: keys may be consecutive integers), so run seeds need no further hashing.

Distributions (``w`` a 32-bit word, uniform on {0, ..., 2^32 - 1}):

- Bernoulli(rate): ``w < floor(rate 2^32)``, exact integer comparisons; the probability
  is ``floor(rate 2^32) / 2^32``, within 2^-32 below ``rate`` (never above it).
- uniform on (0, 1): ``(w + 1/2) 2^-32``, in float64.
- normal: Box-Muller on two words (Box and Muller 1958), computed in float64 and rounded to
  float32: ``u1 = (w1 + 1) 2^-32`` in (0, 1], ``z = sqrt(-2 ln u1) (cos, sin)(2 pi w2
  2^-32)``; so ``|z| <= sqrt(64 ln 2) = 6.66``, a tail of mass 3e-11 cut off (as cuRAND's
  ``curand_normal`` from 32-bit uniforms).
- sort keys: two words as one 63-bit integer (permutations by argsort: a tie, which
  would keep two examples in index order, has probability about n^2 2^-64).

What runs where. On a GPU the words and the normals are one fused kernel each
(``torch.compile``): done as separate tensor operations, the ten rounds' passes over the
counters would move more bytes than the model's own step. Its transform takes the device's
own float64 log, cosine and sine. On the CPU, a draw of at least :data:`CPU_BULK_BLOCKS`
counter blocks per run and step (the trainer's noise and batches) is one compiled call per
thread for all its runs and steps (:mod:`dpaudit.dpsgd.cpu_draws`, numba: the rounds and
the transform in SIMD instructions); a smaller draw keeps the tensor operations, which
need no compiler in the process. The CPU's transform is fdlibm's polynomials with the
angle reduced exactly in integers (:func:`box_muller_fdlibm`), the same float64
operations on both CPU paths, so the CPU's words and normals are the same bits whichever
path drew them (tested). A GPU's words are these bits too, its normals equal to float
rounding: the CPU's transform is within about an ulp of the exact float64 values, the
GPU's too but near the zeros of the cosine and sine (its angle is rounded to float64
before it is reduced), so after the rounding to float32 the two are the same bits but for
rare values: those whose two float64 results straddle a float32 rounding boundary (one
float32 step apart), and those near the zeros (tested against torch's own kernels on the
CPU; docs/scale.md counts them). Without numba (a machine that cannot install it) the CPU
draws everything with the tensor operations: the same bits, more slowly, with a warning.
"""

from __future__ import annotations

import math
import os
import threading
from typing import Sequence

import numpy as np
import torch

# Philox-4x32 multipliers and Weyl key increments (Salmon et al. 2011, Random123).
M0, M1 = 0xD2511F53, 0xCD9E8D57
W0, W1 = 0x9E3779B9, 0xBB67AE85
ROUNDS = 10
MASK = 0xFFFFFFFF
#: Counter blocks per run and step from which the CPU's draws are the compiled kernels'
#: (module docstring); smaller draws are the torch operations'.
CPU_BULK_BLOCKS = 256

# The CPU's Box-Muller transform (box_muller_fdlibm): fdlibm's polynomials (Sun
# Microsystems 1993: e_log.c, k_sin.c, k_cos.c), ln 2 in two parts; the expressions as in
# musl's __sin.c, __cos.c and its log.c before its rewrite in version 1.1.22.
LOG = (6.666666666666735130e-01, 3.999999999940941908e-01, 2.857142874366239149e-01,
       2.222219843214978396e-01, 1.818357216161805012e-01, 1.531383769920937332e-01,
       1.479819860511658591e-01)
SIN = (-1.66666666666666324348e-01, 8.33333333332248946124e-03,
       -1.98412698298579493134e-04, 2.75573137070700676789e-06,
       -2.50507602534068634195e-08, 1.58969099521155010221e-10)
COS = (4.16666666666666019037e-02, -1.38888888888741095749e-03, 2.48015872894767294178e-05,
       -2.75573143513906633035e-07, 2.08757232129817482790e-09,
       -1.13596475577881948265e-11)
LN2_HI, LN2_LO = 6.93147180369123816490e-01, 1.90821492927058770002e-10
SQRT2 = math.sqrt(2.0)
#: Radians per unit of a word: 2 pi 2^-32.
TURN = 2 * math.pi * 2.0 ** -32

#: Streams of a run (the counter's third word): what each draw is for (batches: Poisson
#: masks by step, shuffle permutations by epoch). A new stream leaves every other draw
#: unchanged.
INIT, BATCH, NOISE, CANARY, PERMUTATION = 0, 1, 2, 3, 4
#: The distributions :func:`draw` computes.
KINDS = ("words", "bernoulli", "uniform", "normal", "sort_keys")


def philox4x32(c0, c1, c2, c3, k0, k1, rounds: int = ROUNDS):
    """Philox-4x32 of counters (c0, c1, c2, c3) under keys (k0, k1): int64 tensors that
    broadcast together, holding values in [0, 2^32); returns the four output words
    (int64, values in [0, 2^32), the broadcast shape).

    The 32 x 32 -> 64-bit products are int64 products, which wrap modulo 2^64 on every
    device torch supports; the high word is taken with a shift and a mask. Only the words
    that enter a product are masked in the loop (the others are masked at the end)."""
    shape = torch.broadcast_shapes(c0.shape, c1.shape, c2.shape, c3.shape, k0.shape, k1.shape)
    c0, c1, c2, c3 = (c.expand(shape).clone() for c in (c0, c1, c2, c3))
    p0, p1 = torch.empty_like(c0), torch.empty_like(c0)
    r = torch.arange(rounds, dtype=torch.int64, device=c0.device)  # the key schedule at once
    keys0 = (k0.unsqueeze(-1) + r * W0).bitwise_and_(MASK)
    keys1 = (k1.unsqueeze(-1) + r * W1).bitwise_and_(MASK)
    for r in range(rounds):
        ka, kb = keys0[..., r], keys1[..., r]
        torch.mul(c0, M0, out=p0)
        torch.mul(c2, M1, out=p1)
        # (c0, c1, c2, c3) <- (hi(p1) ^ c1 ^ ka, lo(p1), hi(p0) ^ c3 ^ kb, lo(p0))
        c1.bitwise_xor_(ka).bitwise_xor_(p1 >> 32).bitwise_and_(MASK)
        c3.bitwise_xor_(kb).bitwise_xor_(p0 >> 32).bitwise_and_(MASK)
        c0, c1, c2, c3, p0, p1 = c1, p1, c3, p0, c0, c2
    return c0, c1.bitwise_and_(MASK), c2, c3.bitwise_and_(MASK)


def keys(seeds: Sequence[int], device) -> torch.Tensor:
    """The Philox keys (K, 2) int64 of run seeds (integers in [0, 2^64)): low and high 32
    bits."""
    out = []
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, int) and not hasattr(s, "__index__"):
            raise ValueError(f"seed={s!r}: must be an integer in [0, 2^64)")
        s = int(s)
        if not 0 <= s < 2 ** 64:
            raise ValueError(f"seed={s}: must be an integer in [0, 2^64)")
        out.append((s & MASK, s >> 32))
    return torch.tensor(out, dtype=torch.int64, device=device).view(-1, 2)


def _words(k0, k1, c1, c2, blocks: int):
    """The words of ``blocks`` counter blocks (index, c1, c2, 0) under keys (k0, k1), all
    (K, 1, 1) or (1, S, 1): (K, S, 4 * blocks) int64."""
    c0 = torch.arange(blocks, dtype=torch.int64, device=k0.device)
    return torch.stack(philox4x32(c0, c1, c2, torch.zeros_like(c2), k0, k1), -1).flatten(-2)


def _pairs(k0, k1, c1, c2, blocks: int):
    """The word pairs of :func:`_words`' blocks, as the Box-Muller transforms take them:
    (first words, second words), (K, S, blocks, 2) int64 each."""
    c0 = torch.arange(blocks, dtype=torch.int64, device=k0.device)
    w = philox4x32(c0, c1, c2, torch.zeros_like(c2), k0, k1)
    return torch.stack((w[0], w[2]), -1), torch.stack((w[1], w[3]), -1)


def _normals(k0, k1, c1, c2, blocks: int):
    """Box-Muller normals of the words of :func:`_words`, (K, S, 4 * blocks) float32, with
    the device's own transcendentals (:func:`_box_muller`): the GPU's."""
    return _box_muller(*_pairs(k0, k1, c1, c2, blocks))


def _normals_fdlibm(k0, k1, c1, c2, blocks: int):
    """:func:`_normals` with :func:`box_muller_fdlibm`: the CPU's."""
    return box_muller_fdlibm(*_pairs(k0, k1, c1, c2, blocks))


def _box_muller(a, b):
    """The normals (..., 4 * blocks) float32 of each block's word pairs (0, 1) and (2, 3):
    ``a`` the pairs' first words, ``b`` their second, (..., blocks, 2) int64 each; with the
    device's own float64 log, cosine and sine, rounded to float32 (the GPU's transform)."""
    r = a.double().add_(1).mul_(2.0 ** -32).log_().mul_(-2).sqrt_()
    theta = b.double().mul_(2 * math.pi * 2.0 ** -32)
    out = torch.empty(*r.shape, 2, dtype=torch.float32, device=r.device)
    out[..., 0] = torch.cos(theta).mul_(r)
    out[..., 1] = theta.sin_().mul_(r)
    return out.flatten(-3)


def box_muller_fdlibm(a, b):
    """:func:`_box_muller` (the same arguments and layout) with fdlibm's log, sine and
    cosine (:data:`LOG`, :data:`SIN`, :data:`COS`, each within about an ulp of float64), the
    CPU's transform: as torch operations here, and compiled in
    :mod:`dpaudit.dpsgd.cpu_draws` operation for operation (the same bits, tested).

    The angle is reduced exactly, in integers: ``2 pi b 2^-32 = q pi/2 + a'``, ``q`` the
    nearest quarter turn, ``a' = (b - q 2^30) 2 pi 2^-32`` in [-pi/4, pi/4]; the radius's
    ``u = (a + 1) 2^-32 = 2^k x``, x in [sqrt(1/2), sqrt(2)), ``ln u = k ln 2 + ln x``.
    So the float64 results stay within an ulp or so of the exact ones, and their float32
    roundings are the exact values' but where those lie within an ulp or so of a float32
    rounding boundary (tested against long double wherever they lie farther than 2^-40,
    relative, from one)."""
    mant, e = torch.frexp(a.double().add_(1))  # (a + 1) = mant 2^e, mant in [1/2, 1)
    x, k = mant * 2, (e - 1).double()
    big = x >= SQRT2
    x = torch.where(big, x * 0.5, x)
    k = torch.where(big, k + 1.0, k) - 32.0
    lg1, lg2, lg3, lg4, lg5, lg6, lg7 = LOG
    f = x - 1.0
    s = f / (2.0 + f)
    z = s * s
    w = z * z
    t1 = w * (lg2 + w * (lg4 + w * lg6))
    t2 = z * (lg1 + w * (lg3 + w * (lg5 + w * lg7)))
    R = t2 + t1
    hfsq = 0.5 * f * f
    r = torch.sqrt(-2.0 * (s * (hfsq + R) + k * LN2_LO - hfsq + f + k * LN2_HI))

    s1, s2, s3, s4, s5, s6 = SIN
    c1, c2, c3, c4, c5, c6 = COS
    q = (b + (1 << 29)) >> 30
    a = (b - (q << 30)).double() * TURN
    z = a * a
    w = z * z
    rs = s2 + z * (s3 + z * s4) + z * w * (s5 + z * s6)
    sn = a + z * a * (s1 + z * rs)
    rc = z * (c1 + z * (c2 + z * c3)) + w * w * (c4 + z * (c5 + z * c6))
    hz = 0.5 * z
    wc = 1.0 - hz
    cs = wc + (((1.0 - wc) - hz) + z * rc)
    odd = (q & 1) == 1
    out = torch.empty(*r.shape, 2, dtype=torch.float32, device=r.device)
    out[..., 0] = torch.where(odd, sn, cs) * (1 - ((q + 1) & 2)).double() * r
    out[..., 1] = torch.where(odd, cs, sn) * (1 - (q & 2)).double() * r
    return out.flatten(-3)


def _kernels():
    """:mod:`dpaudit.dpsgd.cpu_draws`, or None (with a warning, once) where numba is not
    installed: the CPU then draws with the torch operations, the same bits more slowly."""
    global _KERNELS
    if _KERNELS is False:
        try:
            from . import cpu_draws
            _KERNELS = cpu_draws
        except Exception as exc:  # noqa: BLE001 (not installed, or fails to import)
            import warnings

            warnings.warn(f"philox: the CPU's compiled draws are not used ({exc}); drawing "
                          f"with torch operations (the same draws, more slowly)")
            _KERNELS = None
    return _KERNELS


_KERNELS: object = False


def _cpu_bulk(kernels, key: torch.Tensor, steps: list[int], stream: int, blocks: int,
              normal: bool) -> torch.Tensor:
    """The words of :func:`_words` on the CPU, (K, S, 4 * blocks) int64, or with ``normal``
    their normals (:func:`box_muller_fdlibm`, float32), from ``kernels``
    (:mod:`dpaudit.dpsgd.cpu_draws`): the (run, step) draws shared among
    ``torch.get_num_threads()`` threads (the kernels release the GIL)."""
    out = torch.empty((len(key), len(steps), 4 * blocks),
                      dtype=torch.float32 if normal else torch.int64)
    words, normals = ((np.empty((0, 0, 0), np.int64), out.numpy()) if normal else
                      (out.numpy(), np.empty((0, 0, 0), np.float32)))
    args = (words, normals, key.numpy(), np.asarray(steps, dtype=np.int64), stream, blocks)

    def share(first: int, every: int) -> None:  # the tasks first, first + every, ...
        kernels.draw(*args, first, every, kernels.CONSTANTS)

    threads = min(torch.get_num_threads(), len(key) * len(steps))
    if threads <= 1 or len(key) * len(steps) * blocks < _THREADED_BLOCKS:
        share(0, 1)
    else:
        list(_pool(threads).map(lambda t: share(t, threads), range(threads)))
    return out


#: Counter blocks of a draw from which it is shared among threads (below, handing the
#: pieces to the threads costs more than it saves).
_THREADED_BLOCKS = 2 ** 14
_POOL: dict = {}  # at most one: its thread count -> the pool


def _pool(threads: int):
    """The pool of ``threads`` threads of the bulk draws, kept between draws (a new one
    per draw costs more than a small draw); shut down before this process forks
    (:func:`_drop_pools`), so that no process holds threads it does not have."""
    from concurrent.futures import ThreadPoolExecutor

    with _lock:
        if threads not in _POOL:
            for old in _POOL.values():
                old.shutdown(wait=False)
            _POOL.clear()
            _POOL[threads] = ThreadPoolExecutor(threads, thread_name_prefix="philox")
        return _POOL[threads]


def _drop_pools() -> None:
    """Shut the bulk draws' threads down (they finish what they hold): run before every
    fork, whose child would otherwise wait forever on threads it does not have."""
    with _lock:
        pools = list(_POOL.values())
        _POOL.clear()
    for pool in pools:
        pool.shutdown(wait=True)


_FUSED: dict = {}
_lock = threading.Lock()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_drop_pools)


def _fused(fn):
    """``fn`` compiled once per process (dynamic shapes: no recompiling per size), checked
    once against its eager self on a small draw; ``fn`` itself, with a warning, where
    compiling fails or disagrees (the words must be the same bits on every path)."""
    with _lock:
        if fn not in _FUSED:
            _FUSED[fn] = _compile_checked(fn)
        return _FUSED[fn]


def _compile_checked(fn):
    import warnings

    try:
        compiled = torch.compile(fn, dynamic=True)
        # The shapes of the trainer's draws, keys (K, 1, 1) and one step (1, 1, 1), with K = 1
        # and K > 1 (torch compiles a size of 1 apart): the words equal, normals within 1e-6.
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        same = True
        for keys in ([3, 2 ** 32 - 1, 8], [2 ** 32 - 5]):
            K = len(keys)
            args = tuple(torch.tensor(v, device=dev).view(*shape) for v, shape in (
                (keys, (K, 1, 1)), ([7] * K, (K, 1, 1)), ([2 ** 31], (1, 1, 1)),
                ([2], (1, 1, 1)))) + (5,)
            want, got = fn(*args), compiled(*args)
            same = same and (torch.equal(want, got) if not want.is_floating_point() else
                             torch.allclose(want, got, rtol=1e-6, atol=1e-6))
        if same:
            return compiled
        why = "its draws differ from the eager ones"
    except Exception as exc:  # noqa: BLE001 (any compiler failure: fall back, say why)
        why = f"{type(exc).__name__}: {exc}"
    warnings.warn(f"philox: the fused {fn.__name__} is not used ({why}); drawing with "
                  f"separate tensor operations (the same draws, more slowly)")
    return fn


def draw(kind: str, key: torch.Tensor, stream: int, steps, count: int, param: float = 0.0,
         fused: bool = False) -> torch.Tensor:
    """``count`` draws of ``kind`` per run and step: (K, count) for one step (an int), (K,
    S, count) for S steps (a 1-D int64 tensor), on ``key``'s device.

    ``key`` (K, 2) from :func:`keys`; ``stream`` one of :data:`INIT`, :data:`BATCH`,
    :data:`NOISE`, :data:`CANARY`, :data:`PERMUTATION`; ``steps`` the step (or epoch)
    numbers, in [0, 2^32).
    Value i of a (run, step) is word i % 4 of the counter block i // 4 ("words",
    "bernoulli", "uniform"); "normal" value i is the cosine (i even) or sine (i odd) of the
    Box-Muller pair of words (2 (i // 2), 2 (i // 2) + 1); "sort_keys" value i joins words
    2i and 2i + 1. ``param``: the rate of "bernoulli" (in [0, 1]). ``fused``: the words
    and normals as one compiled kernel each (the same words; normals to float rounding)."""
    if kind not in KINDS:
        raise ValueError(f"philox.draw: kind={kind!r}: must be one of {KINDS}")
    if kind == "bernoulli" and not 0 <= param <= 1:
        raise ValueError(f"philox.draw: bernoulli rate={param!r}: must be in [0, 1]")
    dev = key.device
    one = isinstance(steps, int)
    c1 = torch.as_tensor([steps] if one else steps, dtype=torch.int64, device=dev).view(1, -1, 1)
    if one and not 0 <= steps < 2 ** 32 or not one and (c1.min() < 0 or c1.max() >= 2 ** 32):
        raise ValueError(f"philox.draw: steps must lie in [0, 2^32) (the counter's 32-bit "
                         f"step word); got {steps!r}")
    c2 = torch.full((1, 1, 1), stream, dtype=torch.int64, device=dev)
    per_value = 2 if kind == "sort_keys" else 1
    blocks = -(-count * per_value // 4)
    if not fused and dev.type == "cpu" and blocks >= CPU_BULK_BLOCKS and _kernels():
        out = _cpu_bulk(_kernels(), key, c1.view(-1).tolist(), stream, blocks,
                        kind == "normal")
    else:
        # contiguous copies: the layout the compiled kernels were checked on (a strided
        # column would compile them again on the first draw); a copy for every K, so that
        # the operations of a draw do not depend on the runs
        k0, k1 = (key[:, i].clone(memory_format=torch.contiguous_format).view(-1, 1, 1)
                  for i in (0, 1))
        fn = _words if kind != "normal" else _normals if fused or dev.type != "cpu" else \
            _normals_fdlibm
        out = (_fused(fn) if fused else fn)(k0, k1, c1, c2, blocks)
    if kind == "bernoulli":  # exact: a float64 times a power of two, then floor
        out = out < math.floor(param * 2 ** 32)
    elif kind == "uniform":
        out = out.double().add_(0.5).mul_(2.0 ** -32)
    elif kind == "sort_keys":  # two words per key: 32 + 31 bits, in [0, 2^63)
        out = (out[..., 0::2] << 31) | (out[..., 1::2] >> 1)
    out = out[..., :count]
    return out[:, 0] if one else out


__all__ = ["philox4x32", "keys", "draw", "INIT", "BATCH", "NOISE", "CANARY", "PERMUTATION",
           "KINDS",
           "ROUNDS", "M0", "M1", "W0", "W1"]
