"""Audit statistics: from attack outcomes to empirical lower bounds on epsilon.

Pure functions (numpy, scipy, statsmodels; no torch), kept apart from training as in
jax_privacy's ``auditing.py``.  Conventions: a *positive* trial trains on the data set
with the canary (D1), a *negative* one without it (D0); the attack says "canary in" when
a trial's score exceeds the threshold.  ``ct_pos`` of ``n_pos`` positive and ``ct_neg``
of ``n_neg`` negative trials said "in", so ``ct_pos / n_pos`` estimates the TPR and
``ct_neg / n_neg`` the FPR.  Every bound here holds with probability at least
``1 - alpha`` (or ``1 - beta``) over the trials: it exceeds the mechanism's true epsilon
at most that often, which ``tests/test_bounds.py`` checks by simulation.  Two
exceptions, named so wherever they appear: :func:`eps_lb_katz` is approximate (an
asymptotic interval) and :func:`eps_lb_bayes` is the lower end of a Bayesian credible
interval, not a confidence bound.  Two results are no bounds either: the maximum over k of
:func:`eps_lb_paper_rule` (each per-k value is one) and the spread of
:func:`eps_lb_resplits` over re-splits of the same trials (a diagnostic of the split).

The counting functions broadcast over array arguments and return a float for scalar input.
Every public function checks each argument first: a bad one (a NaN, a boolean, text, a
complex number, an out-of-range level, a count that is not whole, a shape that does not
broadcast) raises a ValueError that names it and says what is allowed, never a result
computed from it (``tests/test_bounds_fuzz.py`` calls each with such values).

References
----------
- [JUO20] Jagielski, Ullman, Oprea. Auditing Differentially Private Machine Learning: How
  Private is Private SGD? NeurIPS 2020 (Algorithm 2, Lemma 1).
- [DRS19] Dong, Roth, Su. Gaussian Differential Privacy. JRSS-B 2022, Corollary 2.13.
- [NHSB23] Nasr, Hayes, Steinke, Balle et al. Tight Auditing of Differentially Private
  Machine Learning. USENIX Security 2023 (the GDP audit, as presented in the CSCI 699
  Week 4 lecture notes, Gaussian DP and Privacy Auditing).
- [SNJ23] Steinke, Nasr, Jagielski. Privacy Auditing with One (1) Training Run. NeurIPS
  2023: Theorem 1 (pure eps; eq. (1) of the DA 5001/6400 HW3 homework, IIT Madras 2024)
  and Appendix D (eps, delta).
- [MMC25] Mahloujifar, Melis, Chaudhuri. Auditing f-Differential Privacy in One Run.
  ICML 2025 (arXiv:2410.22235): the one-run guessing-game bound for any f-DP curve.
- [KBAS78] Katz, Baptista, Azen, Pike. Obtaining Confidence Intervals for the Risk Ratio
  in Cohort Studies. Biometrics 1978: the log interval for a ratio of two proportions.
- [ZBJ+23] Zanella-Beguelin, Wutschitz, Tople, Salem, Ruehle, Paverd, Naseri, Koepf,
  Jones. Bayesian Estimation of Differential Privacy. ICML 2023.
- [CCN+22] Carlini, Chien, Nasr, Song, Terzis, Tramer. Membership Inference Attacks From
  First Principles. IEEE S&P 2022: attacks compared by TPR at low FPR.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Callable

import numpy as np
from scipy import integrate, optimize, special, stats

__all__ = [
    "clopper_pearson",
    "eps_lb_clopper_pearson",
    "eps_lb_katz",
    "eps_lb_bayes",
    "tpr_at_fpr",
    "auc",
    "mu_lb_gdp",
    "eps_from_mu",
    "eps_gdp_estimate",
    "delta_from_mu",
    "eps_lb_one_run",
    "mu_lb_one_run_gdp",
    "eps_lb_one_run_fdp",
    "eps_lb_hoeffding",
    "scores_array",
    "ThresholdAudit",
    "threshold_holdout_audit",
    "GUESS_GRID_SIZE",
    "guess_grid",
    "guess_counts",
    "one_run_sweep",
    "SWEEP_COLUMNS",
    "split_trials",
    "threshold_split_audit",
    "threshold_scan_audit",
    "PAPER_SELECT_ALPHA",
    "PAPER_ALPHA",
    "PaperRuleAudit",
    "eps_lb_paper_rule",
    "eps_lb_resplits",
]


def _scalar_or_array(x: np.ndarray):
    return float(x) if np.ndim(x) == 0 else x


#: Largest whole number accepted as a count: beyond it floats skip integers and int64 nears
#: its end, so a count of 1e30 would silently become another number.
_MAX_WHOLE = 2**53


def _real(name: str, value, allowed: str = "be real numbers") -> np.ndarray:
    """``value`` as an array of real numbers (integer or float dtype); a ValueError naming
    the argument for anything else: None, text, bytes, booleans, complex numbers (numpy
    would cast text to numbers and complex to its real part), objects, ragged nesting."""
    try:
        a = np.asarray(value)
        if a.dtype == object and all(isinstance(x, (int, float, np.integer, np.floating))
                                     and not isinstance(x, bool) for x in a.ravel()):
            a = a.astype(float)  # Python ints beyond int64 (the size check refuses them)
    except (TypeError, ValueError):
        a = np.asarray(None)
    if a.dtype.kind not in "iuf":
        raise ValueError(f"{name}={value!r}: must {allowed}")
    return a


def _whole(name: str, value) -> np.ndarray:
    """``value`` as int64 if every entry is a finite whole number of at most 2**53 in size;
    else a ValueError naming the argument (NaN, infinities, 75.5, 1e30, booleans, complex
    numbers, strings and empty arrays are refused)."""
    a = _real(name, value, "be a whole number")
    if a.size == 0:
        raise ValueError(f"{name} is empty: must hold at least one whole number")
    if not np.all(np.isfinite(a)) or np.any(a != np.round(a)) or np.any(
            np.abs(a) > _MAX_WHOLE):
        raise ValueError(f"{name}={value!r}: must be a finite whole number (at most 2**53)")
    return a.astype(np.int64)


def _broadcast(**arrays) -> list[np.ndarray]:
    """The arrays broadcast together; a ValueError naming the arguments whose shapes clash."""
    try:
        return np.broadcast_arrays(*arrays.values())
    except ValueError:
        shaped = [f"{name} {np.shape(a)}" for name, a in arrays.items() if np.ndim(a)]
        raise ValueError(f"{' and '.join(shaped)}: must broadcast to one shape") from None


def _check_counts(ct_pos, n_pos, ct_neg, n_neg):
    ct_pos, n_pos, ct_neg, n_neg = (_whole(name, a) for name, a in
                                    zip(("ct_pos", "n_pos", "ct_neg", "n_neg"),
                                        (ct_pos, n_pos, ct_neg, n_neg)))
    _broadcast(ct_pos=ct_pos, n_pos=n_pos, ct_neg=ct_neg, n_neg=n_neg)
    for ct, n, side in ((ct_pos, n_pos, "pos"), (ct_neg, n_neg, "neg")):
        if np.any(n < 1):
            raise ValueError(f"n_{side}={n!r}: must be >= 1")
        if np.any((ct < 0) | (ct > n)):
            raise ValueError(f"ct_{side}={ct!r}: must satisfy 0 <= ct_{side} <= n_{side}")
    return ct_pos, n_pos, ct_neg, n_neg


def _check_k(k, name: str = "k", low: int = 1) -> int:
    """A single whole number >= ``low`` (``k`` the number of inserted canaries, ``k_max``,
    a grid size, ...)."""
    a = _whole(name, k)
    if a.ndim or a < low:
        raise ValueError(f"{name}={k!r}: must be a single whole number >= {low}")
    return int(a)


def _number(name: str, value, allowed: str = "be a number",
            ok: Callable[[float], bool] = lambda x: not math.isnan(x)) -> float:
    """``value`` as a float if it is one real number (a 0-d array counts) with ``ok(value)``;
    else a ValueError ``"<name>=<value>: must <allowed>"``."""
    x = value[()] if isinstance(value, np.ndarray) and value.ndim == 0 else value
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real):
        raise ValueError(f"{name}={value!r}: must {allowed}")
    try:
        x = float(x)
    except OverflowError:  # a Python int beyond floating point
        x = math.copysign(math.inf, x)
    if not ok(x):
        raise ValueError(f"{name}={value!r}: must {allowed}")
    return x


def _check_delta(delta: float) -> float:
    return _number("delta", delta, "lie in [0, 1)", lambda x: 0.0 <= x < 1.0)


def _check_level(name: str, value: float) -> float:
    return _number(name, value, "lie strictly between 0 and 1", lambda x: 0.0 < x < 1.0)


def clopper_pearson(ct, n, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Two-sided Clopper-Pearson ("exact") interval at level ``1 - alpha``.

    Each side is a one-sided bound at ``alpha / 2``: ``lo = Beta(alpha/2; ct, n - ct + 1)``
    and ``hi = Beta(1 - alpha/2; ct + 1, n - ct)`` quantiles, with ``lo = 0`` at ``ct = 0`` and
    ``hi = 1`` at ``ct = n``; the same interval as
    ``scipy.stats.binomtest(ct, n).proportion_ci(1 - alpha, "exact")``, vectorized.
    """
    ct, n = _whole("ct", ct), _whole("n", n)
    _broadcast(ct=ct, n=n)
    if np.any(n < 1):
        raise ValueError(f"n={n!r}: must be >= 1")
    if np.any((ct < 0) | (ct > n)):
        raise ValueError(f"ct={ct!r}: must satisfy 0 <= ct <= n (n={n!r})")
    alpha = _check_level("alpha", alpha)
    ct, n = ct.astype(float), n.astype(float)
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
    _check_delta(delta)
    k = _check_k(k)
    p1_lo, _ = clopper_pearson(ct_pos, n_pos, alpha)
    _, p0_hi = clopper_pearson(ct_neg, n_neg, alpha)
    eps = np.maximum(_eps_from_rates(p1_lo, p0_hi, delta, k),
                     _eps_from_rates(1 - p0_hi, 1 - p1_lo, delta, k))
    return _scalar_or_array(eps)


