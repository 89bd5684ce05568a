"""How many runs per side would catch a bug, before they are spent: the power of audit-impl's
test on the ideal scores of the DP-SGD canary pair, by simulation.

The white-box audit of DP-SGD with a Dirac gradient canary of norm C sees, at each of the
T steps, the canary's coordinate of the noisy clipped sum (in units of C): ``N(b_t,
sigma^2)``, with ``b_t`` drawn Bernoulli(q) on the runs with the canary and 0 on those
without. The sum of the per-step log likelihood ratios ``log(1 - q + q exp((2 x - 1) /
(2 sigma^2)))`` is the most powerful score (Neyman-Pearson), and the pair is the dominating
pair of the Poisson subsampled Gaussian, so its epsilon at the claimed noise is the
claim (PLD accounting). A bug of ``factor`` times the claim is DP-SGD at the noise
multiplier whose PLD epsilon is ``factor * eps``. No attack does better than these scores:
for a black-box audit the count is optimistic (a lower bound on the runs it needs).

The score's distribution on both sides is computed on a grid (:func:`poisson_pair`: each
step's LLR rounded down to the grid, a post-processing of what the step shows, so a valid
and barely weaker score; T-fold FFT convolution). Each replication draws its validation
runs from it and takes audit-impl's threshold on them
(:func:`dpaudit.experiments.tramer.statistics.choose_threshold`); its evaluation counts
are binomial at that threshold's exact exceedance probabilities, so a run count costs no
score draws. The power at ``n`` runs per side is the fraction of replications whose
Clopper-Pearson eps_LB exceeds the claim.

Chua et al.'s shuffled pair (:func:`shuffle_pair_llr`, docs/shuffle.md) is simulated here
too, run by run: the shuffle audit's all-iterates score with crafted batch mates is its
log likelihood ratio.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy.special import logsumexp, ndtr

from .. import accounting, bounds, seeds


@dataclass(frozen=True)
class ScoreGrid:
    """A score's distribution on both sides, on the ascending grid ``values``."""

    values: np.ndarray
    pmf_in: np.ndarray
    pmf_out: np.ndarray

    def draw(self, rng: np.random.Generator, size, inside: bool) -> np.ndarray:
        """``size`` scores of runs with (``inside``) or without the canary, in ascending
        order (the threshold choice does not depend on it)."""
        pmf = self.pmf_in if inside else self.pmf_out
        return np.repeat(self.values, rng.multinomial(size, pmf / pmf.sum()))  # ascending

    def sf(self, thresholds, inside: bool) -> np.ndarray:
        """P[score > threshold] on the side, for each threshold (tail sums, so accurate
        far out)."""
        pmf = self.pmf_in if inside else self.pmf_out
        tail = np.append(np.cumsum(pmf[::-1])[::-1], 0.0)
        i = np.searchsorted(self.values, np.asarray(thresholds, float), side="right")
        return np.clip(tail[i], 0.0, 1.0)

    def coarse(self, levels: int) -> "ScoreGrid":
        """The score rounded down to ``levels`` equal steps over the range where either
        side has mass above 1e-18 of its largest (a post-processing: a valid, barely
        weaker score with few distinct values, so the threshold choice stays cheap)."""
        big = np.flatnonzero((self.pmf_in > 1e-18 * self.pmf_in.max())
                             | (self.pmf_out > 1e-18 * self.pmf_out.max()))
        edges = np.linspace(self.values[big[0]], self.values[big[-1]], levels + 1)[1:-1]
        cell = np.searchsorted(edges, self.values, side="right")
        sums = lambda pmf: np.bincount(cell, pmf, levels)  # noqa: E731
        return ScoreGrid(np.concatenate([[self.values[0]], edges]), sums(self.pmf_in),
                         sums(self.pmf_out))

    def epsilon(self, delta: float) -> float:
        """The epsilon of the pair at ``delta`` (remove direction: ``sum (p_in - e^eps
        p_out)_+``, the side the claim's accountant takes for this pair), by bisection;
        inf beyond 500."""
        gap = lambda e: np.maximum(self.pmf_in - math.exp(e) * self.pmf_out, 0).sum() - delta  # noqa: E731
        lo, hi = 0.0, 1.0
        if gap(lo) <= 0:
            return 0.0
        while gap(hi) > 0:
            if hi > 500:  # mass with none on the other side
                return math.inf
            lo, hi = hi, 2 * hi
        while hi - lo > 1e-6:
            lo, hi = ((lo + hi) / 2, hi) if gap((lo + hi) / 2) > 0 else (lo, (lo + hi) / 2)
        return hi


#: Grid points of the total score (a power of two, for the FFT): each step's LLR gets
#: ``GRID // steps`` of them (at least :data:`MIN_BINS`).
GRID = 2 ** 21
MIN_BINS = 64


