"""The trainer's per-model random draws: the batches of each step ("shuffle" or "poisson"
sampling), the steps at which epochs end, and per-model draws in parallel threads."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import torch

from .model import DPSGDConfig


def epoch_ends(cfg: DPSGDConfig, n: int) -> list[int]:
    """The step counts after which epochs 1, 2, ... end on n examples: multiples of the
    steps per epoch ("shuffle"); ``round(e n / B)`` ("poisson", whose epochs are n / B
    steps on average, the last one ``steps(n)`` for whole ``epochs``)."""
    if cfg.sampling == "shuffle":
        return [e * cfg.steps_per_epoch(n) for e in range(1, int(cfg.epochs) + 1)]
    return [round(e * n / cfg.batch_size) for e in range(1, math.floor(cfg.epochs) + 1)]


def _each_model(fill: Callable[[int], object], K: int, dev: torch.device) -> None:
    """``fill(k)`` for every model k; on the CPU in parallel threads, since torch samples
    from one generator on one thread (the noise draws were a quarter of a CPU step). The
    models' generators are independent, so the numbers do not depend on the threading."""
    threads = torch.get_num_threads()
    if dev.type != "cpu" or K == 1 or threads == 1:
        for k in range(K):
            fill(k)
        return
    with ThreadPoolExecutor(min(threads, K)) as pool:
        list(pool.map(fill, range(K)))


def _sample_batches(cfg: DPSGDConfig, n: int, S: int, gens, dev, dtype):
    """Index batches (K, b) of S steps for K = len(gens) models, each with a (K, b) 0/1
    weight mask (None when all entries count).

    "shuffle" (S a multiple of the steps per epoch): each epoch a uniformly random
    permutation per model, the argsort of n i.i.d. uniform keys (float64: ties have
    probability ~n^2 2^-54), cut into consecutive batches.
    "poisson": example j is in model k's batch at step s iff u[k, s, j] < q; the K
    batches of a step are padded to the largest one with entries of weight 0.
    """
    K = len(gens)
    if cfg.sampling == "shuffle":
        spe, B = cfg.steps_per_epoch(n), cfg.batch_size
        keys = torch.empty(K, S // spe, n, device=dev, dtype=torch.float64)
        for k, g in enumerate(gens):
            torch.rand(keys.shape[1:], generator=g, out=keys[k], dtype=torch.float64)
        perm = torch.argsort(keys, dim=-1, stable=True)
        return [(perm[:, e, s * B:(s + 1) * B], None)
                for e in range(S // spe) for s in range(spe)]
    u = torch.empty(K, S, n, device=dev)
    for k, g in enumerate(gens):
        torch.rand(S, n, generator=g, out=u[k])
    sel = u < cfg.batch_size / n
    counts = sel.sum(-1)  # (K, S)
    width = counts.amax(0).clamp_(min=1).tolist()  # one device sync per chunk
    kk, ss, jj = sel.nonzero(as_tuple=True)
    pos = sel.cumsum(-1).sub_(1)[kk, ss, jj]
    idx = torch.zeros(K, S, max(width), dtype=torch.long, device=dev)
    idx[kk, ss, pos] = jj
    valid = torch.arange(max(width), device=dev) < counts.unsqueeze(-1)
    return [(idx[:, s, :w], valid[:, s, :w].to(dtype)) for s, w in enumerate(width)]