def _katz_ratio_lo(ct1, n1, ct2, n2, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Lower end of the two-sided ``1 - alpha`` Katz interval for ``p1 / p2`` (a one-sided
    bound at ``alpha / 2``) and the estimate of ``p2`` it used, by statsmodels'
    ``confint_proportions_2indep(compare="ratio")``: method ``"log"`` ([KBAS78]), or
    ``"log-adjusted"`` (0.5 added to counts and totals) where a count is 0, at which the
    plain log interval is undefined."""
    from statsmodels.stats.proportion import confint_proportions_2indep

    ct1, n1, ct2, n2 = (a.astype(float) for a in np.broadcast_arrays(ct1, n1, ct2, n2))
    zero = (ct1 == 0) | (ct2 == 0)
    half = np.where(zero, 0.5, 0.0)
    lo = np.empty(ct1.shape)
    for method, where in (("log", ~zero), ("log-adjusted", zero)):
        if where.any():
            lo[where] = confint_proportions_2indep(ct1[where], n1[where], ct2[where],
                                                   n2[where], method=method, compare="ratio",
                                                   alpha=alpha)[0]
    return lo, (ct2 + half) / (n2 + half)


def eps_lb_katz(ct_pos, n_pos, ct_neg, n_neg, alpha: float = 0.01, delta: float = 0.0,
                k: int = 1):
    """APPROXIMATE epsilon lower bound from Katz log intervals for risk ratios ([KBAS78]).

    The CSCI 699 lecture's "directly bound log((1 - delta - beta) / alpha) using Log-Katz
    confidence intervals": instead of one interval per rate (:func:`eps_lb_clopper_pearson`),
    one asymptotic interval for each ratio, ``TPR / FPR`` (counts ``ct_pos/n_pos`` over
    ``ct_neg/n_neg``) and, for the complementary event, ``TNR / FNR``, each lower end
    one-sided at ``alpha / 2`` (the two hold together at ``1 - alpha``, as in the
    Clopper-Pearson function).  With ``R_lo`` such a lower end and ``q`` the estimate of the
    denominator rate, the bound is the largest eps refuted by ``R_lo q > e^{k eps} q +
    delta_k(eps)`` (group privacy for k rows, [JUO20] Lemma 1): ``ln(R_lo) / k`` at
    ``delta = 0``, and ``ln(R_lo - delta / q)`` at ``k = 1``; delta enters through the
    point estimate ``q``.  A zero count uses statsmodels' ``"log-adjusted"`` interval (0.5
    added to counts and totals).

    The interval is a normal approximation on the log scale, so the level ``1 - alpha`` is
    only asymptotic: with few trials or counts near 0 it can exceed the truth more often
    than ``alpha`` (coverage measured in ``benchmarks/coverage.py``, docs/statistics.md).
    Report it as approximate, never as certified.  Returns 0 when nothing can be claimed.
    """
    ct_pos, n_pos, ct_neg, n_neg = _check_counts(ct_pos, n_pos, ct_neg, n_neg)
    _check_level("alpha", alpha)
    _check_delta(delta)
    k = _check_k(k)
    r_in, fpr = _katz_ratio_lo(ct_pos, n_pos, ct_neg, n_neg, alpha)
    r_out, fnr = _katz_ratio_lo(n_neg - ct_neg, n_neg, n_pos - ct_pos, n_pos, alpha)
    eps = np.maximum(_eps_from_rates(r_in * fpr, fpr, delta, k),
                     _eps_from_rates(r_out * fnr, fnr, delta, k))
    return _scalar_or_array(eps)


#: Quantile of each Jeffreys posterior beyond which :func:`eps_lb_bayes` ignores its mass.
_BAYES_TAIL = 1e-18


def _bayes_cdf(e: float, fpr: tuple[float, float], fnr: tuple[float, float], delta: float,
               k: int) -> float:
    """Posterior ``P[eps(FPR, FNR) <= e]`` for ``FPR ~ Beta(*fpr)``, ``FNR ~ Beta(*fnr)``.

    ``eps(x, y) <= e`` iff both ``y >= (1 - d - x) e^{-E}`` and ``y >= 1 - d - e^E x`` with
    ``E = k e``, ``d = delta_k(e)`` (each side of the refuting inequality increases in e).
    The region is symmetric in x and y, so ``P = integral f_X(x) P[Y >= g(x)] dx`` with either
    rate as X; the more concentrated posterior is integrated over (scipy's adaptive
    ``quad``, breakpoints at the kink of g and the posterior mean), the other enters through
    its regularized incomplete beta function.
    """
    E = k * e
    d = float(_group_delta(np.asarray(e), k, delta)) if delta else 0.0
    up, down = math.exp(E), math.exp(-E)
    var = lambda a, b: a * b / ((a + b) ** 2 * (a + b + 1))  # noqa: E731
    (ax, bx), (ay, by) = (fpr, fnr) if var(*fpr) <= var(*fnr) else (fnr, fpr)
    log_norm, a1, b1 = float(special.betaln(ax, bx)), ax - 1.0, bx - 1.0
    sf_y = partial(special.betainc, by, ay)  # P[Y >= g] = sf_y(1 - g) for Y ~ Beta(ay, by)

    def integrand(x: float) -> float:  # 0 < lo < x < hi < 1: plain logs (speed)
        g = max((1.0 - d - x) * down, 1.0 - d - up * x, 0.0)
        if g >= 1.0:
            return 0.0
        return math.exp(a1 * math.log(x) + b1 * math.log1p(-x) - log_norm) * sf_y(1.0 - g)

    lo = special.betaincinv(ax, bx, _BAYES_TAIL)
    hi = 1.0 - special.betaincinv(bx, ax, _BAYES_TAIL)
    points = [p for p in ((1.0 - d) / (up + 1.0), ax / (ax + bx)) if lo < p < hi]
    return integrate.quad(integrand, lo, hi, points=points or None, limit=200, epsabs=0.0,
                          epsrel=1e-6)[0]


@lru_cache(maxsize=65536)
def _bayes_scalar(ct_pos: int, n_pos: int, ct_neg: int, n_neg: int, alpha: float,
                  delta: float, k: int) -> float:
    fpr = (ct_neg + 0.5, n_neg - ct_neg + 0.5)
    fnr = (n_pos - ct_pos + 0.5, ct_pos + 0.5)
    excess = lambda e: _bayes_cdf(e, fpr, fnr, delta, k) - alpha  # noqa: E731
    if excess(0.0) >= 0.0:
        return 0.0
    hi = 1.0
    while excess(hi) < 0.0:
        hi *= 2.0
    return float(optimize.brentq(excess, hi / 2 if hi > 1.0 else 0.0, hi, xtol=1e-5,
                                 rtol=1e-5))


def eps_lb_bayes(ct_pos, n_pos, ct_neg, n_neg, alpha: float = 0.01, delta: float = 0.0,
                 k: int = 1):
    """Lower end of a one-sided ``1 - alpha`` Bayesian CREDIBLE INTERVAL for epsilon ([ZBJ+23]).

    Independent Jeffreys posteriors ``FPR ~ Beta(ct_neg + 1/2, n_neg - ct_neg + 1/2)`` and
    ``FNR ~ Beta(n_pos - ct_pos + 1/2, ct_pos + 1/2)``, and the epsilon they imply,
    ``eps(FPR, FNR) = max(0, ln((1 - delta - FPR) / FNR), ln((1 - delta - FNR) / FPR))``; the
    result is the ``alpha``-quantile of its posterior.  For a group of ``k`` rows the same
    refutation as :func:`eps_lb_clopper_pearson`: ``eps`` solves ``1 - delta_k(eps) - FPR
    = e^{k eps} FNR`` (or the same with the rates swapped), ``ln(...) / k`` at delta = 0.

    The posterior CDF is computed by numerical integration (:func:`_bayes_cdf`, mass beyond
    the 1e-18 quantiles of each posterior ignored) and inverted by Brent's method (to 1e-5
    relative).  It is a statement about the posterior under these priors, not a frequentist
    confidence bound: say "credible interval", never "confidence bound".  Broadcasts; each
    distinct scalar call is cached.
    """
    ct_pos, n_pos, ct_neg, n_neg = _check_counts(ct_pos, n_pos, ct_neg, n_neg)
    _check_level("alpha", alpha)
    _check_delta(delta)
    k = _check_k(k)
    args = np.broadcast_arrays(ct_pos, n_pos, ct_neg, n_neg)
    out = np.array([_bayes_scalar(int(a), int(b), int(c), int(d), float(alpha),
                                  float(delta), k) for a, b, c, d in zip(*map(np.ravel, args))])
    return _scalar_or_array(out.reshape(args[0].shape))


def tpr_at_fpr(scores_pos, scores_neg, max_fpr: float) -> float:
    """The largest TPR of a decision "score > t" whose FPR is at most ``max_fpr``, over every
    threshold t ([CCN+22]'s measure; one point of the empirical ROC curve).  With ``n``
    negative scores, an FPR of at most ``max_fpr`` allows ``floor(max_fpr n)`` false
    positives: none when ``n < 1 / max_fpr``."""
    sp, sn = _as_scores(scores_pos, scores_neg)
    _check_level("max_fpr", max_fpr)
    allowed = math.floor(max_fpr * len(sn) + 1e-9)
    t = np.sort(sn)[::-1][allowed] if allowed < len(sn) else -np.inf  # the first not allowed
    return float(np.mean(sp > t))


def auc(scores_pos, scores_neg) -> float:
    """Area under the empirical ROC curve: ``P[score_pos > score_neg] + P[tie] / 2``, the
    Mann-Whitney U statistic over ``n_pos n_neg`` (``scipy.stats.mannwhitneyu``)."""
    sp, sn = _as_scores(scores_pos, scores_neg)
    return float(stats.mannwhitneyu(sp, sn).statistic / (len(sp) * len(sn)))


def mu_lb_gdp(ct_pos, n_pos, ct_neg, n_neg, alpha: float = 0.05):
    """Lower bound on mu of mu-GDP ([DRS19] Def. 2.6; the test of [NHSB23]).

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


#: 20-point Gauss-Legendre nodes and weights on [-1, 1] (:func:`delta_from_mu` at small mu).
_GAUSS_LEGENDRE = np.polynomial.legendre.leggauss(20)


def _normal_log_slope_plus_t(t: np.ndarray) -> np.ndarray:
    """``q(t) = t + phi(t) / Phi(t)``, positive, to about 1e-14 relative: directly (by
    ``erfcx``) above ``t = -4``, below by Laplace's continued fraction of the Mills ratio,
    ``q(-x) = 1 / (x + 2 / (x + 3 / (x + ...)))`` (40 terms), where the sum would cancel."""
    t = np.asarray(t, float)
    out = np.empty_like(t)
    near = t > -4.0
    out[near] = t[near] + math.sqrt(2 / math.pi) / special.erfcx(-t[near] / math.sqrt(2))
    x = -t[~near]
    f = x.copy()
    for j in range(40, 1, -1):
        f = x + j / f
    out[~near] = 1.0 / f
    return out


def delta_from_mu(mu: float, eps: float) -> float:
    """delta(eps) of mu-GDP: ``Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``.

    [DRS19] Corollary 2.13; evaluated in log space so large eps does not overflow.  Needs
    ``mu >= 0`` (0 at ``mu = 0``) and ``eps >= 0`` (the formula is no privacy profile
    below 0); a ValueError names a bad argument.

    With ``t1 = -eps/mu - mu/2``, ``t2 = t1 + mu`` the result is ``Phi(t2) (1 - e^D)``,
    ``D = eps + log Phi(t1) - log Phi(t2)``.  Where that difference of logs cancels (small
    mu, where the two terms nearly agree; huge mu or eps, where the logs are huge) D is
    computed without it: since ``t2^2 - t1^2 = -2 eps``, ``D = -integral_{t1}^{t2} q(t) dt``
    with ``q(t) = t + phi(t)/Phi(t) > 0`` (Gauss-Legendre for ``mu <= 2``), or, by
    ``Phi(t) = erfcx(-t/sqrt 2) e^{-t^2/2} / 2``, a difference of ``log erfcx``.  Accurate
    to about 1e-12 relative for every mu and eps (checked against mpmath).
    """
    mu = _number("mu", mu, "be a number >= 0", lambda x: x >= 0)  # NaN fails too
    eps = _number("eps", eps, "be a number >= 0", lambda x: x >= 0)
    if mu == 0 or eps == math.inf:
        return 0.0
    if mu == math.inf:
        return 1.0
    t1, t2 = -eps / mu - mu / 2, -eps / mu + mu / 2
    if t2 < -40.0:  # delta < Phi(-40) < 1e-349: 0 in floating point
        return 0.0
    a = special.log_ndtr(t2)
    b = eps + special.log_ndtr(t1)
    d = b - a
    # rounding in d (a few ulps of its terms) against the size of 1 - e^d it must resolve
    err = 1e-15 * (eps + abs(b - eps) + abs(a))
    if not (d < 0 and (d == -math.inf or err * math.exp(d) <= 1e-12 * -math.expm1(d))):
        if mu <= 2.0:
            nodes, weights = _GAUSS_LEGENDRE
            d = -(mu / 2) * float(weights @ _normal_log_slope_plus_t(t1 + (nodes + 1) * mu / 2))
        else:
            s1, s2 = -t1 / math.sqrt(2), -t2 / math.sqrt(2)
            d = (math.log(special.erfcx(s1)) - math.log(special.erfcx(s2)) if t2 <= 0 else
                 -t2 * t2 / 2 + math.log(special.erfcx(s1) / 2) - special.log_ndtr(t2))
    return float(np.exp(a) * -np.expm1(min(d, 0.0)))


def eps_from_mu(mu: float, delta: float) -> float:
    """The smallest eps with mu-GDP => (eps, delta)-DP ([DRS19] Corollary 2.13).

    Solves ``delta_from_mu(mu, eps) = delta`` for eps >= 0 (the function decreases in eps);
    0 when already ``delta_from_mu(mu, 0) <= delta``.  ``mu = inf``, or a mu so large that
    eps (about ``mu^2 / 2``) is beyond floating point, gives ``inf``.  Needs ``mu >= 0`` and
    ``0 < delta < 1``; a ValueError names a bad argument.
    """
    mu = _number("mu", mu, "be a number >= 0", lambda x: x >= 0)
    delta = _check_level("delta", delta)
    if np.isinf(mu):
        return float("inf")
    if delta_from_mu(mu, 0.0) <= delta:
        return 0.0
    top = np.finfo(float).max
    hi = min(max(1.0, mu * mu), top)
    while delta_from_mu(mu, hi) > delta:
        if hi == top:
            return math.inf
        hi = min(2 * hi, top)
    return float(optimize.brentq(lambda e: delta_from_mu(mu, e) - delta, 0.0, hi, xtol=1e-12,
                                 rtol=1e-12))


def eps_gdp_estimate(mu: float, delta: float) -> float:
    """eps at ``delta`` of mu-GDP for a lower bound ``mu``: 0 for ``mu <= 0`` (a lower bound
    below 0 says nothing), ``inf`` at ``delta = 0`` (which no mu > 0 satisfies). An
    *estimate* of eps: it holds only if the mechanism's trade-off curve is exactly Gaussian,
    which subsampled DP-SGD's is not.  A ValueError names a bad argument."""
    mu = _number("mu", mu, "be a number (a lower bound on mu)")
    delta = _check_delta(delta)
    if mu <= 0:
        return 0.0
    return math.inf if delta == 0 else eps_from_mu(mu, delta)


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


def _one_run_counts(m, r, v):
    """m, r, v of a one-run audit as int64 arrays: whole numbers with 0 <= v <= r <= m, m >= 1."""
    given = m, r, v
    m, r, v = _whole("m", m), _whole("r", r), _whole("v", v)
    _broadcast(m=m, r=r, v=v)
    if np.any(m < 1):
        raise ValueError(f"m={given[0]!r}: must be >= 1 (the number of canaries)")
    if np.any(r < 0) or np.any(r > m):
        raise ValueError(f"r={given[1]!r}: must satisfy 0 <= r <= m (m={given[0]!r})")
    if np.any(v < 0) or np.any(v > r):
        raise ValueError(f"v={given[2]!r}: must satisfy 0 <= v <= r (r={given[1]!r})")
    return m, r, v


def eps_lb_one_run(m, r, v, delta: float = 0.0, beta: float = 0.05):
    """One-run audit bound of [SNJ23]: m canaries, r guesses (the rest abstain), v correct.

    Pure eps ([SNJ23] Thm. 1; eq. 1 of the HW3 homework): the largest eps with
    ``P[Bin(r, e^eps/(1+e^eps)) >= v] <= beta``.  That tail is the regularized incomplete
    beta function ``I_q(v, r - v + 1)``, so the boundary is the Clopper-Pearson lower
    bound ``q* = Beta(beta; v, r - v + 1)`` and ``eps = logit(q*)``, in closed form.  With
    ``delta > 0``: the largest eps at which the Appendix D p-value is still below beta,
    by bisection as in the authors' ``get_eps_audit``.  Broadcasts over m, r, v.
    """
    m, r, v = np.broadcast_arrays(*_one_run_counts(m, r, v))
    _check_level("beta", beta)
    _check_delta(delta)
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


def eps_lb_hoeffding(r, v, beta: float = 0.05):
    """Closed-form (looser) pure-eps one-run bound from Hoeffding's inequality.

    The homework's optional exercise (HW3 of DA 5001/6400, IIT Madras, 2024, Thm. 2):
    eps-DP gives ``P[N_correct >= t] <= P[Bin(r, q) >= t]`` with
    ``q = e^eps / (1 + e^eps)``, and Hoeffding gives
    ``P[Bin(r, q) >= v] <= exp(-2 r (v/r - q)^2)`` for ``v/r > q``.  Setting the right
    side to ``beta`` gives ``q* = v/r - sqrt(ln(1/beta) / (2 r))``; every eps with
    ``q(eps) <= q*`` is rejected at level ``beta``, so ``eps = logit(q*)`` (0 when
    ``q* <= 1/2``) is a lower bound valid with probability ``1 - beta``.  It never exceeds
    the exact binomial bound :func:`eps_lb_one_run` ``(m, r, v, 0, beta)``.  Broadcasts
    over ``r`` and ``v`` (``r`` guesses, ``v`` of them correct).
    """
    r, v = _broadcast(r=_whole("r", r), v=_whole("v", v))
    if np.any(r < 1):
        raise ValueError(f"r={r!r}: must be >= 1 (the number of guesses)")
    if np.any(v < 0) or np.any(v > r):
        raise ValueError(f"v={v!r}: must satisfy 0 <= v <= r")
    _check_level("beta", beta)
    r, v = r.astype(float), v.astype(float)
    q = v / r - np.sqrt(np.log(1.0 / beta) / (2.0 * r))
    with np.errstate(divide="ignore", invalid="ignore"):
        eps = np.where(q > 0.5, special.logit(np.clip(q, 0.5, 1.0)), 0.0)
    return _scalar_or_array(eps)


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


#: How :func:`threshold_holdout_audit` breaks ties between equally good thresholds.
TIES = ("first", "youden")


def _scan(scores_pos, scores_neg, bound: Bound, alpha: float, thresholds,
          centre: bool = True, ties: str = "first") -> ThresholdAudit:
    """The best of ``thresholds`` (ascending distinct scores, ``-inf`` first). Every
    threshold up to the next score makes the same decisions on these scores; with
    ``centre`` the middle of that gap is returned, which keeps a margin on fresh trials
    (the score itself would sit on, e.g., the largest negative score when the sides
    separate). Ties: the lowest threshold (``"first"``) or the largest TPR - FPR."""
    ct_pos, ct_neg = _counts_above(scores_pos, scores_neg, thresholds)
    n_pos, n_neg = len(scores_pos), len(scores_neg)
    raw = bound(ct_pos, n_pos, ct_neg, n_neg, alpha)
    values = np.atleast_1d(raw)
    if values.dtype.kind not in "iuf" or values.shape not in ((1,), ct_pos.shape) or np.any(
            np.isnan(values)):
        raise ValueError(f"bound={bound!r} returned {raw!r}: must return a real number (not "
                         f"NaN) for each of the {ct_pos.size} thresholds")
    if ties == "youden":
        youden = np.broadcast_to(ct_pos / n_pos - ct_neg / n_neg, values.shape)
        i = int(np.lexsort((-np.arange(values.size), youden, values))[-1])
    else:
        i = int(np.argmax(values))
    threshold = float(thresholds[i])
    above = np.concatenate([scores_pos, scores_neg])
    above = above[above > threshold]
    if centre and np.isfinite(threshold) and above.size and np.isfinite(above.min()):
        threshold = 0.5 * (threshold + float(above.min()))
    return ThresholdAudit(float(values[i]), threshold, int(ct_pos[i]), n_pos,
                          int(ct_neg[i]), n_neg)


def scores_array(name: str, scores, min_size: int = 1) -> np.ndarray:
    """``scores``, one-dimensional real numbers, as a float array; a ValueError naming
    ``name`` (the argument's name in messages) if it has fewer than ``min_size`` entries, a
    NaN (infinite scores order like any other), or is not such an array (text, booleans and
    complex numbers are refused, not converted)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name={name!r}: must be a non-empty string (the scores' name in "
                         f"messages)")
    min_size = _check_k(min_size, "min_size", low=0)
    a = _real(name, scores, "be a one-dimensional array of real numbers")
    if a.ndim != 1:
        raise ValueError(f"{name} has shape {a.shape}: must be one-dimensional (one score "
                         f"per trial)")
    a = a.astype(float)
    if a.size < min_size:
        raise ValueError(f"{name} has {a.size} scores: need at least {min_size}")
    if np.isnan(a).any():
        raise ValueError(f"{name} has {int(np.isnan(a).sum())} NaN scores (of {a.size}): "
                         f"need numbers (infinities are fine)")
    return a


def _as_scores(scores_pos, scores_neg):
    return scores_array("scores_pos", scores_pos, 2), scores_array("scores_neg", scores_neg, 2)


def _check_bound(bound: Bound, alpha: float) -> float:
    """A valid ``alpha``, and a ``bound`` callable as ``bound(ct_pos, n_pos, ct_neg, n_neg,
    alpha)`` (the threshold procedures)."""
    alpha = _check_level("alpha", alpha)
    allowed = "be callable as bound(ct_pos, n_pos, ct_neg, n_neg, alpha), e.g. eps_lb_katz"
    if not callable(bound):
        raise ValueError(f"bound={bound!r}: must {allowed}")
    try:
        inspect.signature(bound).bind(0, 1, 0, 1, alpha)
    except TypeError:
        raise ValueError(f"bound={bound!r}: must {allowed}") from None
    except ValueError:  # no signature to check (some builtins): calling it will tell
        pass
    return alpha


def threshold_split_audit(scores_pos, scores_neg, bound: Bound, alpha: float,
                          select_frac: float = 0.5) -> ThresholdAudit:
    """Pick the threshold on the first trials, evaluate the bound on the rest.

    The first ``select_frac`` of each side's trials choose the threshold maximizing
    ``bound`` (at the same alpha); the bound is then computed at that threshold on the
    remaining, independent trials only, so the confidence level needs no correction.  This
    is the reference code's procedure ([JUO20], ``audit.py``: 500 trials choose, 500
    evaluate).  Trials must be exchangeable (independent runs), so their order is the split.
    """
    return threshold_holdout_audit(*split_trials(scores_pos, scores_neg, select_frac), bound,
                                   alpha)


def split_trials(scores_pos, scores_neg, select_frac: float = 0.5):
    """``(select_pos, select_neg, eval_pos, eval_neg)``: the first ``select_frac`` of each
    side's trials, and the rest (the split of :func:`threshold_split_audit`)."""
    sp, sn = _as_scores(scores_pos, scores_neg)
    select_frac = _check_level("select_frac", select_frac)
    cut_p, cut_n = int(len(sp) * select_frac), int(len(sn) * select_frac)
    if min(cut_p, cut_n, len(sp) - cut_p, len(sn) - cut_n) < 1:
        raise ValueError(f"select_frac={select_frac!r} of {len(sp)} positive and {len(sn)} "
                         f"negative trials: must leave at least one trial of each side to "
                         f"select and one to evaluate (too few trials to split)")
    return sp[:cut_p], sn[:cut_n], sp[cut_p:], sn[cut_n:]