def poisson_pair(sigma: float, q: float, steps: int, grid: int = GRID) -> ScoreGrid:
    """The all-iterates LLR score of the Dirac canary pair of DP-SGD (module docstring) at
    noise multiplier ``sigma``, rate ``q`` and ``steps`` steps, on both sides. Each step's
    observation x is cut at ``-10 sigma`` and ``1 + 10 sigma`` (beyond: below 1e-23 of
    either side's mass, kept in the end bins); its LLR is rounded down to a grid of
    ``grid // steps`` points (masses from normal tails, so the upper tail is accurate) and
    the T steps are composed by one FFT."""
    if not (sigma > 0 and 0 < q <= 1 and steps >= 1):
        raise ValueError(f"sigma={sigma!r}, q={q!r}, steps={steps!r}: need sigma > 0, "
                         "0 < q <= 1, steps >= 1")
    s2 = sigma * sigma
    with np.errstate(divide="ignore"):
        log_stay = math.log1p(-q) if q < 1 else -math.inf
    llr = lambda x: np.logaddexp(log_stay, math.log(q) + (2 * x - 1) / (2 * s2))  # noqa: E731
    bins = max(grid // steps, MIN_BINS)
    low, high = float(llr(-10 * sigma)), float(llr(1 + 10 * sigma))
    width = (high - low) / (bins - 1)
    inner = low + width * np.arange(1, bins)  # bin k is [low + k w, low + (k + 1) w)
    edges = np.concatenate([[-np.inf], s2 * (inner + np.log1p(-np.exp(log_stay - inner)) - math.log(q)) + 0.5,
                            [np.inf]])

    def mass(shift: float) -> np.ndarray:
        a, b = (edges[:-1] - shift) / sigma, (edges[1:] - shift) / sigma
        return np.where(a > 0, ndtr(-a) - ndtr(-b), ndtr(b) - ndtr(a))

    out = mass(0.0)
    step_in, step_out = (1 - q) * out + q * mass(1.0), out
    length = steps * (bins - 1) + 1
    size = 1 << (length - 1).bit_length()

    def compose(pmf: np.ndarray) -> np.ndarray:
        total = np.fft.irfft(np.fft.rfft(pmf, size) ** steps, size)[:length]
        total = np.maximum(total, 0.0)
        return total / total.sum()

    return ScoreGrid(steps * low + width * np.arange(length), compose(step_in),
                     compose(step_out))


def shuffle_pair_llr(rng: np.random.Generator, runs: int, steps: int, epochs: int,
                     sigma: float, inside: bool) -> np.ndarray:
    """The exact log likelihood ratio of Chua et al.'s pair (dynamic shuffling), per run:
    each epoch ``steps`` noisy batch sums shifted by B, 2 at the canary's step (1 for its
    empty slot on the side without it), 0 elsewhere (docs/shuffle.md). Persistent
    shuffling is the one-epoch pair at ``sigma / sqrt(epochs)``."""
    total = np.zeros(runs)
    for _ in range(epochs):
        w = rng.standard_normal((runs, steps)) * sigma
        w[np.arange(runs), rng.integers(0, steps, runs)] += 2.0 if inside else 1.0
        total += (logsumexp((4 * w - 4) / (2 * sigma ** 2), 1)
                  - logsumexp((2 * w - 1) / (2 * sigma ** 2), 1))
    return total


def thresholds(grid: ScoreGrid, val_runs: int, reps: int, delta: float, alpha: float,
               rng: np.random.Generator) -> np.ndarray:
    """audit-impl's threshold of each of ``reps`` replications, each chosen on its own
    ``val_runs`` validation runs per side."""
    from .tramer.statistics import choose_threshold

    return np.array([choose_threshold(grid.draw(rng, val_runs, True),
                                      grid.draw(rng, val_runs, False), delta, alpha)
                     for _ in range(reps)])


def eps_lbs(grid: ScoreGrid, taus: np.ndarray, runs: int, delta: float, alpha: float,
            rng: np.random.Generator) -> np.ndarray:
    """The certified eps_LB of each replication (threshold ``taus``) on ``runs``
    evaluation runs per side: its counts binomial at the threshold's exceedance
    probabilities."""
    ct_in = rng.binomial(runs, grid.sf(taus, True))
    ct_out = rng.binomial(runs, grid.sf(taus, False))
    return np.asarray(bounds.eps_lb_clopper_pearson(ct_in, runs, ct_out, runs, alpha, delta))


#: Distinct score values the threshold is chosen among (:meth:`ScoreGrid.coarse`), and the
#: grid the noise is calibrated on (:func:`calibrate`).
LEVELS = 2048
CALIBRATION_GRID = 2 ** 17


def calibrate(eps: float, q: float, steps: int, delta: float) -> float:
    """The noise multiplier at which the pair of :func:`poisson_pair` has epsilon ``eps``
    at ``delta`` (Brent's method on log sigma, on a grid of :data:`CALIBRATION_GRID`).
    The grid rounds each step's loss down, so its epsilon is at most the pair's (within
    about 0.01 of dp_accounting's PLD, tests/test_runs_needed.py): the noise found is at
    most the noise whose true epsilon is ``eps``, a bug at least ``eps`` (optimistic, by
    that little). Seconds, where the PLD accountant takes a minute at a thousand steps."""
    from scipy import optimize

    gap = lambda log_s: poisson_pair(math.exp(log_s), q, steps, CALIBRATION_GRID).epsilon(  # noqa: E731
        delta) - eps
    lo = 0.0
    while gap(lo) <= 0:
        lo -= 1.0
    hi = lo + 1.0
    while gap(hi) > 0:
        lo, hi = hi, hi + 1.0
    return math.exp(optimize.brentq(gap, lo, hi, xtol=1e-5))


@dataclass(frozen=True)
class Question:
    """How many evaluation runs per side catch DP-SGD that claims ``(eps, delta)`` at rate
    ``q`` for ``steps`` steps but is ``factor * eps``-DP, with probability ``power``, at
    ``alpha``; ``val_runs`` validation runs per side choose the threshold (None: as many
    as the evaluation runs, half of each side's runs choosing); ``reps`` replications; at
    most ``max_runs`` tried."""

    eps: float
    delta: float
    factor: float
    q: float
    steps: int
    alpha: float
    power: float = 0.9
    val_runs: int | None = None
    reps: int = 200
    seed: int = 0
    max_runs: int = 10 ** 6

    def __post_init__(self):
        checks = {"eps": 0 < self.eps < math.inf, "delta": 0 < self.delta < 1,
                  "factor": 1 <= self.factor < math.inf, "q": 0 < self.q <= 1,
                  "steps": self.steps >= 1, "alpha": 0 < self.alpha < 1,
                  "power": 0 < self.power < 1,
                  "val_runs": self.val_runs is None or self.val_runs >= 1,
                  "reps": self.reps >= 1, "max_runs": self.max_runs >= 1}
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r}: out of range (eps > 0, "
                                 "0 < delta, alpha, power < 1, factor >= 1, 0 < q <= 1, "
                                 "steps, val_runs, reps, max_runs >= 1)")


