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
counters would move more bytes than the model's own step. On the CPU, a draw of at least
:data:`CPU_BULK_BLOCKS` counter blocks per run and step (the trainer's noise and batches)
takes its words from randomgen's Philox-4x32-10 in C (a generator per thread, its key and
counter set per run and step: its counter is incremented before each block, so it is set to
the block before (0, step, stream, 0); the runs and steps shared among torch's threads),
several times cheaper than the rounds as int64 tensor operations; a smaller draw keeps the
tensor operations, whose cost is a fixed number of calls for all runs where randomgen's is
a state change per run and step. Compiling on the
CPU is not used: it costs seconds per process and needs a C++ compiler, and its float64
transcendentals need not be torch's eager kernels bit for bit. The Box-Muller transform is
the same torch float64 operations on every CPU path, so the CPU's words and normals are
the same bits whichever path drew them (tested); a GPU's words are these bits too, its
normals equal to float rounding (the transform is computed in float64 and rounded to
float32, so they are nearly always the same bits).
"""

from __future__ import annotations

import math
import threading
from typing import Sequence

import numpy as np
import torch

# Philox-4x32 multipliers and Weyl key increments (Salmon et al. 2011, Random123).
M0, M1 = 0xD2511F53, 0xCD9E8D57
W0, W1 = 0x9E3779B9, 0xBB67AE85
ROUNDS = 10
_MASK = 0xFFFFFFFF
#: Counter blocks per run and step from which the CPU's draws are randomgen's (module
#: docstring); smaller draws are the torch operations'.
CPU_BULK_BLOCKS = 256
#: Counter blocks of a bulk CPU draw turned into normals at once: a large draw's float64
#: temporaries stay small (about 0.5 MB), not the size of the whole draw.
_PIECE = 8192

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
    keys0 = (k0.unsqueeze(-1) + r * W0).bitwise_and_(_MASK)
    keys1 = (k1.unsqueeze(-1) + r * W1).bitwise_and_(_MASK)
    for r in range(rounds):
        ka, kb = keys0[..., r], keys1[..., r]
        torch.mul(c0, M0, out=p0)
        torch.mul(c2, M1, out=p1)
        # (c0, c1, c2, c3) <- (hi(p1) ^ c1 ^ ka, lo(p1), hi(p0) ^ c3 ^ kb, lo(p0))
        c1.bitwise_xor_(ka).bitwise_xor_(p1 >> 32).bitwise_and_(_MASK)
        c3.bitwise_xor_(kb).bitwise_xor_(p0 >> 32).bitwise_and_(_MASK)
        c0, c1, c2, c3, p0, p1 = c1, p1, c3, p0, c0, c2
    return c0, c1.bitwise_and_(_MASK), c2, c3.bitwise_and_(_MASK)


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
        out.append((s & _MASK, s >> 32))
    return torch.tensor(out, dtype=torch.int64, device=device).view(-1, 2)


def _words(k0, k1, c1, c2, blocks: int):
    """The words of ``blocks`` counter blocks (index, c1, c2, 0) under keys (k0, k1), all
    (K, 1, 1) or (1, S, 1): (K, S, 4 * blocks) int64."""
    c0 = torch.arange(blocks, dtype=torch.int64, device=k0.device)
    return torch.stack(philox4x32(c0, c1, c2, torch.zeros_like(c2), k0, k1), -1).flatten(-2)


def _normals(k0, k1, c1, c2, blocks: int):
    """Box-Muller normals of the words of :func:`_words`, (K, S, 4 * blocks) float32."""
    c0 = torch.arange(blocks, dtype=torch.int64, device=k0.device)
    w = philox4x32(c0, c1, c2, torch.zeros_like(c2), k0, k1)
    return _box_muller(torch.stack((w[0], w[2]), -1), torch.stack((w[1], w[3]), -1))


def _box_muller(a, b):
    """The normals (..., 4 * blocks) float32 of each block's word pairs (0, 1) and (2, 3):
    ``a`` the pairs' first words, ``b`` their second, (..., blocks, 2) int64 each. The
    transform is in float64, so that a device's own float64 rounding rarely shows in the
    float32 result; its float64 temporaries are contiguous whatever the words' strides
    (the same kernels on every CPU path: the CPU's normals are the same bits). The products
    are contiguous float64 too, each rounded to float32 by one copy (a product written
    straight into the float32 output's strided halves is several times slower on the CPU)."""
    r = a.double().add_(1).mul_(2.0 ** -32).log_().mul_(-2).sqrt_()
    theta = b.double().mul_(2 * math.pi * 2.0 ** -32)
    out = torch.empty(*r.shape, 2, dtype=torch.float32, device=r.device)
    out[..., 0] = torch.cos(theta).mul_(r)
    out[..., 1] = theta.sin_().mul_(r)
    return out.flatten(-3)


def _cpu_bulk(key: torch.Tensor, steps: list[int], stream: int, blocks: int,
              normal: bool) -> torch.Tensor:
    """The words of :func:`_words` on the CPU, (K, S, 4 * blocks) int64, or with ``normal``
    their normals (:func:`_box_muller`, float32), from randomgen's Philox-4x32-10 in C: a
    generator whose state (key; counter) is set to each run's key and to the counter block
    before (0, step, stream, 0), as its counter is incremented before each block.

    The (run, step) draws are shared among ``torch.get_num_threads()`` threads (randomgen
    and torch release the GIL), each a generator of its own; a draw comes in pieces of
    :data:`_PIECE` blocks, each turned into normals at once (the transform is elementwise:
    the same bits as on the whole draw)."""
    from concurrent.futures import ThreadPoolExecutor

    from randomgen import Philox

    out = torch.empty((len(key), len(steps), 4 * blocks),
                      dtype=torch.float32 if normal else torch.int64)
    counters = []
    for t in steps:
        c = ((stream << 64) | (t << 32)) - 1 & (1 << 128) - 1
        counters.append(np.array([c >> s & _MASK for s in (0, 32, 64, 96)], dtype=np.uint32))
    run_keys = [np.array(k, dtype=np.uint32) for k in key.tolist()]
    tasks = [(k, s) for k in range(len(run_keys)) for s in range(len(counters))]

    def work(share: list[tuple[int, int]]) -> None:
        bg = Philox(key=0, number=4, width=32)
        state = bg.state
        state.update(buffer_pos=4, has_uint32=0)  # the buffer spent: a word opens a block
        for k, s in share:
            state["state"] = {"counter": counters[s], "key": run_keys[k]}
            bg.state = state
            for lo in range(0, blocks, _PIECE):
                n = min(_PIECE, blocks - lo)
                words = torch.from_numpy(bg.random_raw(4 * n).view(np.int64))
                if normal:
                    pairs = words.view(n, 2, 2)
                    out[k, s, 4 * lo:4 * (lo + n)] = _box_muller(pairs[..., 0], pairs[..., 1])
                else:
                    out[k, s, 4 * lo:4 * (lo + n)] = words

    threads = min(torch.get_num_threads(), len(tasks))
    if threads <= 1:
        work(tasks)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(work, [tasks[i::threads] for i in range(threads)]))
    return out


_FUSED: dict = {}
_lock = threading.Lock()


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
    if not fused and dev.type == "cpu" and blocks >= CPU_BULK_BLOCKS:
        out = _cpu_bulk(key, c1.view(-1).tolist(), stream, blocks, kind == "normal")
    else:
        # contiguous copies: the layout the compiled kernels were checked on (a strided
        # column would compile them again on the first draw); a copy for every K, so that
        # the operations of a draw do not depend on the runs
        k0, k1 = (key[:, i].clone(memory_format=torch.contiguous_format).view(-1, 1, 1)
                  for i in (0, 1))
        fn = _normals if kind == "normal" else _words
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