def threshold_holdout_audit(val_pos, val_neg, eval_pos, eval_neg, bound: Bound, alpha: float,
                            ties: str = "first") -> ThresholdAudit:
    """Choose the threshold on validation trials, evaluate the bound on independent ones.

    Over every distinct decision "score > t" on the validation scores, the threshold
    maximizing ``bound`` at ``alpha`` (ties: ``"first"``, the lowest threshold, or
    ``"youden"``, the largest validation TPR - FPR); ``bound`` is then evaluated at that
    threshold on the evaluation trials alone, which the choice never saw, so it holds at
    ``1 - alpha`` with no correction.  The returned counts are the evaluation counts.
    """
    vp, vn = scores_array("val_pos", val_pos), scores_array("val_neg", val_neg)
    ep, en = scores_array("eval_pos", eval_pos), scores_array("eval_neg", eval_neg)
    _check_bound(bound, alpha)
    if not isinstance(ties, str) or ties not in TIES:
        raise ValueError(f"ties={ties!r}: must be one of {TIES}")
    chosen = _scan(vp, vn, bound, alpha, _candidates(vp, vn), ties=ties)
    return _scan(ep, en, bound, alpha, np.array([chosen.threshold]), centre=False)


def threshold_scan_audit(scores_pos, scores_neg, bound: Bound, alpha: float) -> ThresholdAudit:
    """Scan every threshold on all trials with a union bound over count values.

    Every threshold is evaluated at the fixed level ``a = 2 alpha / (n_pos + n_neg)``, each
    side's one-sided bound at ``a / 2``.  Why that holds for all thresholds at once: as the
    threshold moves, the true TPR and the count of positives above it both only fall, so
    "the TPR bound fails at some threshold with count c" is the event "count >= c at the
    one threshold where the TPR first drops below the bound for c", of probability at most
    ``a / 2``; there are at most n_pos such c (and n_neg for the FPR), so everything holds
    with probability ``1 - alpha``.  (A level of alpha over the number of distinct scores
    would be a union over a data-chosen set; with ties it can be larger than this one.)
    Uses every trial, at the price of the factor ``(n_pos + n_neg) / 2`` in the level.
    """
    sp, sn = _as_scores(scores_pos, scores_neg)
    alpha = _check_bound(bound, alpha)
    return _scan(sp, sn, bound, 2 * alpha / (len(sp) + len(sn)), _candidates(sp, sn))