def power_at(grid: ScoreGrid, question: Question, runs: int) -> dict:
    """One run count's row: ``runs`` evaluation runs per side (and the validation runs),
    the power and the median and 10% quantile of the certified eps_LB over the
    replications, each drawn from seeds of the count alone."""
    qn = question
    val = qn.val_runs or runs
    taus = thresholds(grid, val, qn.reps, qn.delta, qn.alpha,
                      seeds.rng(qn.seed, "runs-needed/validation", val))
    eps = eps_lbs(grid, taus, runs, qn.delta, qn.alpha, seeds.rng(qn.seed, "runs-needed", runs))
    return {"runs": runs, "val_runs": val, "power": float(np.mean(eps > qn.eps)),
            "eps_lb_median": float(np.median(eps)), "eps_lb_q10": float(np.quantile(eps, 0.1))}


def answer(question: Question, log: Callable[[dict], None] | None = None,
           grid: ScoreGrid | None = None) -> dict:
    """The fewest evaluation runs per side at which the power reaches ``question.power``:
    from :func:`~dpaudit.experiments.tramer.min_runs` (below it no attack refutes the claim)
    doubling until it does, then bisected to 5% (:func:`power_at` each; a count's power
    does not depend on the path that led to it). ``grid``: the bug's scores, else
    :func:`poisson_pair` at the noise of :func:`calibrate`, coarsened to :data:`LEVELS`.
    Returns ``{"runs": n or None (not within max_runs), "sigma_bug", "min_runs",
    "tried": [rows]}``; each row also goes to ``log``."""
    from .tramer.claim import min_runs

    qn = question
    sigma_bug = math.nan
    if grid is None:
        sigma_bug = calibrate(qn.factor * qn.eps, qn.q, qn.steps, qn.delta)
        grid = poisson_pair(sigma_bug, qn.q, qn.steps).coarse(LEVELS)
    tried = []

    def enough(n: int) -> bool:
        tried.append(power_at(grid, qn, n))
        if log:
            log(tried[-1])
        return tried[-1]["power"] >= qn.power

    first = min_runs(qn.eps, qn.delta, qn.alpha)
    lo, hi, n = first - 1, None, first  # lo: a count known to fall short
    while hi is None and n <= qn.max_runs:
        if enough(n):
            hi = n
        else:
            lo, n = n, (min(2 * n, qn.max_runs) if n < qn.max_runs else n + 1)
    while hi is not None and hi - lo > max(1, hi // 20):
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid, hi)
    return {"runs": hi, "sigma_bug": sigma_bug, "min_runs": first, "tried": tried}


__all__ = ["ScoreGrid", "poisson_pair", "shuffle_pair_llr", "thresholds", "eps_lbs",
           "calibrate", "Question", "power_at", "answer", "GRID", "LEVELS",
           "CALIBRATION_GRID"]
