"""The last-iterate heuristic of DP-SGD: eps of releasing only the final model, linear losses.

[SNG+25] observe that when every loss is linear, ``l(theta, x) = <theta, g(x)>``, each
gradient is a constant vector, so the last iterate of DP-SGD (Poisson sampling rate ``q``,
noise multiplier ``sigma``, ``T`` steps, constant learning rate) is the initial point plus
a sum of ``T`` noisy gradient sums. Projected on the gradient of the differing example,
the pair of output distributions under add/remove neighbours is (their Theorem 1)

    P = Binomial(T, q) + N(0, T sigma^2)   (the example is in the data set)
    Q = N(0, T sigma^2)                     (it is not),

and the release is (eps, delta)-DP for add/remove neighbours iff
``delta >= max(H_eps(P || Q), H_eps(Q || P))``, both directions of the hockey-stick
divergence. ``eps`` of this pair is the *heuristic*: exact for linear losses, an upper
reference that black-box audits of the final model should approach but not pass, and no
bound for general losses ([SNG+25] construct counterexamples that exceed it). It never
exceeds the composition accountant's eps (:func:`dpaudit.accounting.epsilon`), which
releases every iterate; it equals it at ``T = 1`` and at ``q = 1``, where P and Q are one
(subsampled) Gaussian step.

P is a Binomial mixture of Gaussians and its privacy loss ``L(x) = log(p(x) / q(x)) =
logsumexp_k(log b_k + (k x - k^2 / 2) / s^2)`` (``s = sigma sqrt(T)``) increases in x, so
each divergence is a difference of normal tails at the root of ``L = +-eps``:
``H_eps(P || Q) = P(x > x*) - e^eps Q(x > x*)`` with ``L(x*) = eps``, and
``H_eps(Q || P) = Q(x < y*) - e^eps P(x < y*)`` with ``L(y*) = -eps`` (zero when
``eps >= -log b_0``). dp_accounting's ``MixtureGaussianPrivacyLoss`` models the same pair,
but (version 0.6) its search range for inverting the privacy loss can miss the root at
small eps and then returns too small a delta, so the tails are computed here with scipy.
The binomial's negligible tails are dropped first (T in the thousands costs a few hundred
terms); :func:`_mixture` says how the dropped mass is added back to delta.

References
----------
- [SNG+25] Steinke, Nasr, Ganesh, Balle, Choquette-Choo, Jagielski, Hayes, Thakurta, Smith,
  Terzis. The Last Iterate Advantage: Empirical Auditing and Principled Heuristic Analysis
  of Differentially Private SGD. ICLR 2025 (arXiv:2410.06186), Theorem 1.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special, stats

__all__ = ["last_iterate_delta", "last_iterate_epsilon"]

#: Largest binomial mass dropped from P's mixture (it is added back to delta).
DROPPED_MASS = 1e-18
#: Absolute precision of the eps returned by :func:`last_iterate_epsilon`.
EPS_TOLERANCE = 1e-9


def _check(noise_multiplier, sample_rate, steps) -> None:
    if not noise_multiplier >= 0:
        raise ValueError(f"noise_multiplier={noise_multiplier!r}: must be >= 0")
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample_rate={sample_rate!r}: must lie in (0, 1]")
    if steps < 0 or steps != int(steps):
        raise ValueError(f"steps={steps!r}: must be a whole number >= 0")


def _mixture(sample_rate: float, steps: int, dropped: float):
    """``(sensitivities, probabilities, m)``: P's shifts ``k`` and their Binomial(T, q)
    weights renormalised after dropping the smallest weights of total mass ``m <= dropped``.

    With ``P'`` the renormalised mixture, ``P <= P' + (dropped part)`` and
    ``P >= (1 - m) P'``, so ``H_eps(P || Q) <= H_eps(P' || Q) + m`` and
    ``H_eps(Q || P) <= H_eps'(Q || P')`` at ``eps' = eps + log(1 - m)``: both directions
    stay upper bounds.
    """
    k = np.arange(steps + 1)
    pmf = stats.binom.pmf(k, steps, sample_rate)
    order = np.argsort(pmf)
    drop = order[np.cumsum(pmf[order]) <= dropped]
    keep = np.ones(steps + 1, dtype=bool)
    keep[drop] = False
    if not keep[1:].any():  # q so small that only k = 0 would stay: keep the likeliest k > 0
        keep[1 + np.argmax(pmf[1:])] = True
    mass = float(pmf[~keep].sum())
    return k[keep].astype(float), pmf[keep] / pmf[keep].sum(), mass


class _Pair:
    """P = sum_k b_k N(k, s^2) against Q = N(0, s^2), tails dropped by :func:`_mixture`."""

    def __init__(self, noise_multiplier, sample_rate, steps, dropped):
        self.k, b, self.dropped = _mixture(sample_rate, steps, dropped)
        self.logb = np.log(b)
        self.s = noise_multiplier * math.sqrt(steps)
        # L's infimum: log b_0, or -inf when k = 0 was dropped.
        self.min_loss = self.logb[0] if self.k[0] == 0 else -math.inf

    def loss(self, x: float) -> float:
        return float(special.logsumexp(self.logb + self.k * (x - self.k / 2) / self.s ** 2))

    def _root(self, level: float) -> float:
        """x with ``L(x) = level`` (L increases from ``min_loss`` to inf)."""
        lo, hi = -self.s, self.s
        while self.loss(lo) > level:
            lo *= 2
        while self.loss(hi) < level:
            hi *= 2
        return optimize.brentq(lambda x: self.loss(x) - level, lo, hi, xtol=1e-12 * self.s,
                               rtol=4 * np.finfo(float).eps)

    def delta(self, eps: float) -> float:
        """``max(H_eps(P || Q), H_eps(Q || P))``, both rounded up for the dropped mass."""
        x = self._root(eps)
        upper = special.logsumexp(self.logb + stats.norm.logsf((x - self.k) / self.s))
        remove = _difference(upper, eps + stats.norm.logsf(x / self.s)) + self.dropped
        eps = eps + math.log1p(-self.dropped)
        add = 0.0
        if -eps > self.min_loss:
            y = self._root(-eps)
            lower = special.logsumexp(self.logb + stats.norm.logcdf((y - self.k) / self.s))
            add = _difference(stats.norm.logcdf(y / self.s), eps + lower)
        return min(1.0, max(remove, add))


def _difference(log_a: float, log_b: float) -> float:
    """``(a - b)_+`` from logs, without cancellation."""
    return 0.0 if log_b >= log_a else math.exp(log_a) * -math.expm1(log_b - log_a)


def last_iterate_delta(noise_multiplier: float, sample_rate: float, steps: int,
                       eps: float) -> float:
    """Heuristic delta at ``eps`` of releasing only the last iterate of DP-SGD [SNG+25]:
    ``max(H_eps(P || Q), H_eps(Q || P))`` for the pair of the module docstring, add/remove
    neighbours. Rounded up: the binomial mass dropped (at most :data:`DROPPED_MASS`) is
    added. ``noise_multiplier = 0`` gives 1, ``steps = 0`` gives 0.
    """
    _check(noise_multiplier, sample_rate, steps)
    if not eps >= 0:
        raise ValueError(f"eps={eps!r}: must be >= 0")
    if steps == 0:
        return 0.0
    if noise_multiplier == 0 or eps == math.inf:
        return 1.0 if noise_multiplier == 0 else 0.0
    return _Pair(noise_multiplier, sample_rate, int(steps), DROPPED_MASS).delta(eps)


def last_iterate_epsilon(noise_multiplier: float, sample_rate: float, steps: int,
                         delta: float) -> float:
    """Heuristic eps at ``delta`` of releasing only the last iterate of DP-SGD [SNG+25]:
    the smallest ``eps >= 0`` with ``last_iterate_delta(..., eps) <= delta`` (Brent's method,
    to :data:`EPS_TOLERANCE`, the larger end returned). The binomial mass dropped is at most
    ``min(DROPPED_MASS, 1e-6 delta)``, added to delta. ``noise_multiplier = 0`` gives inf,
    ``steps = 0`` gives 0.
    """
    _check(noise_multiplier, sample_rate, steps)
    if not 0 < delta < 1:
        raise ValueError(f"delta={delta!r}: must lie strictly between 0 and 1")
    if steps == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    pair = _Pair(noise_multiplier, sample_rate, int(steps), min(DROPPED_MASS, 1e-6 * delta))

    def gap(eps: float) -> float:
        return pair.delta(eps) - delta

    if gap(0.0) <= 0:
        return 0.0
    hi = 1.0
    while gap(hi) > 0:
        hi *= 2
    root = optimize.brentq(gap, hi / 2 if hi > 1 else 0.0, hi, xtol=EPS_TOLERANCE / 2,
                           rtol=4 * np.finfo(float).eps)
    return float(root + EPS_TOLERANCE / 2)