# ---- the reference code's Table 2 procedure, and how much one split moves a bound ----

def _scores_by_k(scores_pos) -> dict[int, np.ndarray]:
    """``{k: scores}`` of the D1 sides, each k a whole number >= 1 (sorted), scores in trial
    order (at least 2 each); a ValueError names a bad k or score array."""
    if not isinstance(scores_pos, Mapping) or not scores_pos:
        raise ValueError(f"scores_pos={type(scores_pos).__name__}: must be a non-empty "
                         f"mapping {{k: scores of the D1 side with k canaries}}")
    out = {_check_k(k, "scores_pos key k"): scores_array(f"scores_pos[{k!r}]", s, 2)
           for k, s in scores_pos.items()}
    return dict(sorted(out.items()))


#: The reference code's levels ([JUO20], ``bkd_parser.py``): the margin of its threshold
#: search, and the Clopper-Pearson level of its evaluation (0.005 in each tail).
PAPER_SELECT_ALPHA = 0.05
PAPER_ALPHA = 0.01


@dataclass(frozen=True)
class PaperRuleAudit:
    """Result of :func:`eps_lb_paper_rule`. ``value``: the largest per-k value (its
    ``best_k``), NOT itself a ``1 - alpha`` bound; ``per_k``: each k's value, a
    ``1 - alpha`` bound on pure eps; ``thresholds``: each k's threshold (the attack says
    "in" when ``score >= t``); ``counts``: each k's evaluation counts
    ``(ct_pos, n_pos, ct_neg, n_neg)``."""

    value: float
    best_k: int
    per_k: dict
    thresholds: dict
    counts: dict


