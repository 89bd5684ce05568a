"""The trainer's batches: each step's batch of every run ("shuffle", "shuffle-once" or
"poisson" sampling,
drawn from the runs' Philox keys), the steps at which epochs end, and the cost rule that
decides whether a step gathers each run's batch or computes on the data shared by all runs.

Two forms of one batch. "gather": each run's batch as indices into the data (K, b), the
step then copies each run's rows (K x b x d) and works on them. "shared": each run's batch
as 0/1 weights on all n rows (K, n), the step computes every row once for all runs and
columns and multiplies each run's clip factors by its weights, so rows outside a run's
batch add nothing to its update: the same DP-SGD (each run clips its own batch's
gradients and sums them) with no copy of the data, at n / b times the arithmetic.
:func:`shares_data` chooses by the step's cost.
"""

from __future__ import annotations

import math

import torch

from . import philox
from .spec import DPSGDConfig, ModelSpec

#: Floating-point operations one byte of the gather is worth in the cost rule of
#: :func:`shares_data`. Fitted to where the two forms take equally long on 2 CPU cores
#: (logistic regression of two columns, b = 100: at n / b ~ 13; the 784-32-2 net, one
#: column: at n / b ~ 4), and within a factor 2 of a GPU's float32 rate over its memory
#: bandwidth (an H100: ~50 TFLOP/s against ~3 TB/s). Larger than a CPU's ratio: the
#: gathered step's per-run matmuls are narrow, and narrow matmuls run below the rate.
FLOPS_PER_BYTE = 32.0


def epoch_ends(cfg: DPSGDConfig, n: int) -> list[int]:
    """The step counts after which epochs 1, 2, ... end on n examples: multiples of the
    steps per epoch ("shuffle", "shuffle-once"); ``round(e n / B)`` ("poisson", whose epochs are n / B
    steps on average, the last one ``steps(n)`` for whole ``epochs``)."""
    if cfg.shuffled:
        return [e * cfg.steps_per_epoch(n) for e in range(1, int(cfg.epochs) + 1)]
    return [round(e * n / cfg.batch_size) for e in range(1, math.floor(cfg.epochs) + 1)]


def step_flops(model: ModelSpec, columns: int) -> int:
    """Floating-point operations of one example in one step of one seed's ``columns``
    models: each layer's forward product and weight gradient (2 x 2 fan_in fan_out each),
    and the backprop signal into every layer but the first."""
    first = 4 * (model.shapes[0][0] + 1) * model.shapes[0][1]
    rest = sum(6 * (i + 1) * o for i, o in model.shapes[1:])
    return columns * (first + rest)


def shares_data(model: ModelSpec, cfg: DPSGDConfig, n: int, columns: int) -> bool:
    """Whether the step computes on the n rows shared by all runs (weights) rather than on
    each run's gathered batch: when its arithmetic costs less than the gathered step's
    arithmetic plus the gather's bytes (each of the b rows read and written, 8 d bytes),
    at :data:`FLOPS_PER_BYTE`:

        n F  <=  b (F + FLOPS_PER_BYTE 8 d),   F = :func:`step_flops` of the columns,

    b the (expected) batch size. Always for full batches (b = n: no draw, no copy); for
    narrow models with a batch not much smaller than the data (Tramer et al.'s audit: n =
    500, b = 100, logistic regression); never for the Jagielski grids (b = n / 24, 72
    columns of a 2-layer net: the copy is shared by the columns, the arithmetic is not).
    Not a function of K: the runs beside a run never change how it is trained. Its bits
    can change, though: the shared product covers all K runs, and a BLAS blocks (on a GPU,
    picks) its kernel by the product's size, so a run trained beside others is the run
    trained alone to float rounding, not bit for bit (as with Poisson batches padded to a
    step's largest). So such calls keep to whole kept blocks, as Poisson calls do
    (:func:`dpaudit.experiments.jagielski.run_group`)."""
    b = min(cfg.batch_size, n)
    F = step_flops(model, columns)
    return n * F <= b * (F + FLOPS_PER_BYTE * 8 * model.in_dim)


