"""Gradient canaries for white-box one-run audits: Dirac canaries, the canaries a training
call inserts, their scores, and the trainer's per-step canary work.

The trainer's ``canaries=`` (:class:`GradientCanaries`) inserts m fixed vectors g_j of norm
exactly C into the update: canary j is part of model k's run iff ``included[k, j]`` (drawn
by the caller, typically a fair coin: Steinke, Nasr & Jagielski 2023, "Privacy Auditing with
One (1) Training Run"), and each included canary is sampled as the trainer's sampling treats
an example: with Poisson sampling independently at every step with rate q (the data's B/n,
the subsampling the accountants assume, or a given rate); with shuffled batches ("shuffle",
"shuffle-once") in exactly one step per epoch, that of a uniformly random position in [0, n)
of the permutation (its batch, so a step with probability its batch size over n), a fresh
position each epoch ("shuffle") or one for all epochs ("shuffle-once"); its vector then
added to the clipped gradient sum exactly as a clipped example's gradient would be (before
the noise, before the division by B). Such gradient canaries (Nasr, Hayes, Steinke, Balle,
Tramèr, Jagielski, Carlini & Terzis 2023, "Tight Auditing of Differentially Private Machine
Learning"), in particular Dirac canaries (one coordinate set to C, :func:`dirac_canaries`),
are the worst-case insertion DP-SGD's guarantee covers, so the audit measures the mechanism
rather than how well an input example can be made to stand out. The trainer returns the
summed scores sum_t <theta_t - theta_{t+1}, g_j> (float64, higher = "in"), which telescope
to the last-iterate score <theta_0 - theta_T, g_j> (:func:`last_iterate_scores`, via
:func:`flatten`), and, with noise, the all-iterates test :attr:`CanaryRun.llr`: per step the
likelihood ratio of "sampled at rate q" against "absent", which only an auditor who sees
every iterate can compute; under shuffling the likelihood ratio of "in the step of a
random position" against "absent", per epoch ("shuffle") or over the whole run
("shuffle-once", the same step every epoch).

Crafted batch mates (``mates``): Chua, Ghazi, Kamath, Kumar, Manurangsi, Sinha and Zhang's
worst case for shuffled batches ("How Private are DP-SGD Implementations?", 2024) is a data
set whose every other example has the gradient -g_j along the canary, so that the canary's
batch is visible by who else is in it: a fixed-size batch holding the canary's empty slot
(the zero-out neighbour's ghost) lacks one mate, which Poisson sampling's random batch sizes
hide. With ``mates`` set, every row sampled into a step adds ``mates * g_j`` to the clipped
sum along canary j (the data's own gradients there are unchanged: on a quiet coordinate,
none), and under shuffling the canary's slot takes one mate's place in its step, on both
sides of the audit. DP-SGD's guarantee holds for every data set, this one included; for
Poisson sampling the pair is still dominated by the add/remove pair the accountant uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from . import philox
from ..device import resolve
from .model import Params, noise_views, layer_tensors, flatten
from .spec import ModelSpec


def last_iterate_scores(theta0: Params, thetaT: Params, directions: torch.Tensor) -> torch.Tensor:
    """Last-iterate canary scores <theta_0 - theta_T, g_j>, (K, m) float64 (higher = "in").

    ``theta0`` of K models or of one (the shared "fixed" init), ``thetaT`` of K models,
    ``directions`` (m, P) as in :class:`GradientCanaries`. For the "glorot" init, theta_0 of
    the models trained with ``seeds`` is ``init_params(model, K, seeds, cfg.init_scale)``
    (on any device: the draws do not depend on it; mixing devices here raises torch's
    device error).
    """
    step = flatten(theta0).double() - flatten(thetaT).double()
    return step @ directions.to(step.device, torch.float64).T


def dirac_canaries(model: ModelSpec, m: int, clip: float, seed, candidates=None, *,
                   dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """m Dirac gradient canaries (m, P): rows C * e_{c_j} at m distinct coordinates c_j.

    The coordinates are drawn uniformly without replacement (``numpy.random.default_rng
    (seed)``) among ``candidates`` (indices into the flattened layout of :func:`flatten`),
    by default the weights of the first layer. Why there: any direction of norm C is a
    valid insertion for DP-SGD's guarantee, but the data's clipped gradients moving the
    canary's coordinate add to the score's noise. A first-layer weight W_0[i, h] receives
    x_i g_h from each example, small where the input feature i is mostly zero (the border
    pixels of FMNIST), whereas the biases and the head receive a term from every example.
    The first layer also holds nearly all parameters (25,088 of 25,186 for 784 -> 32 -> 2),
    so m ~ 1000 distinct coordinates are easily found, and distinct coordinates make the
    canaries orthogonal: one canary's insertions do not enter another's score (only through
    the training dynamics). Weights of an input feature that is 0 on every training example
    get no data gradient and do not affect the forward pass at all; with those as
    ``candidates`` (rows i of W_0: coordinates i * fan_out + h) the score is exactly
    lr / B * (C^2 * #sampled steps + C * noise), the Gaussian mechanism of the analysis.
    """
    P = model.n_params
    if candidates is None:
        candidates = np.arange(model.shapes[0][0] * model.shapes[0][1])
    candidates = np.unique(np.asarray(candidates, dtype=np.int64))
    if candidates.size == 0 or candidates[0] < 0 or candidates[-1] >= P:
        raise ValueError(f"dirac_canaries: candidates must be indices in [0, {P})")
    if isinstance(m, bool) or int(m) != m or not 1 <= m <= candidates.size:
        raise ValueError(f"dirac_canaries: m={m} must be an integer in [1, {candidates.size}] "
                         f"(the number of candidate coordinates)")
    if not clip > 0:
        raise ValueError(f"dirac_canaries: clip={clip} must be > 0")
    coords = np.random.default_rng(seed).choice(candidates, int(m), replace=False)
    directions = torch.zeros(int(m), P, dtype=dtype, device=resolve(device))
    directions[torch.arange(int(m), device=directions.device),
               torch.as_tensor(coords, device=directions.device)] = clip
    return directions


@dataclass(frozen=True)
class GradientCanaries:
    """m gradient canaries for a white-box one-run audit (see the module docstring).

    directions: (m, P) float, row j the canary's vector g_j in the layout of :func:`flatten`;
    every row must have L2 norm ``cfg.clip`` (within 1e-5 relative), the most one clipped
    example can contribute. included: (K, m) bool, canary j is inserted into model k's run
    (the k-th seed of the trainer) iff included[k, j]. rate: the probability with which an
    included canary is added at each step, independently across steps, canaries and models;
    None = as the trainer's sampling treats an example (module docstring): the data's rate q
    = batch_size / n with Poisson sampling, once per epoch with shuffled batches. The
    sampling draws come from each model's own canary stream and do not depend on
    ``included`` (a run with a canary in and one with it out are paired: word j of step t
    below rate 2^32 decides at every step; with shuffled batches, sort key j of epoch e
    modulo n is the position, epoch 0's for "shuffle-once").
    mates: every row sampled into a step also adds ``mates * g_j`` (in [-1, 1]: a clipped
    example's component along g_j; Chua et al.'s worst case is -1), the canary's slot
    under shuffling taking one mate's place (module docstring); 0 = none.
    Extra memory: the directions on the device, and a step's (K, m) draws.

    ``insertions``: what every training call that took this object inserted, one
    :class:`Insertions` per call (:meth:`record`), so that an auditor can see that the
    canaries went in (and as often as the draws at their rate make likely) rather than
    trust scores alone.
    """

    directions: torch.Tensor
    included: torch.Tensor
    rate: float | None = None
    mates: float = 0.0
    insertions: list = field(default_factory=list, init=False, repr=False, compare=False)

    def __post_init__(self):
        d, inc, rate = self.directions, self.included, self.rate
        if not isinstance(d, torch.Tensor) or d.dim() != 2 or d.shape[0] < 1 \
                or not d.is_floating_point():
            got = tuple(d.shape) if isinstance(d, torch.Tensor) else type(d).__name__
            raise ValueError(f"canaries.directions: must be a floating (m, P) tensor with "
                             f"m >= 1; got {got}")
        if not isinstance(inc, torch.Tensor) or inc.dtype != torch.bool or inc.dim() != 2 \
                or inc.shape[1] != d.shape[0]:
            got = (f"{inc.dtype} {tuple(inc.shape)}" if isinstance(inc, torch.Tensor)
                   else type(inc).__name__)
            raise ValueError(f"canaries.included: must be a bool (K, m={d.shape[0]}) tensor; "
                             f"got {got}")
        try:
            ok = rate is None or (not isinstance(rate, bool) and 0 < float(rate) <= 1)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ValueError(f"canaries.rate={rate!r}: must be in (0, 1] (or None: the data's "
                             f"rate batch_size / n)")
        mates = self.mates
        if isinstance(mates, bool) or not isinstance(mates, (int, float)) \
                or not -1 <= mates <= 1:
            raise ValueError(f"canaries.mates={mates!r}: must be a number in [-1, 1] (each "
                             f"batch mate's gradient along the canary, in units of it)")

    def record(self, steps: int, rate: float, counts: torch.Tensor) -> None:
        """Note a training call's insertions: ``steps`` steps at sampling ``rate``, canary j
        added ``counts[k, j]`` times to model k's run (dpaudit's trainer calls it; another
        trainer that takes ``canaries=`` must too)."""
        self.insertions.append(Insertions(int(steps), float(rate),
                                          torch.as_tensor(counts).to("cpu", torch.int64)))

    def check(self, model: ModelSpec, clip: float, K: int) -> None:
        """Shapes against the model and the K trained models; norms equal to ``clip``."""
        m, P = self.directions.shape
        if P != model.n_params:
            raise ValueError(f"canaries.directions: {P} columns, but the model has "
                             f"P={model.n_params} parameters")
        if self.included.shape[0] != K:
            raise ValueError(f"canaries.included: {self.included.shape[0]} rows for K={K} models")
        # In the directions' dtype: float32 rounding (< 1e-6 relative) is far below 1e-5.
        norms = torch.linalg.vector_norm(self.directions, dim=1).double()
        bad = ~((norms - clip).abs() <= 1e-5 * clip)  # also catches nan/inf
        if bad.any():
            j = int(bad.nonzero()[0])
            raise ValueError(f"canaries.directions: every row must have L2 norm "
                             f"DPSGDConfig.clip={clip} (within 1e-5 relative); {int(bad.sum())} "
                             f"of {m} do not, e.g. row {j}: {float(norms[j])}")


class Insertions(NamedTuple):
    """One training call's insertions of :class:`GradientCanaries` (:meth:`~GradientCanaries.
    record`): ``counts`` (K, m) int64, how many of the ``steps`` steps added canary j to model
    k (each one with probability ``rate`` where included, never where not)."""

    steps: int
    rate: float
    counts: torch.Tensor


class CanaryRun(NamedTuple):
    """What the trainer returns with ``canaries=``: the trained Params; ``scores`` (K, m)
    float64, sum_t <theta_t - theta_{t+1}, g_j> (higher = "in"), which telescopes to the
    last-iterate score; and ``llr`` (K, m), the all-iterates test: the sum over steps of the
    log likelihood ratio log(1 - q + q exp(mu z_t - mu^2 / 2)) of "canary j sampled at rate
    q" against "absent", with z_t = <theta_t - theta_{t+1}, g_j> / (lr / B * noise_std * C)
    and mu = C / noise_std (the data's gradients ignored): an auditor who sees every
    iterate weighs each step by how likely it holds the canary, which a sum of inner
    products cannot. With shuffled batches, a_t = mu z_t - mu^2 / 2 and w_s = (size of
    batch s) / n: the sum over epochs of log sum_s w_s exp(a_{e,s}) ("shuffle"), or log
    sum_s w_s exp(sum_e a_{e,s}) ("shuffle-once"). With batch mates (``mates`` = m), z_t
    less its mates' expected part; shuffled, the ratio of the canary's step at mean mu (1 -
    m) against its empty slot at mean -mu m (each a sum over s as above), Chua et al.'s
    pair; Poisson, the formula above, the batch's random size left as noise. None without
    noise (where it is undefined)."""

    params: Params
    scores: torch.Tensor
    llr: torch.Tensor | None = None


class CanaryScores:
    """The scores of :class:`CanaryRun` (its docstring defines them), summed step by step
    from each step's inner products <theta_t - theta_{t+1}, g_j>: dpaudit's trainer keeps
    them, and another trainer that takes ``canaries=`` (e.g. :mod:`dpaudit.adapters.opacus`)
    keeps them with the same definitions.

    K runs of m canaries, the scores on ``device``; the update theta -= ``step_size`` * (clipped sum +
    noise of std ``noise_std``), the canaries' norm ``clip``; insertion at ``rate`` per step
    (Poisson), or ``shuffle`` = (sampling, n, batch_size): once per epoch at a random
    position of the permutation (:attr:`rate` then the mean rate per step, 1 / steps per
    epoch); ``mates``: :attr:`GradientCanaries.mates`; ``expected_size``: a Poisson
    batch's expected size, whose mates' part is taken off z_t."""

    def __init__(self, K: int, m: int, *, rate: float | None, step_size: float,
                 noise_std: float, clip: float, shuffle: tuple[str, int, int] | None = None,
                 mates: float = 0.0, expected_size: float = 0.0, device="cpu"):
        self.shuffle, self.mates = shuffle, float(mates)
        self.scores = torch.zeros(K, m, device=device, dtype=torch.float64)
        if shuffle is not None:
            _, n, B = shuffle
            self.n, self.B, self.spe = n, B, -(-n // B)
            # log P(the canary's step is s): batch s's share of the n positions
            self.sizes = [min(B, n - s * B) for s in range(self.spe)]
            self.log_w = torch.tensor([math.log(b / n) for b in self.sizes], device=device,
                                      dtype=torch.float64)
            self.rate = 1.0 / self.spe  # the mean rate per step (recorded): once an epoch
        else:
            self.rate = float(rate)
        # Per-step likelihood ratio: z = <step, g> / (step_size noise_std C) is N(0, 1) from
        # the noise plus mu = C / noise_std when the canary was added (data ignored), plus
        # mu * mates per batch mate.
        self.noisy = noise_std > 0
        self._llr = torch.zeros(K, m, device=device, dtype=torch.float64) if self.noisy else None
        if self.noisy:
            self.z_scale = 1.0 / (step_size * noise_std * clip)
            self.mu = clip / noise_std
            if shuffle is None:
                self.log_out = math.log1p(-self.rate) if self.rate < 1 else -math.inf
                self.log_in = math.log(self.rate) - self.mu ** 2 / 2
                self.offset = self.mu * self.mates * expected_size
            else:
                # The canary's step has mean b_in, its empty slot's b_out (module docstring).
                self.b = (self.mu * (1 - self.mates), -self.mu * self.mates)
                self.sides = 2 if self.mates else 1  # b_out = 0: its sum is log 1 = 0
                if shuffle[0] == "shuffle":  # this epoch's log sum_s w_s exp(a_s), per side
                    self.epoch_lr = torch.full((self.sides, K, m), -math.inf, device=device,
                                               dtype=torch.float64)
                else:  # sum_e a_{e,s} per step s of the epoch, per side
                    self.slot_sum = torch.zeros(self.sides, K, m, self.spe, device=device,
                                                dtype=torch.float64)

    def add(self, step: torch.Tensor, t: int) -> None:
        """Step ``t``'s inner products (K, m) float64, consumed (changed in place)."""
        self.scores.add_(step)
        if not self.noisy:
            return
        z = step.mul_(self.z_scale)
        if self.shuffle is None:  # log(1 - q + q exp(mu z - mu^2 / 2)) per step
            z.sub_(self.offset)
            self._llr.add_(torch.logaddexp(torch.full_like(z, self.log_out),
                                           z.mul_(self.mu).add_(self.log_in)))
            return
        s = t % self.spe
        z.sub_(self.mu * self.mates * self.sizes[s])  # the mates' part: fixed-size batches
        # b z - b^2 / 2 per side: the canary's step, and its empty slot's
        a = torch.stack([z * b - b * b / 2 for b in self.b[:self.sides]])
        if self.shuffle[0] == "shuffle":
            self.epoch_lr = torch.logaddexp(self.epoch_lr, a + self.log_w[s])
            if s == self.spe - 1:
                self._llr.add_(self.epoch_lr[0])
                if self.sides == 2:
                    self._llr.sub_(self.epoch_lr[1])
                self.epoch_lr.fill_(-math.inf)
        else:
            self.slot_sum[..., s].add_(a)

    @property
    def llr(self) -> torch.Tensor | None:
        """The all-iterates log likelihood ratio so far (after whole epochs when shuffled);
        None without noise."""
        if self._llr is None or self.shuffle is None or self.shuffle[0] == "shuffle":
            return self._llr
        per_side = torch.logsumexp(self.slot_sum + self.log_w, dim=-1)
        return per_side[0] - per_side[1] if self.sides == 2 else per_side[0]


class _Coordinates:
    """Coordinates of the flattened layout (:func:`flatten`), read and changed in the layer
    tensors themselves: a Dirac canary reads and moves m entries, not every weight (the
    same arithmetic on them, so the same bits)."""

    def __init__(self, coords: torch.Tensor, params: Params):
        tensors = layer_tensors(params)
        self.unique, self.inverse = coords.unique(return_inverse=True)
        ends = torch.tensor([t[0].numel() for t in tensors], device=coords.device).cumsum(0)
        layer = torch.searchsorted(ends, self.unique, right=True)
        self.parts = []
        for l in layer.unique().tolist():
            cols = torch.nonzero(layer == l)[:, 0]
            local = self.unique[cols] - (ends[l - 1] if l else 0)
            index = (slice(None),) + torch.unravel_index(local, tensors[l].shape[1:])
            self.parts.append((l, cols, index))

    def read(self, params: Params) -> torch.Tensor:
        """The coordinates' values (K, m) float64."""
        tensors = layer_tensors(params)
        out = torch.empty(tensors[0].shape[0], len(self.unique), device=tensors[0].device,
                          dtype=torch.float64)
        for l, cols, index in self.parts:
            out[:, cols] = tensors[l][index].double()
        return out[:, self.inverse]

    def sub(self, params: Params, values: torch.Tensor, alpha: float) -> None:
        """theta -= alpha * (values (K, m) summed per coordinate), as a sub_ of a (K, P)
        tensor zero but at the coordinates does it."""
        tensors = layer_tensors(params)
        at = values.new_zeros(len(values), len(self.unique)).index_add_(1, self.inverse, values)
        for l, cols, index in self.parts:
            tensors[l][index] = tensors[l][index].sub_(at[:, cols], alpha=alpha)


class CanaryHook:
    """The trainer's canary work: per step one draw for all models, the sampled sum
    (K, m) x (m, P) added to the update, and the score update (K, P) x (P, m) of the step
    (:class:`CanaryScores`). Dirac canaries (one nonzero per row) take an index_add and a
    gather instead."""

    def __init__(self, canaries: GradientCanaries, rate: float | None, key: torch.Tensor,
                 params: Params, dev, dtype, step_size: float, noise_std: float, clip: float,
                 fused: bool = False, shuffle: tuple[str, int, int] | None = None,
                 expected_size: float = 0.0):
        """``rate``: Poisson insertion at that rate per step; None with ``shuffle`` =
        (sampling, n, batch_size): once per epoch at a random position of the permutation.
        ``expected_size``: a Poisson batch's expected size, where batch mates' expected part
        is taken off the likelihood ratio's z_t."""
        d = canaries.directions.to(dev)
        K, (m, P) = params.K, d.shape
        self.K, self.m, self.key, self.dtype = K, m, key, dtype
        self.fused = fused
        self.included = canaries.included.to(dev)
        self.counts = torch.zeros(K, m, device=dev, dtype=torch.int64)  # insertions so far
        self.shuffle, self.t, self.mates = shuffle, 0, float(canaries.mates)
        self.of = CanaryScores(K, m, rate=rate, step_size=step_size, noise_std=noise_std,
                               clip=clip, shuffle=shuffle, mates=self.mates,
                               expected_size=expected_size, device=dev)
        self.rate = self.of.rate
        if shuffle is not None:
            self.n, self.B, self.spe = self.of.n, self.of.B, self.of.spe
        if bool((torch.linalg.vector_norm(d, 0, dim=1) == 1).all()):  # nonzeros per row
            self.coords = torch.nonzero(d)[:, 1]  # row-major: row j's coordinate is entry j
            self.values = d[torch.arange(m, device=dev), self.coords].double()
            self.values_dt = self.values.to(dtype)
            self.dirs = None
            self.at = _Coordinates(self.coords, params)
            self.prev = self.at.read(params)  # (K, m)
        else:
            self.dirs = d.to(dtype)
            self.csum = torch.empty(K, P, device=dev, dtype=dtype)
            self.flat = flatten(params)
            self.prev, self.step = self.flat.clone(), torch.empty_like(self.flat)

    def add(self, params: Params, t: int, step_size: float,
            sizes: torch.Tensor | None = None) -> None:
        """theta -= step_size * (sum of the included canaries sampled at step t, and of the
        batch mates: ``sizes`` (K,), the rows in each model's batch, needed with mates)."""
        self.t = t
        if self.shuffle is None:
            hit = philox.draw("bernoulli", self.key, philox.CANARY, t, self.m, self.rate,
                              fused=self.fused)
            slot = None
        else:
            epoch, s = divmod(t, self.spe)
            if s == 0 and (epoch == 0 or self.shuffle[0] == "shuffle"):
                # A uniform position in [0, n) (bias below n 2^-63), its batch the step.
                pos = philox.draw("sort_keys", self.key, philox.CANARY, epoch, self.m,
                                  fused=self.fused) % self.n
                self.slot = pos // self.B  # (K, m)
            hit = slot = self.slot == s
        hit = hit.logical_and(self.included)  # (K, m)
        self.counts.add_(hit)
        hit = hit.to(self.dtype)
        if self.mates:  # every row of the batch a mate, but the one the canary's slot takes
            mates = sizes.to(self.dtype).view(-1, 1).expand(self.K, self.m)
            hit = hit.add(mates if slot is None else mates - slot.to(self.dtype),
                          alpha=self.mates)
        if self.dirs is None:
            self.at.sub(params, hit.mul_(self.values_dt), step_size)
            return
        torch.matmul(hit, self.dirs, out=self.csum)
        for param, c in zip(layer_tensors(params), noise_views(self.csum, params)):
            param.sub_(c, alpha=step_size)

    def observe(self, params: Params) -> None:
        """scores += <theta_t - theta_{t+1}, g_j>, after the step to theta_{t+1}."""
        if self.dirs is None:
            new = self.at.read(params)
            step = (self.prev - new).mul_(self.values)
            self.prev = new
        else:
            torch.cat([t.reshape(self.K, -1) for t in layer_tensors(params)], dim=1,
                      out=self.flat)
            torch.sub(self.prev, self.flat, out=self.step)
            step = (self.step @ self.dirs.T).double()
            self.prev, self.flat = self.flat, self.prev
        self.of.add(step, self.t)

    @property
    def scores(self) -> torch.Tensor:
        """The summed scores so far (K, m) float64."""
        return self.of.scores

    @property
    def llr(self) -> torch.Tensor | None:
        """The all-iterates log likelihood ratio so far (:attr:`CanaryScores.llr`)."""
        return self.of.llr