def _paper_threshold(val_pos: np.ndarray, val_neg: np.ndarray, select_alpha: float) -> float:
    """The reference's threshold search (``bkd_find_thresh`` with ``use_dkw=True``), vectorised:
    over every distinct selection score t (ascending), p1 and p0 = shares of the D1 and D0
    scores ``>= t``, ``lb = p1 - m1``, ``ub = p0 + m0`` with ``m = sqrt(ln(2/select_alpha)/n)``
    (no factor 2 under the root, as the reference), ``ratio = (1-ub)/(1-lb)`` if
    ``ub + lb > 1`` else ``lb/ub``; the first t of the largest ``ln(ratio)`` (NaN from a
    negative ratio never wins), the lowest score if none is finite."""
    t = np.unique(np.concatenate([val_pos, val_neg]))
    p1 = (len(val_pos) - np.searchsorted(np.sort(val_pos), t, side="left")) / len(val_pos)
    p0 = (len(val_neg) - np.searchsorted(np.sort(val_neg), t, side="left")) / len(val_neg)
    c = math.log(2 / select_alpha)
    lb, ub = p1 - math.sqrt(c / len(val_pos)), p0 + math.sqrt(c / len(val_neg))
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.log(np.where(ub + lb > 1, (1 - ub) / (1 - lb), lb / ub))
    e = np.where(np.isnan(e), -np.inf, e)
    i = int(np.argmax(e))
    return float(t[i]) if np.isfinite(e[i]) else float(t[0])


def eps_lb_paper_rule(scores_pos, scores_neg, select_frac: float = 0.5,
                      select_alpha: float = PAPER_SELECT_ALPHA,
                      alpha: float = PAPER_ALPHA) -> PaperRuleAudit:
    """The reference code's Table 2 procedure ([JUO20], ``bkd_parser.py``), exactly.

    ``scores_pos``: ``{k: scores of the D1 side with k canaries}``, ``scores_neg``: the D0
    scores (one D0 for every k), each in trial order, higher = "in" (the reference scores
    ClipBKD by the raw logit ``f(x_p)_{y_p}``). For each k: the first ``select_frac`` of each
    side's trials choose a threshold t among their scores (test ``score >= t``) by a
    DKW-style margin at ``select_alpha`` (:func:`_paper_threshold`); on the remaining
    trials, Clopper-Pearson intervals at ``1 - alpha`` (``alpha / 2`` in each tail) give
    ``p1_lo`` (D1 share ``>= t``) and ``p0_hi`` (D0 share), ``ratio = (1 - p0_hi) /
    (1 - p1_lo)`` if ``p0_hi + p1_lo > 1`` else ``p1_lo / p0_hi``, and the value is
    ``ln(ratio) / k`` (delta = 0), floored at 0 (the reference reports negative values).

    What it is: each per-k value is a ``1 - alpha`` lower bound on the eps of pure
    (delta = 0) DP for groups of k rows (the threshold never saw the evaluation trials).
    What it is not: ``value``, the largest over k, is a maximum of several ``1 - alpha``
    bounds and not itself one (``eps_lb`` of the audits tests every k at
    ``alpha / len(ks)``); it ignores delta, so against an (eps, delta > 0) claim it can
    overstate the bound slightly; and it differs from this module's threshold choice
    (which maximises the bound itself), so it is kept only to compare with the paper's
    numbers, which it reproduces.
    """
    pos = _scores_by_k(scores_pos)
    neg = scores_array("scores_neg", scores_neg, 2)
    select_frac = _check_level("select_frac", select_frac)
    select_alpha = _check_level("select_alpha", select_alpha)
    alpha = _check_level("alpha", alpha)
    per_k, thresholds, counts = {}, {}, {}
    for k, sp in pos.items():
        vp, vn, ep, en = split_trials(sp, neg, select_frac)
        t = _paper_threshold(vp, vn, select_alpha)
        ct_pos, ct_neg = int((ep >= t).sum()), int((en >= t).sum())
        p1_lo = float(clopper_pearson(ct_pos, len(ep), alpha)[0])
        p0_hi = float(clopper_pearson(ct_neg, len(en), alpha)[1])
        ratio = (1 - p0_hi) / (1 - p1_lo) if p0_hi + p1_lo > 1 else p1_lo / p0_hi
        per_k[k] = max(math.log(ratio) / k, 0.0) if ratio > 0 else 0.0
        thresholds[k], counts[k] = t, (ct_pos, len(ep), ct_neg, len(en))
    best = max(per_k, key=lambda k: (per_k[k], -k))  # the first k of the largest value
    return PaperRuleAudit(per_k[best], best, per_k, thresholds, counts)


@lru_cache(maxsize=64)
def _cp_table(n_pos: int, n_neg: int, alpha: float, delta: float, k: int) -> np.ndarray:
    """:func:`eps_lb_clopper_pearson` at every count pair: ``table[ct_pos, ct_neg]``."""
    return np.asarray(eps_lb_clopper_pearson(np.arange(n_pos + 1)[:, None], n_pos,
                                             np.arange(n_neg + 1)[None, :], n_neg, alpha,
                                             delta, k))


def _suffix_counts(idx: np.ndarray, n_values: int) -> np.ndarray:
    """``out[s, j]`` = entries of row s of ``idx`` (value indices) that are ``>= j``,
    for ``j = 0..n_values``."""
    S = idx.shape[0]
    flat = (np.arange(S)[:, None] * n_values + idx).ravel()
    hist = np.bincount(flat, minlength=S * n_values).reshape(S, n_values)
    return np.concatenate([np.cumsum(hist[:, ::-1], axis=1)[:, ::-1],
                           np.zeros((S, 1), np.int64)], axis=1)


