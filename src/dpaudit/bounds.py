"""Audit statistics: from attack outcomes to empirical lower bounds on epsilon.

Pure functions (numpy/scipy, no torch), kept apart from training as in jax_privacy's
``auditing.py``.  Conventions: a *positive* trial trains on the data set with the canary
(D1), a *negative* one without it (D0); the attack says "canary in" when a trial's score
exceeds the threshold.  ``ct_pos`` of ``n_pos`` positive and ``ct_neg`` of ``n_neg``
negative trials said "in", so ``ct_pos / n_pos`` estimates the TPR and ``ct_neg / n_neg``
the FPR.  Every bound here holds with probability at least ``1 - alpha`` (or ``1 - beta``)
over the trials: it exceeds the mechanism's true epsilon at most that often, which
``tests/test_bounds.py`` checks by simulation.

The counting functions broadcast over array arguments and return a float for scalar input.

References
----------
- [JUO20] Jagielski, Ullman, Oprea. Auditing Differentially Private Machine Learning: How
  Private is Private SGD? NeurIPS 2020 (seed 003: Algorithm 2, Lemma 1).
- [DRS19] Dong, Roth, Su. Gaussian Differential Privacy. JRSS-B 2022, Corollary 2.13.
- [NHSB23] Nasr, Hayes, Steinke, Balle et al. Tight Auditing of Differentially Private
  Machine Learning. USENIX Security 2023 (the GDP audit; seed 000).
- [SNJ23] Steinke, Nasr, Jagielski. Privacy Auditing with One (1) Training Run. NeurIPS
  2023: Theorem 1 / seed 004 eq. (1) (pure eps) and Appendix D (eps, delta).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy import optimize, special, stats

__all__ = [
    "clopper_pearson",
    "eps_lb_clopper_pearson",
    "mu_lb_gdp",
    "eps_from_mu",
    "delta_from_mu",
    "eps_lb_one_run",
    "ThresholdAudit",
    "threshold_split_audit",
    "threshold_scan_audit",
]


def _scalar_or_array(x: np.ndarray):
    return float(x) if np.ndim(x) == 0 else x


def _check_counts(ct_pos, n_pos, ct_neg, n_neg):
    arrays = [np.asarray(a) for a in (ct_pos, n_pos, ct_neg, n_neg)]
    for name, a in zip(("ct_pos", "n_pos", "ct_neg", "n_neg"), arrays):
        if not np.all(np.isfinite(a)) or np.any(a != np.round(a)):
            raise ValueError(f"{name} must be whole numbers, got {a!r}")
    ct_pos, n_pos, ct_neg, n_neg = (a.astype(np.int64) for a in arrays)
    if np.any(n_pos < 1) or np.any(n_neg < 1):
        raise ValueError("n_pos and n_neg must be >= 1")
    if np.any((ct_pos < 0) | (ct_pos > n_pos)) or np.any((ct_neg < 0) | (ct_neg > n_neg)):
        raise ValueError("counts must satisfy 0 <= ct_pos <= n_pos and 0 <= ct_neg <= n_neg")
    return ct_pos, n_pos, ct_neg, n_neg


def _check_level(name: str, value: float) -> None:
    if not 0.0 < value < 1.0:
        raise ValueError(f"{name}={value!r}: must lie strictly between 0 and 1")


def clopper_pearson(ct, n, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Two-sided Clopper-Pearson ("exact") interval at level ``1 - alpha``.

    Each side is a one-sided bound at ``alpha / 2``: ``lo = Beta(alpha/2; ct, n - ct + 1)``
    and ``hi = Beta(1 - alpha/2; ct + 1, n - ct)`` quantiles, with ``lo = 0`` at ``ct = 0`` and
    ``hi = 1`` at ``ct = n``; the same interval as
    ``scipy.stats.binomtest(ct, n).proportion_ci(1 - alpha, "exact")``, vectorized.
    """
    ct, n = np.asarray(ct, dtype=float), np.asarray(n, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        lo = np.where(ct > 0, stats.beta.ppf(alpha / 2, ct, n - ct + 1), 0.0)
        hi = np.where(ct < n, stats.beta.ppf(1 - alpha / 2, ct + 1, n - ct), 1.0)
    return lo, hi


def _group_delta(eps, k: int, delta: float):
    """delta_k = delta * (e^{k eps} - 1) / (e^eps - 1) of group privacy ([JUO20] Lemma 1)."""
    if k == 1:
        return delta * np.ones_like(eps)
    return delta * np.where(eps > 1e-12, np.expm1(k * eps) / np.expm1(np.maximum(eps, 1e-12)), k)


def _eps_from_rates(p1, p0, delta: float, k: int):
    """Largest eps with ``p1 > e^{k eps} p0 + delta_k(eps)`` (0 if none): refutes (eps, delta)-DP.

    Group privacy ([JUO20] Lemma 1) says an (eps, delta)-DP algorithm has
    ``P[in | D1] <= e^{k eps} P[in | D0] + delta (e^{k eps}-1)/(e^eps-1)`` for data sets at
    distance k; the right side increases in eps, so the boundary is one root.  With
    ``delta = 0`` this is ``ln(p1/p0)/k`` (Algorithm 2), with ``k = 1`` ``ln((p1-delta)/p0)``.
    """
    p1, p0 = np.broadcast_arrays(np.asarray(p1, float), np.asarray(p0, float))
    out = np.zeros(p1.shape)
    can = (p1 > p0 + k * delta) & (p0 > 0)
    if delta == 0.0 or k == 1:
        with np.errstate(divide="ignore", invalid="ignore"):
            out[can] = np.log((p1[can] - delta) / p0[can]) / k
    elif can.any():
        # Bisection on all entries at once: f(e) = p0 e^{k e} + delta_k(e) - p1 increases in
        # e, f(0) = p0 + k delta - p1 < 0 and f(hi) >= 0 at hi = ln(p1/p0)/k (delta_k >= 0).
        a, b = p1[can], p0[can]
        lo, hi = np.zeros_like(a), np.log(a / b) / k
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            above = b * np.exp(k * mid) + _group_delta(mid, k, delta) > a
            lo, hi = np.where(above, lo, mid), np.where(above, mid, hi)
            if np.all(hi - lo <= 1e-12 * np.maximum(hi, 1.0)):
                break
        out[can] = lo  # the lower end: never above the root
    return np.maximum(out, 0.0)


def eps_lb_clopper_pearson(ct_pos, n_pos, ct_neg, n_neg, alpha: float = 0.01,
                           delta: float = 0.0, k: int = 1):
    """Epsilon lower bound of [JUO20] Algorithm 2 with Clopper-Pearson intervals.

    ``p1_lo`` is the one-sided lower Clopper-Pearson bound on the TPR and ``p0_hi`` the
    upper bound on the FPR, each at ``alpha / 2`` (so both hold together with probability
    ``1 - alpha``).  If the algorithm were (eps, delta)-DP then for the data sets at
    distance ``k`` both ``TPR <= e^{k eps} FPR + delta_k`` and, for the complementary event
    "out", ``1 - FPR <= e^{k eps} (1 - TPR) + delta_k`` with ``delta_k`` of group privacy
    ([JUO20] Lemma 1; solved numerically when ``delta > 0`` and ``k > 1``).  The returned
    eps_LB is the larger of the two refuted eps (the reference code's swap when
    ``p0 + p1 > 1``); both use the same two one-sided bounds, so it is valid at ``1 - alpha``.

    Returns 0 when nothing can be claimed; never negative or NaN.
    """
    ct_pos, n_pos, ct_neg, n_neg = _check_counts(ct_pos, n_pos, ct_neg, n_neg)
    _check_level("alpha", alpha)
    if not 0.0 <= delta < 1.0:
        raise ValueError(f"delta={delta!r}: must lie in [0, 1)")
    if int(k) != k or k < 1:
        raise ValueError(f"k={k!r}: must be an integer >= 1 (the number of inserted canaries)")
    p1_lo, _ = clopper_pearson(ct_pos, n_pos, alpha)
    _, p0_hi = clopper_pearson(ct_neg, n_neg, alpha)
    eps = np.maximum(_eps_from_rates(p1_lo, p0_hi, delta, int(k)),
                     _eps_from_rates(1 - p0_hi, 1 - p1_lo, delta, int(k)))
    return _scalar_or_array(eps)


def mu_lb_gdp(ct_pos, n_pos, ct_neg, n_neg, alpha: float = 0.05):
    """Lower bound on mu of mu-GDP ([DRS19] Def. 2.6; the test of [NHSB23], seed 000).

    A mu-GDP algorithm has every test's FNR >= Phi(Phi^{-1}(1 - FPR) - mu), i.e.
    ``mu >= Phi^{-1}(TPR) - Phi^{-1}(FPR)``.  With the Clopper-Pearson lower bound on the
    TPR and upper bound on the FPR (``alpha / 2`` each)
    ``mu_LB = max(0, Phi^{-1}(TPR_lo) - Phi^{-1}(FPR_hi))``.  Only this direction is
    used: an attack scoring worse than chance certifies nothing (taking ``|mu|`` would).
    """
    ct_pos, n_pos, ct_neg, n_neg = _check_counts(ct_pos, n_pos, ct_neg, n_neg)
    _check_level("alpha", alpha)
    p1_lo, _ = clopper_pearson(ct_pos, n_pos, alpha)
    _, p0_hi = clopper_pearson(ct_neg, n_neg, alpha)
    with np.errstate(divide="ignore", invalid="ignore"):
        mu = special.ndtri(p1_lo) - special.ndtri(p0_hi)
    return _scalar_or_array(np.where(np.isfinite(mu) & (mu > 0), mu, 0.0))


def delta_from_mu(mu: float, eps: float) -> float:
    """delta(eps) of mu-GDP: ``Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``.

    [DRS19] Corollary 2.13; evaluated in log space so large eps does not overflow.
    """
    if mu <= 0:
        return 0.0
    a = special.log_ndtr(-eps / mu + mu / 2)
    b = eps + special.log_ndtr(-eps / mu - mu / 2)
    return float(np.exp(a) * -np.expm1(min(b - a, 0.0)))


def eps_from_mu(mu: float, delta: float) -> float:
    """The smallest eps with mu-GDP => (eps, delta)-DP ([DRS19] Corollary 2.13).

    Solves ``delta_from_mu(mu, eps) = delta`` for eps >= 0 (the function decreases in eps);
    0 when already ``delta_from_mu(mu, 0) <= delta``.  ``mu = inf`` gives ``inf``.
    """
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta={delta!r}: must lie strictly between 0 and 1")
    if np.isnan(mu) or mu < 0:
        raise ValueError(f"mu={mu!r}: must be >= 0")
    if np.isinf(mu):
        return float("inf")
    if delta_from_mu(mu, 0.0) <= delta:
        return 0.0
    hi = max(1.0, mu * mu)
    while delta_from_mu(mu, hi) > delta:
        hi *= 2
    return float(optimize.brentq(lambda e: delta_from_mu(mu, e) - delta, 0.0, hi, xtol=1e-12,
                                 rtol=1e-12))


def _one_run_pvalue(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """p-value of v correct guesses out of r under (eps, delta)-DP, [SNJ23] Appendix D.

    ``P[Bin(r, q) >= v] + 2 m delta max_{1<=i<=v} P[v - i <= Bin(r, q) < v] / i`` with
    ``q = e^eps / (1 + e^eps)`` (the authors' ``p_value_DP_audit``).
    """
    q = special.expit(eps)
    tail = stats.binom.sf(v - 1, r, q)
    if delta == 0.0 or v == 0:
        return min(float(tail), 1.0)
    below = np.cumsum(stats.binom.pmf(np.arange(v - 1, -1, -1), r, q))  # i = 1..v
    alpha = np.max(below / np.arange(1, v + 1))
    return min(float(tail + 2 * m * delta * alpha), 1.0)


def eps_lb_one_run(m, r, v, delta: float = 0.0, beta: float = 0.05):
    """One-run audit bound of [SNJ23]: m canaries, r guesses (the rest abstain), v correct.

    Pure eps (seed 004 eq. 1, [SNJ23] Thm. 1): the largest eps with
    ``P[Bin(r, e^eps/(1+e^eps)) >= v] <= beta``.  That tail is the regularized incomplete
    beta function ``I_q(v, r - v + 1)``, so the boundary is the Clopper-Pearson lower
    bound ``q* = Beta(beta; v, r - v + 1)`` and ``eps = logit(q*)``, in closed form.  With
    ``delta > 0``: the largest eps at which the Appendix D p-value is still below beta,
    by bisection as in the authors' ``get_eps_audit``.  Broadcasts over m, r, v.
    """
    m, r, v = np.broadcast_arrays(*(np.asarray(a) for a in (m, r, v)))
    if np.any(v < 0) or np.any(v > r) or np.any(r > m) or np.any(r < 0):
        raise ValueError("need 0 <= v <= r <= m")
    _check_level("beta", beta)
    if not 0.0 <= delta < 1.0:
        raise ValueError(f"delta={delta!r}: must lie in [0, 1)")
    if delta == 0.0:
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.where(v > 0, stats.beta.ppf(beta, np.maximum(v, 1), r - v + 1), 0.0)
            eps = np.where(q > 0.5, special.logit(q), 0.0)
        return _scalar_or_array(eps)
    out = np.zeros(m.shape)
    for idx in np.ndindex(m.shape):
        mi, ri, vi = int(m[idx]), int(r[idx]), int(v[idx])
        if _one_run_pvalue(mi, ri, vi, 0.0, delta) >= beta:
            continue
        lo, hi = 0.0, 1.0
        while _one_run_pvalue(mi, ri, vi, hi, delta) < beta:
            lo, hi = hi, 2 * hi
        for _ in range(50):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if _one_run_pvalue(mi, ri, vi, mid, delta) < beta else (lo, mid)
        out[idx] = lo
    return _scalar_or_array(out)


# ---- choosing the decision threshold -------------------------------------------------

#: bound(ct_pos, n_pos, ct_neg, n_neg, alpha) -> value (vectorized), e.g. a partial of
#: eps_lb_clopper_pearson or mu_lb_gdp.
Bound = Callable[..., "np.ndarray | float"]


@dataclass(frozen=True)
class ThresholdAudit:
    """A bound evaluated at one threshold: the attack says "in" when ``score > threshold``."""

    value: float
    threshold: float
    ct_pos: int
    n_pos: int
    ct_neg: int
    n_neg: int


def _counts_above(scores_pos, scores_neg, thresholds):
    sp, sn = np.sort(scores_pos), np.sort(scores_neg)
    ct_pos = len(sp) - np.searchsorted(sp, thresholds, side="right")
    ct_neg = len(sn) - np.searchsorted(sn, thresholds, side="right")
    return ct_pos, ct_neg


def _candidates(scores_pos, scores_neg) -> np.ndarray:
    """Every distinct decision "score > t": t at each distinct score, plus below all."""
    allv = np.unique(np.concatenate([scores_pos, scores_neg]))
    return np.concatenate([[-np.inf], allv[:-1]]) if allv.size else np.array([-np.inf])


def _scan(scores_pos, scores_neg, bound: Bound, alpha: float, thresholds,
          centre: bool = True) -> ThresholdAudit:
    """The best of ``thresholds`` (ascending distinct scores, ``-inf`` first). Every
    threshold up to the next score makes the same decisions on these scores; with
    ``centre`` the middle of that gap is returned, which keeps a margin on fresh trials
    (the score itself would sit on, e.g., the largest negative score when the sides
    separate)."""
    ct_pos, ct_neg = _counts_above(scores_pos, scores_neg, thresholds)
    n_pos, n_neg = len(scores_pos), len(scores_neg)
    values = np.atleast_1d(bound(ct_pos, n_pos, ct_neg, n_neg, alpha))
    i = int(np.argmax(values))
    threshold = float(thresholds[i])
    above = np.concatenate([scores_pos, scores_neg])
    above = above[above > threshold]
    if centre and np.isfinite(threshold) and above.size:
        threshold = 0.5 * (threshold + float(above.min()))
    return ThresholdAudit(float(values[i]), threshold, int(ct_pos[i]), n_pos,
                          int(ct_neg[i]), n_neg)


def _as_scores(scores_pos, scores_neg):
    sp, sn = (np.asarray(s, dtype=float).ravel() for s in (scores_pos, scores_neg))
    if sp.size < 2 or sn.size < 2:
        raise ValueError("need at least 2 scores on each side")
    if not (np.all(np.isfinite(sp)) and np.all(np.isfinite(sn))):
        raise ValueError("scores must be finite")
    return sp, sn


def threshold_split_audit(scores_pos, scores_neg, bound: Bound, alpha: float,
                          select_frac: float = 0.5) -> ThresholdAudit:
    """Pick the threshold on the first trials, evaluate the bound on the rest.

    The first ``select_frac`` of each side's trials choose the threshold maximizing
    ``bound`` (at the same alpha); the bound is then computed at that threshold on the
    remaining, independent trials only, so the confidence level needs no correction.  This
    is the reference code's procedure ([JUO20], ``audit.py``: 500 trials choose, 500
    evaluate).  Trials must be exchangeable (independent runs), so their order is the split.
    """
    sp, sn = _as_scores(scores_pos, scores_neg)
    if not 0.0 < select_frac < 1.0:
        raise ValueError(f"select_frac={select_frac!r}: must lie strictly between 0 and 1")
    cut_p, cut_n = int(len(sp) * select_frac), int(len(sn) * select_frac)
    if min(cut_p, cut_n, len(sp) - cut_p, len(sn) - cut_n) < 1:
        raise ValueError("too few trials to split into selection and evaluation halves")
    chosen = _scan(sp[:cut_p], sn[:cut_n], bound, alpha, _candidates(sp[:cut_p], sn[:cut_n]))
    return _scan(sp[cut_p:], sn[cut_n:], bound, alpha, np.array([chosen.threshold]),
                 centre=False)


def threshold_scan_audit(scores_pos, scores_neg, bound: Bound, alpha: float) -> ThresholdAudit:
    """Scan every threshold on all trials with a Bonferroni correction.

    With T distinct candidate decisions, each is evaluated at level ``alpha / T``; by the
    union bound all T bounds hold together with probability ``1 - alpha``, so their maximum
    is a valid bound.  Uses every trial, at the price of the ``log T`` factor in the level.
    """
    sp, sn = _as_scores(scores_pos, scores_neg)
    thresholds = _candidates(sp, sn)
    return _scan(sp, sn, bound, alpha / len(thresholds), thresholds)
