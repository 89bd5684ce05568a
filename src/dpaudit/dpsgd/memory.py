"""Memory sizing of training calls: the bytes one seed adds to a call
(:func:`step_bytes`), how many seeds to train per call (:func:`seeds_per_call`) and per
kept block of a resumable audit (:func:`seeds_per_block`)."""

from __future__ import annotations

import math

from ..device import is_gpu, memory_info, resolve
from .spec import DPSGDConfig, ModelSpec
from .sampling import full_batch, shares_data


def step_bytes(model: ModelSpec, n: int, cfg: DPSGDConfig, columns: int = 1,
               dtype_bytes: int = 4) -> int:
    """Bytes one seed adds to a training call of ``columns`` columns (:func:`_train`): its
    weights (and the layer gradients the step forms), a step's noise draw with the
    temporaries of drawing it unfused (Philox's six int64 counter words per four values,
    then the words, their float64 transform and the result: 24 bytes per parameter), its
    batch draw (Poisson: the words, the mask and, gathered, the indices; shuffle: the
    permutation's keys, its argsort and the rows' ranks), and one step's batch: the
    gathered rows with every column's activations, backprop signals and their
    temporaries, or every row's activations and weights when the data are shared
    (:func:`dpaudit.dpsgd.sampling.shares_data`; the data themselves count once per call)."""
    B, P = cfg.batch_size, model.n_params
    shared = shares_data(model, cfg, n, columns)
    if full_batch(cfg, n):
        draws = 0
    elif cfg.shuffled:
        draws = 56 * n
    else:
        draws = 21 * n + (0 if shared else 24 * n)
    outs = sum(o for _, o in model.shapes)
    noise = 24 * P
    weights = dtype_bytes * 2 * columns * P
    if shared:
        step = n * dtype_bytes * (1 + 6 * columns * outs)
    else:
        width = B if cfg.shuffled else B + 6 * math.isqrt(B) + 6
        step = width * (8 + dtype_bytes * (model.in_dim + 6 * columns * outs))
    return noise + draws + weights + step


def seeds_per_call(model: ModelSpec, n: int, cfg: DPSGDConfig, columns: int = 1,
                   device=None, limit: int = 4096, jobs_per_gpu: int = 1) -> int:
    """How many seeds to train per :func:`train` call of ``columns`` columns, at most
    ``limit`` (e.g. the trials left to train on one data set).

    CPU: enough that K x columns >= 128 models (batching amortises the per-step overhead:
    a grid of 6 or 72 columns trains as fast at any K, benchmarks/bench_dpsgd.py, but the
    one column of a tight white-box audit trains 2.2 times as fast at K = 128 as at 32,
    benchmarks/bench_tight_whitebox.py). CUDA: as many as fit, by :func:`step_bytes`, in this job's
    share of half the card's memory, the card being shared by ``jobs_per_gpu`` training
    jobs (the workflow's ``jobs_per_gpu``), and never more than 90% of what is free now
    (:func:`dpaudit.device.memory_info`: a forced GPU description's on the CPU).
    """
    if isinstance(jobs_per_gpu, bool) or int(jobs_per_gpu) != jobs_per_gpu or jobs_per_gpu < 1:
        raise ValueError(f"jobs_per_gpu={jobs_per_gpu!r}: must be an integer >= 1")
    dev = resolve(device)
    if not is_gpu(dev):
        return _cpu_seeds(columns, limit)
    free, total = memory_info(dev)
    per_seed = step_bytes(model, n, cfg, columns)
    budget = min(total // (2 * int(jobs_per_gpu)), int(0.9 * free))
    return int(max(1, min(limit, budget // per_seed)))


#: Seeds per kept block on CUDA (:func:`seeds_per_block`).
GPU_BLOCK = 1024


def _cpu_seeds(columns: int, limit: int) -> int:
    return max(1, min(limit, math.ceil(128 / columns)))


def seeds_per_block(columns: int = 1, device=None, limit: int = 4096) -> int:
    """How many seeds a resumable audit keeps per block (:func:`dpaudit.trials.run`), at
    most ``limit``: the layout of what it keeps, so it may not depend on the memory free at
    the time (a rerun with another layout could restore nothing). CPU: one call's worth,
    as :func:`seeds_per_call` (which there depends on ``columns`` only); CUDA:
    :data:`GPU_BLOCK`, each block trained in as few calls as the memory holds."""
    if not is_gpu(resolve(device)):
        return _cpu_seeds(columns, limit)
    return max(1, min(limit, GPU_BLOCK))