def _resplit_one_k(pos: np.ndarray, neg: np.ndarray, order_pos: np.ndarray,
                   order_neg: np.ndarray, select_frac: float, level: float, delta: float,
                   k: int) -> np.ndarray:
    """:func:`threshold_holdout_audit` of the Clopper-Pearson bound at ``level`` for each
    split (row) of ``order_pos``/``order_neg`` (trial orders: the first ``select_frac``
    select), all splits at once: the same threshold, its centring and its value."""
    S = order_pos.shape[0]
    cut_p, cut_n = int(len(pos) * select_frac), int(len(neg) * select_frac)
    u = np.unique(np.concatenate([pos, neg]))  # every score of the cell, ascending
    J = len(u)
    ip, ineg = np.searchsorted(u, pos)[order_pos], np.searchsorted(u, neg)[order_neg]
    sel_p, sel_n = _suffix_counts(ip[:, :cut_p], J), _suffix_counts(ineg[:, :cut_n], J)
    ev_p, ev_n = _suffix_counts(ip[:, cut_p:], J), _suffix_counts(ineg[:, cut_n:], J)
    # Candidates: "score > -inf" (column 0), then "score > u_j" (column j + 1). Every
    # distinct decision on the selection trials appears, first at the selection score
    # that _candidates would give, so the first maximum is the same threshold.
    table = _cp_table(cut_p, cut_n, level, delta, k)
    first = slice(1, 2) if u[0] == -np.inf else slice(0, 1)  # "> -inf" leaves out -inf
    values = table[np.concatenate([sel_p[:, first], sel_p[:, 1:]], axis=1),
                   np.concatenate([sel_n[:, first], sel_n[:, 1:]], axis=1)]
    c = np.argmax(values, axis=1)  # first maximum
    rows = np.arange(S)
    # Centre as _scan: midway to the next selection score above the chosen one.
    has = (sel_p[:, :-1] - sel_p[:, 1:] + sel_n[:, :-1] - sel_n[:, 1:]) > 0  # (S, J)
    nxt = np.where(has, np.arange(J), J)
    nxt = np.concatenate([np.minimum.accumulate(nxt[:, ::-1], axis=1)[:, ::-1],
                          np.full((S, 1), J)], axis=1)
    theta = np.where(c > 0, u[np.maximum(c - 1, 0)], -np.inf)
    j_next = nxt[rows, c]  # for c > 0: the first selection score index > c - 1
    upper = u[np.minimum(j_next, J - 1)]
    centre = (c > 0) & (j_next < J) & np.isfinite(theta) & np.isfinite(upper)
    theta = np.where(centre, 0.5 * (theta + upper), theta)
    above = np.searchsorted(u, theta, side="right")  # eval scores > theta: index >= above
    return _cp_table(len(pos) - cut_p, len(neg) - cut_n, level, delta, k)[
        ev_p[rows, above], ev_n[rows, above]]


def _resplit_orders(n: int, splits: int, rng: np.random.Generator) -> np.ndarray:
    """``splits`` uniformly random orders of ``n`` trials, one per row."""
    return rng.permuted(np.tile(np.arange(n), (splits, 1)), axis=1)


#: Most ``splits x trials`` :func:`eps_lb_resplits` draws (its arrays take about 40 bytes
#: per entry: 10**8 is about 4 GB).
_MAX_RESPLIT_ENTRIES = 10**8


def _check_seed(seed):
    """An int >= 0 or a ``numpy.random.SeedSequence`` (:mod:`dpaudit.seeds` makes them):
    what makes the same draws on every call (None, a Generator, booleans, floats, text and
    negative numbers are refused)."""
    if isinstance(seed, np.random.SeedSequence) or (
            isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) and seed >= 0):
        return seed
    raise ValueError(f"seed={seed!r}: must be an int >= 0 or a numpy.random.SeedSequence "
                     f"(re-splits must be reproducible)")


def _check_orders(orders, n_neg: int, n_pos: dict[int, int]):
    """``(order_neg, {k: order_pos})`` as int arrays of shape ``(splits, n)``, each row a
    permutation of the ``n`` trials of its side, the ks those of the scores."""
    allowed = "be None or a pair (order_neg, {k: order_pos}) of (splits, n) arrays"
    if not isinstance(orders, (tuple, list)) or len(orders) != 2 or not isinstance(
            orders[1], Mapping):
        raise ValueError(f"orders={type(orders).__name__}: must {allowed}")
    if set(orders[1]) != set(n_pos):
        raise ValueError(f"orders: the D1 orders are for k in {sorted(orders[1], key=repr)}, "
                         f"the scores for k in {sorted(n_pos)}: must be the same ks")
    order_neg = _whole("orders: order_neg", orders[0])
    order_pos = {k: _whole(f"orders: order_pos[{k}]", orders[1][k]) for k in n_pos}
    splits = len(order_neg) if order_neg.ndim == 2 else None
    for name, o, n in [("order_neg", order_neg, n_neg),
                       *((f"order_pos[{k}]", order_pos[k], n_pos[k]) for k in n_pos)]:
        if o.ndim != 2 or o.shape != (splits, n):
            raise ValueError(f"orders: {name} has shape {o.shape}: need "
                             f"({splits or 'splits'}, {n}), one row per split")
        if np.any(np.sort(o, axis=1) != np.arange(n)):
            raise ValueError(f"orders: {name} has a row that is no order of the {n} trials: "
                             f"each row must be a permutation of 0..{n - 1}")
    return order_neg, order_pos


def eps_lb_resplits(scores_pos, scores_neg, alpha: float, delta: float = 0.0,
                    select_frac: float = 0.5, splits: int = 200, seed=0,
                    orders: tuple | None = None) -> np.ndarray:
    """The certified bound of an audit recomputed on ``splits`` random re-splits of the
    same trials: a diagnostic of how much the choice of selection trials moves it.

    The audit is that of the Jagielski audits' ``eps_lb``: for each k
    (``scores_pos = {k: D1 scores}``, ``scores_neg`` the D0 scores shared by every k),
    :func:`threshold_holdout_audit` of :func:`eps_lb_clopper_pearson` at
    ``alpha / len(ks)`` with ``delta`` and k (threshold chosen on ``select_frac`` of each
    side's trials, evaluated on the rest), the largest over k. Each re-split draws a new
    random order of each side's trials (one for D0, shared by every k, one per D1 side)
    from ``seed`` (an int >= 0 or a ``numpy.random.SeedSequence``); ``orders = (order_neg,
    {k: order_pos})``, arrays of shape ``(S, n)`` whose rows permute each side's trials,
    gives ``S`` of them instead (the identity order is the pre-registered split; ``splits``
    and ``seed`` are then unused). All splits are computed at once from tables of the bound
    at every count pair, so ``splits`` times the number of trials is at most 10**8 (about
    4 GB).

    Returns the ``splits`` values. Each one alone is a ``1 - alpha`` lower bound, but
    their spread, or a quantile or maximum over splits, is no bound at all (choosing the
    split after seeing its value voids the level): only a split fixed in advance
    certifies.
    """
    pos = _scores_by_k(scores_pos)
    neg = scores_array("scores_neg", scores_neg, 2)
    alpha, delta = _check_level("alpha", alpha), _check_delta(delta)
    select_frac = _check_level("select_frac", select_frac)
    for sp in pos.values():  # each k's split leaves trials to select and to evaluate
        split_trials(sp, neg, select_frac)
    splits = _check_k(splits, "splits")
    seed = _check_seed(seed)
    trials = len(neg) + sum(len(sp) for sp in pos.values())
    if orders is None:
        if splits * trials > _MAX_RESPLIT_ENTRIES:
            raise ValueError(f"splits={splits}: must be at most "
                             f"{_MAX_RESPLIT_ENTRIES // trials} for {trials} trials (every "
                             f"split's trial order is held in memory: splits x trials <= "
                             f"{_MAX_RESPLIT_ENTRIES:.0e})")
        rng = np.random.default_rng(seed)
        order_neg = _resplit_orders(len(neg), splits, rng)
        order_pos = {k: _resplit_orders(len(s), splits, rng) for k, s in pos.items()}
    else:
        order_neg, order_pos = _check_orders(orders, len(neg),
                                             {k: len(s) for k, s in pos.items()})
    level = alpha / len(pos)
    out = None
    for k, sp in pos.items():
        v = _resplit_one_k(sp, neg, order_pos[k], order_neg, select_frac, level, delta, k)
        out = v if out is None else np.maximum(out, v)
    return out


# ---- one-run audits in f-DP (Mahloujifar et al. 2025) ----
# [MMC25] (see the module docstring): the bound on P[at least v of r guesses correct] for an
# f-DP mechanism, by a recursion over the number of correct guesses, turned into audits.


def _fdp_args(m, r, v, beta) -> tuple[int, int, int]:
    """Scalar one-run counts (:func:`_one_run_counts`) with ``m >= 1``, and a valid beta."""
    for name, a in (("m", m), ("r", r), ("v", v)):
        if np.ndim(a):
            raise ValueError(f"{name}={a!r}: must be a single whole number")
    m, r, v = (int(a) for a in _one_run_counts(m, r, v))
    _check_level("beta", beta)
    return m, r, v