def full_batch(cfg: DPSGDConfig, n: int) -> bool:
    """Every row in every step's batch: shuffled batches of at least n rows (no draw)."""
    return cfg.shuffled and cfg.batch_size >= n


def batch_sizes(index, weights, n: int, K: int, device) -> torch.Tensor:
    """The rows in each of K runs' batches, (K,), from a :meth:`Batches.step`."""
    if weights is not None:
        return weights.sum(1)
    return torch.full((K,), n if index is None else index.shape[1], device=device)


class Batches:
    """Each step's batch of K runs (keys (K, 2) of :func:`dpaudit.dpsgd.philox.keys`), in the
    form :func:`shares_data` chose.

    "shuffle": at the first step of epoch e, each run's permutation of the n rows is the
    argsort of n 63-bit keys of its permutation stream at counter step e; the epoch's batches
    are its consecutive slices of ``batch_size`` rows (the last one smaller if it does not
    divide n). "shuffle-once": epoch 0's permutation, cut the same way in every epoch.
    "poisson": row j is in run k's batch at step t iff word j of its batch
    stream at step t is below q 2^32, q = batch_size / n (a rate within 2^-32 below q).

    :meth:`step` returns ``(index, valid)`` (gather: (K, b) row indices and their 0/1
    weights, None where all count; Poisson batches are padded to the step's largest) or
    ``(None, weights)`` (shared: (K, n) 0/1 weights, None for a full batch).
    """

    def __init__(self, cfg: DPSGDConfig, n: int, key: torch.Tensor, shared: bool,
                 dtype: torch.dtype, fused: bool = False):
        self.cfg, self.n, self.key, self.shared = cfg, n, key, shared
        self.dtype, self.fused = dtype, fused
        self.full = full_batch(cfg, n)  # gathered only where a test compares the two forms
        self.spe = cfg.steps_per_epoch(n)
        self.perm = self.rank = None

    def step(self, t: int):
        if self.full:
            return (None, None) if self.shared else (
                torch.arange(self.n, device=self.key.device).repeat(len(self.key), 1), None)
        if self.cfg.shuffled:
            return self._shuffle(t)
        sel = philox.draw("bernoulli", self.key, philox.BATCH, t, self.n,
                          self.cfg.batch_size / self.n, fused=self.fused)
        if self.shared:
            return None, sel.to(self.dtype)
        # nonzero lists each run's rows in order, runs in order: a row's slot in its
        # run's batch is its place in that list less the run's start (work in the rows
        # sampled, not in all n)
        kk, jj = sel.nonzero(as_tuple=True)
        counts = sel.sum(1)
        width = max(1, int(counts.max()))  # one device sync per step
        pos = torch.arange(len(kk), device=sel.device) - (counts.cumsum(0) - counts)[kk]
        idx = torch.zeros(len(sel), width, dtype=torch.long, device=sel.device)
        idx[kk, pos] = jj
        valid = torch.arange(width, device=sel.device) < counts.unsqueeze(1)
        return idx, valid.to(self.dtype)

    def _shuffle(self, t: int):
        epoch, s = divmod(t, self.spe)
        if self.perm is None or s == 0 and self.cfg.sampling == "shuffle":
            keys = philox.draw("sort_keys", self.key, philox.PERMUTATION,
                               epoch if self.cfg.sampling == "shuffle" else 0, self.n,
                               fused=self.fused)
            self.perm = torch.argsort(keys, dim=1, stable=True)
            if self.shared:  # each row's position in its run's permutation
                self.rank = torch.empty_like(self.perm).scatter_(
                    1, self.perm, torch.arange(self.n, device=self.perm.device)
                    .expand_as(self.perm))
        B = self.cfg.batch_size
        if self.shared:
            return None, ((self.rank >= s * B) & (self.rank < (s + 1) * B)).to(self.dtype)
        return self.perm[:, s * B:(s + 1) * B].clone(), None  # contiguous, whatever K