def _fdp_one_run_rejects(inv_blowup: Callable[[np.ndarray], np.ndarray], n: int, m: int,
                         r: int, v: int, beta: float) -> np.ndarray:
    """Does the [MMC25] analysis reject each of ``n`` hypothesised trade-off functions?

    ``inv_blowup(y)`` maps an array of ``n`` probabilities (one per hypothesis) to
    ``f(1 - y)``: the least probability an event can have under one neighbouring input when
    it has probability ``y`` under the other.  Returns a boolean array: True where "the
    mechanism is f-DP" and "at least ``v`` of ``r`` guesses correct with probability
    ``>= beta``" contradict each other, i.e. where f-DP is rejected at level ``beta``.
    """
    cap = r / m  # P[the uniformly drawn canary I is guessed] exactly: r guesses always
    # state at level v: mass beta placed at exactly v correct (the extremal case)
    corr = np.full(n, beta * v / m)
    wrong = np.full(n, beta * (r - v) / m)
    for i in range(v - 1, -1, -1):
        need = inv_blowup(np.minimum(corr, 1.0)) - wrong
        live = (need > 0.0) & (corr + wrong <= cap)
        if not live.any():  # every hypothesis frozen (need <= 0 stays so) or already over
            break
        np.maximum(need, 0.0, out=need)
        corr += (i / (r - i)) * need
        wrong += need
    return corr + wrong > cap


def _fdp_largest_rejected(inv_blowup_factory, m: int, r: int, v: int, beta: float,
                          lo: float = 1e-6, hi: float = 100.0, n: int = 256,
                          refine: int = 2) -> float:
    """Lower end of the bracket of the smallest parameter NOT rejected (0.0 if ``lo`` is not).

    ``inv_blowup_factory(params)`` returns the vectorised ``y -> f_param(1 - y)`` for an
    array of parameters, the trade-off growing weaker as the parameter grows (rejection is
    then monotone: a prefix of any increasing grid).  One geometric grid of ``n`` points on
    ``[lo, hi]``, then ``refine`` linear grids inside the bracket (relative precision about
    ``1e-6`` with the defaults).  The answer is the largest grid value below the first
    non-rejected one: all smaller tested values were rejected, so it never overshoots.
    Values above ``hi`` are reported as ``hi``.
    """
    if v == 0:
        return 0.0
    grid = np.geomspace(lo, hi, n)
    for _ in range(refine + 1):
        rej = _fdp_one_run_rejects(inv_blowup_factory(grid), grid.size, m, r, v, beta)
        j = int(np.argmin(rej)) if not rej.all() else grid.size
        if j == 0:  # only in the first round: later grids start at a rejected value
            return 0.0
        if j == grid.size:
            return float(grid[-1])
        grid = np.linspace(grid[j - 1], grid[j], n)[:-1]  # grid[j-1] is rejected, grid[j] not
    return float(grid[0])  # rejected; the next grid value up was not


def mu_lb_one_run_gdp(m, r, v, beta: float = 0.05) -> float:
    """One-run audit of mu-GDP by the analysis of [MMC25]: the largest mu rejected at ``beta``.

    Setting as in :func:`eps_lb_one_run`: ``m`` canaries, each included independently with
    probability 1/2, the auditor guesses in/out on ``r`` of them (abstains on the rest) and
    ``v`` guesses are correct.  The hypothesis "the mechanism is mu-GDP", i.e. ``f``-DP with
    ``f = G_mu``, ``G_mu(x) = Phi(Phi^{-1}(1 - x) - mu)`` ([DRS19]), is rejected when the
    [MMC25] bound on ``P[at least v of r guesses correct]`` under f-DP is below ``beta``.

    The bound ([MMC25], guessing game, computed by a recursion over the number of correct
    guesses).  Draw a canary ``I`` uniformly from the ``m``, let ``T`` be the number of
    correct guesses and, for ``i = 0..r``, ``C_i = P[I guessed right and T >= i]``,
    ``W_i = P[I guessed wrong and T >= i]``.  Exactly ``r`` guesses are made, so
    (1) ``C_0 + W_0 = r / m``, and since ``T = i`` means ``i`` right and ``r - i`` wrong
    guesses, (2) ``C_i - C_{i+1} = i / (r - i) * (W_i - W_{i+1})``.  Flipping canary ``I``'s
    membership turns a right guess with ``T >= i + 1`` into a wrong one with ``T >= i``;
    f-DP for that neighbouring pair and convexity of ``y -> f(1 - y)`` (Jensen over ``I``,
    the other canaries and the two memberships) give (3) ``W_i >= f(1 - C_{i+1})``, and
    trivially ``W_i >= W_{i+1}``.  If ``P[T >= v] >= beta`` then, with that mass put at
    exactly ``v`` correct, the recursion from ``C_v = beta v / m``,
    ``W_v = beta (r - v) / m`` downwards, taking at each ``i = v-1, ..., 0`` the least
    ``W_i = max(W_{i+1}, f(1 - C_{i+1}))`` that (3) allows and ``C_i`` from (2), yields the
    least total mass any f-DP mechanism needs; if ``C_0 + W_0 > r / m`` this contradicts
    (1), so ``P[T >= v] < beta`` under f-DP.  (That this greedy recursion is the optimum of
    constraints (1)-(3) was checked against a linear program in ``tests/test_bounds_fdp.py``.)
    Rejection is monotone in mu (``G_mu`` decreases in mu), so the boundary is found on a
    geometric grid refined twice (relative precision ~1e-6; values above 100 read as 100),
    every grid point evaluated at once: one vectorised pass of the recursion per grid.

    Returns the largest mu rejected (the lower end of the last bracket), 0.0 when nothing is
    rejected (e.g. ``v <= r / 2`` at ``beta < 1/2``).  With probability at least
    ``1 - beta`` the mechanism is not mu'-GDP for any mu' below it.  ``eps_from_mu(mu, delta)``
    of the result is only an *estimate* of epsilon at delta: it assumes the mechanism's
    trade-off curve has the GDP shape, and is not a certified bound; for a certified lower
    bound on epsilon at delta use :func:`eps_lb_one_run_fdp`.  Scalar arguments
    (numpy integers accepted); a ValueError names any bad argument.
    """
    m, r, v = _fdp_args(m, r, v, beta)

    def factory(mu: np.ndarray):
        return lambda y: special.ndtr(special.ndtri(y) - mu)

    return _fdp_largest_rejected(factory, m, r, v, beta)


def eps_lb_one_run_fdp(m, r, v, delta: float, beta: float = 0.05) -> float:
    """One-run audit of (eps, delta)-DP by the f-DP analysis of [MMC25]: certified eps_LB.

    Same setting and recursion as :func:`mu_lb_one_run_gdp`, with the trade-off function of
    (eps, delta)-DP, ``f(x) = max(0, 1 - delta - e^eps x, e^-eps (1 - delta - x))``, i.e.
    ``f(1 - y) = max(0, e^-eps (y - delta), 1 - delta - e^eps (1 - y))`` in the recursion.
    Returns the largest eps at which (eps, delta)-DP is rejected at level ``beta`` (0.0 if
    none), on a geometric grid refined twice (relative precision ~1e-6; capped at 100): with
    probability at least ``1 - beta`` the mechanism is not (eps', delta)-DP for any eps'
    below it, a certified lower bound on epsilon at this delta.

    Compared with [SNJ23] (:func:`eps_lb_one_run` at the same delta): the recursion uses the
    (eps, delta) curve directly instead of the ``2 m delta`` term of their Appendix D. It is
    tighter for a perfect attack (``v = r``) at every delta > 0 and everywhere at
    delta >= 1e-3, but slightly *looser* (by 0.004-0.018 in eps at m = 100..2000) for
    ``v < r`` at delta <= 1e-5; at ``delta = 0`` it cannot beat [SNJ23], whose binomial tail
    is attained by randomized response (they agree at ``v = r``: ``eps = logit(beta^(1/r))``).
    ``tests/test_bounds_fdp.py`` pins these cases; audits report both.
    Nothing is rejected when ``beta <= delta`` (a mechanism that reveals every canary with
    probability delta is (0, delta)-DP).  Scalar arguments (numpy integers accepted); a
    ValueError names any bad argument.
    """
    m, r, v = _fdp_args(m, r, v, beta)
    _check_delta(delta)

    def factory(eps: np.ndarray):
        up, down = np.exp(eps), np.exp(-eps)
        return lambda y: np.maximum(np.maximum(down * (y - delta), 1.0 - delta - up * (1.0 - y)),
                                    0.0)

    return _fdp_largest_rejected(factory, m, r, v, beta)


# ---- one-run audits: the guess sweep ---------------------------------------------------

#: Most guess counts a one-run audit tests (:func:`guess_grid`); each is tested at
#: ``beta / (number tested)``.
GUESS_GRID_SIZE = 10
#: Largest ``size`` :func:`guess_grid` takes (its geometric grid is built in memory).
_MAX_GRID = 10**6


def guess_grid(k_max, beta: float = 0.05, size: int = GUESS_GRID_SIZE) -> np.ndarray:
    """The guess counts ``k`` a one-run audit tests, fixed before any score is seen: ``size``
    points geometric from ``k_min`` to ``k_max``, rounded, duplicates dropped (so at most
    ``size``; just ``[k_max]`` when ``k_max <= k_min``).

    ``k_min`` is the least k whose ``2k`` guesses, all right, can reject eps = 0 at
    ``beta / size``: ``P[Bin(2k, 1/2) = 2k] = 4^-k <= beta / size``; fewer guesses can
    certify nothing.  A function of ``k_max``, ``beta`` and ``size`` only, so testing every
    count at ``beta / len(grid)`` is a union bound over a set chosen in advance (testing
    every k = 1..K at beta / K instead costs a factor K / 10 in level: at m = 1000 and
    delta = 1e-5 Steinke et al.'s ``2 m delta`` term then exceeds the level).
    """
    k_max = _check_k(k_max, "k_max")
    _check_level("beta", beta)
    size = _check_k(size, "size")
    if size > _MAX_GRID:
        raise ValueError(f"size={size}: must be at most {_MAX_GRID} (the grid is built in "
                         f"memory)")
    k_min = max(1, math.ceil(math.log(size / beta) / math.log(4)))
    if k_max <= k_min:
        return np.array([k_max])
    return np.unique(np.round(np.geomspace(k_min, k_max, size)).astype(np.int64))


def guess_counts(scores, included, k_max) -> np.ndarray:
    """Correct guesses ``v_k`` for ``k = 1..k_max``: the ``k`` highest scores guessed "in",
    the ``k`` lowest "out" (``r = 2k`` guesses; the HW3 homework's ``m1 = m2 = k``).
    ``scores`` is ``(..., m)`` (higher = "in"), ``included`` the ``m`` true memberships
    (bool, 0/1, or signs with +1 = in); needs ``k_max <= m // 2`` so the two sets are
    disjoint.  A ValueError names a bad argument."""
    scores = _real("scores", scores, "be real numbers of shape (..., m)").astype(float)
    if scores.ndim == 0 or scores.shape[-1] < 2:
        raise ValueError(f"scores has shape {scores.shape}: need (..., m) with m >= 2")
    if np.isnan(scores).any():
        raise ValueError(f"scores has {int(np.isnan(scores).sum())} NaN entries: need "
                         f"numbers (infinities are fine)")
    allowed = "be bool, 0/1 or -1/+1 (+1 = in)"
    try:
        flags = np.asarray(included).dtype == bool
    except (TypeError, ValueError):  # ragged
        flags = False
    included = np.asarray(included) if flags else _real("included", included, allowed)
    if included.shape != scores.shape[-1:]:
        raise ValueError(f"included has shape {included.shape}: need ({scores.shape[-1]},)")
    if included.dtype != bool:
        values = set(np.unique(included).tolist())
        if not (values <= {0, 1} or values <= {-1, 1}):
            raise ValueError(f"included has values {sorted(values)}: must {allowed}")
    k_max = _check_k(k_max, "k_max")
    if k_max > scores.shape[-1] // 2:
        raise ValueError(f"k_max={k_max}: must lie in [1, m//2={scores.shape[-1] // 2}]")
    inc = included[np.argsort(-scores, axis=-1, kind="stable")] > 0
    return np.cumsum(inc[..., :k_max], axis=-1) + np.cumsum(~inc[..., ::-1][..., :k_max], axis=-1)


#: What each column of :func:`one_run_sweep` is (figures, tables and docs say the same).
SWEEP_COLUMNS = {
    "eps_lb": "certified (eps, delta) lower bound at 1 - beta: [SNJ23] Appendix D, the "
              "largest over the G guess counts of guess_grid, each at beta / G (Bonferroni)",
    "eps_lb_fdp": "certified (eps, delta) lower bound at 1 - beta by the f-DP analysis of "
                  "[MMC25], same guess counts and level",
    "mu_lb": "certified mu-GDP lower bound at 1 - beta ([MMC25] with Gaussian trade-off "
             "curves), same level, at best_k (the tested count of the largest eps_lb_fdp)",
    "eps_gdp": "estimate: eps at delta of mu_lb, assuming the mechanism is exactly mu-GDP",
    "eps_lb_pure": "certified pure-eps lower bound at 1 - beta: [SNJ23] Theorem 1, same "
                   "guess counts and level; not comparable with an eps at delta > 0",
    "eps_lb_pure_hoeffding": "certified pure-eps lower bound in closed form (Hoeffding), "
                             "same guess counts and level; never above eps_lb_pure",
    "eps_hat_max": "estimate: the HW3 homework's answer, the largest over every k = 1..K of "
                   "pure-eps bounds each at 1 - beta; a maximum of K bounds, not a 1 - beta "
                   "bound",
}


def _largest_below(bound: Callable[[int, int], float], r: np.ndarray, v: np.ndarray,
                   cap: np.ndarray) -> tuple[float, int]:
    """``max_j bound(r_j, v_j)`` (and its first ``j``) for a bound never above ``cap_j``:
    the counts in decreasing order of ``cap``, stopping once no cap can beat the best, so
    the result equals the full maximum at a fraction of its cost (``j`` of the largest cap
    when every bound is 0)."""
    best, at = 0.0, int(np.argmax(cap))
    for j in np.argsort(-cap, kind="stable"):
        if cap[j] <= best:
            break
        b = bound(int(r[j]), int(v[j]))
        if b > best:
            best, at = b, int(j)
    return best, at


def one_run_sweep(m, correct, delta: float, beta: float = 0.05, ks=None) -> dict:
    """The bounds of a one-run audit from the correct guesses ``correct`` ``(..., K)`` of
    ``k = 1..K`` (``r = 2k`` guesses each, :func:`guess_counts`).

    The certified columns test only the ``G`` guess counts ``ks`` (default
    :func:`guess_grid` of ``K`` and ``beta``, fixed in advance), each at ``beta / G``: a
    union bound over exactly what is tested, so the largest bound over them, and any
    bound at a count chosen by looking at them, holds at ``1 - beta``.  ``ks`` must not
    depend on the audited scores.  Columns (:data:`SWEEP_COLUMNS`): ``eps_lb_pure``,
    ``eps_lb_pure_hoeffding``, ``eps_lb`` and ``eps_lb_fdp``, each the largest over the
    tested counts; ``mu_lb`` and ``eps_gdp`` at ``best_k``, the tested count of the largest
    ``eps_lb_fdp`` (of the largest ``eps_lb_pure`` when that is 0), with ``correct`` its
    correct guesses; ``eps_hat_max``, the homework's maximum over every k (an estimate).
    Both (eps, delta) bounds are at most the pure-eps bound of the same guesses (a larger
    delta rejects less; at delta = 0 the binomial tail is exact for randomized response),
    so counts whose pure bound cannot beat the best so far are skipped.  Needs
    ``m >= 2 K`` canaries and ``0 <= correct[..., k-1] <= 2 k``; a ValueError names a bad
    argument.
    """
    _check_delta(delta)
    _check_level("beta", beta)
    given = correct
    correct = _whole("correct", correct)
    if correct.ndim == 0:
        raise ValueError(f"correct has shape {correct.shape}: need (..., K) correct guesses "
                         f"of k = 1..K, K >= 1")
    K = correct.shape[-1]
    m = _check_k(m, "m")
    if m < 2 * K:
        raise ValueError(f"m={m}: must be at least 2 K = {2 * K} (k = K guesses 2 K of the m "
                         f"canaries)")
    if np.any(correct < 0) or np.any(correct > 2 * np.arange(1, K + 1)):
        raise ValueError(f"correct={given!r}: must satisfy 0 <= correct[..., k - 1] <= 2 k, "
                         f"the guesses of k")
    if ks is None:
        ks = guess_grid(K, beta)
    else:
        ks = _whole("ks", ks)
        if ks.ndim != 1 or np.any(np.diff(ks) <= 0) or ks[0] < 1 or ks[-1] > K:
            raise ValueError(f"ks={ks!r}: must be increasing guess counts in [1, K={K}]")
    level = beta / len(ks)
    hat = np.asarray(eps_lb_one_run(m, 2 * np.arange(1, K + 1), correct, 0.0, beta))
    r, v = 2 * ks, correct[..., ks - 1]
    pure = np.asarray(eps_lb_one_run(m, np.broadcast_to(r, v.shape), v, 0.0, level))
    shape = v.shape[:-1]
    lb, fdp, mu = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    best = np.zeros(shape, dtype=np.int64)
    for i in np.ndindex(shape):
        lb[i], _ = _largest_below(lambda rr, vv: eps_lb_one_run(m, rr, vv, delta, level),
                                  r, v[i], pure[i])
        fdp[i], best[i] = _largest_below(
            lambda rr, vv: eps_lb_one_run_fdp(m, rr, vv, delta, level), r, v[i], pure[i])
        mu[i] = mu_lb_one_run_gdp(m, int(r[best[i]]), int(v[i][best[i]]), level)
    return {
        "eps_lb": lb,
        "eps_lb_fdp": fdp,
        "mu_lb": mu,
        "eps_gdp": np.vectorize(lambda x: eps_gdp_estimate(x, delta), otypes=[float])(mu),
        "eps_lb_pure": pure.max(axis=-1),
        "eps_lb_pure_hoeffding": np.asarray(eps_lb_hoeffding(np.broadcast_to(r, v.shape), v,
                                                             level)).max(axis=-1),
        "eps_hat_max": hat.max(axis=-1),
        "best_k": ks[best],
        "correct": np.take_along_axis(v, best[..., None], -1)[..., 0],
    }
