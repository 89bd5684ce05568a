"""Epsilon lower bounds from counts: Clopper-Pearson, Katz and Bayes, for groups of k rows.

``ct_pos`` of ``n_pos`` positive and ``ct_neg`` of ``n_neg`` negative trials said "in"
(conventions: :mod:`dpaudit.bounds`); the eps of data sets at distance k follows from
group privacy ([JUO20] Lemma 1, :func:`_group_delta`).  :func:`eps_lb_clopper_pearson`
holds with probability at least ``1 - alpha``; :func:`eps_lb_katz` is approximate (an
asymptotic interval) and :func:`eps_lb_bayes` is the lower end of a Bayesian credible
interval, not a confidence bound.  All three broadcast over array arguments.
"""

from __future__ import annotations

import math
from functools import lru_cache, partial

import numpy as np
from scipy import integrate, optimize, special, stats

from ._checks import (_broadcast, _check_counts, _check_delta, _check_k, _check_level,
                      _check_rate_bounds, _number, _scalar_or_array, _whole)


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
    return _scalar_or_array(eps_from_rate_bounds(p1_lo, p0_hi, delta, k))


def claim_p_value(ct_pos: int, n_pos: int, ct_neg: int, n_neg: int, eps: float,
                  delta: float = 0.0, k: int = 1) -> float:
    """The smallest ``alpha`` at which :func:`eps_lb_clopper_pearson` of these counts
    exceeds ``eps``: the p-value of the claim ``(eps, delta)`` under this test, so
    ``1 - p`` is the largest confidence at which the counts refute it. 1.0 where no level
    does; 1e-15 where even that one does (the FPR's upper bound is taken at
    ``1 - alpha / 2``, which is 1 in double precision below about 2e-16). eps_LB grows
    with alpha, so the level is found by bisection on ``log alpha`` (to 1e-9 relative);
    the returned level refutes."""
    for name, value in zip(("ct_pos", "n_pos", "ct_neg", "n_neg"),
                           (ct_pos, n_pos, ct_neg, n_neg)):
        if np.ndim(value):
            raise ValueError(f"{name}={value!r}: must be one count (a scalar)")
    counts = _check_counts(ct_pos, n_pos, ct_neg, n_neg)
    _check_delta(delta)
    k = _check_k(k)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 <= eps < math.inf:
        raise ValueError(f"eps={eps!r}: must be a number >= 0 and finite")
    eps_lb = lambda a: eps_lb_clopper_pearson(*counts, a, delta, k)  # noqa: E731
    hi, lo = 1.0 - 1e-12, 1e-15
    if eps_lb(hi) <= eps:
        return 1.0
    if eps_lb(lo) > eps:
        return lo
    lo, hi = math.log(lo), math.log(hi)  # eps_lb(e^lo) <= eps < eps_lb(e^hi)
    while hi - lo > 1e-9 * abs(hi) + 1e-12:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if eps_lb(math.exp(mid)) > eps else (mid, hi)
    return math.exp(hi)


def eps_from_rate_bounds(tpr_lo, fpr_hi, delta: float = 0.0, k: int = 1) -> np.ndarray:
    """The eps refuted by a lower bound ``tpr_lo`` on the TPR and an upper bound ``fpr_hi`` on
    the FPR (the event "in" and its complement "out"; :func:`eps_lb_clopper_pearson`): a
    bound at the level at which both rate bounds hold together, since it increases in the
    TPR and decreases in the FPR. Array in, array out."""
    tpr_lo, fpr_hi = _check_rate_bounds(tpr_lo, fpr_hi)
    delta, k = _check_delta(delta), _check_k(k)
    return np.maximum(_eps_from_rates(tpr_lo, fpr_hi, delta, k),
                      _eps_from_rates(1 - fpr_hi, 1 - tpr_lo, delta, k))


def perfect_eps_lb(runs: int, delta: float, alpha: float) -> float:
    """:func:`eps_lb_clopper_pearson` of a perfect attack (TPR = 1, FPR = 0) on ``runs``
    trials per side: the most any attack can certify with that many."""
    runs = _check_k(runs, "runs")
    return float(eps_lb_clopper_pearson(runs, runs, 0, runs, _check_level("alpha", alpha),
                                        _check_delta(delta)))


def runs_to_exceed(eps: float, delta: float, alpha: float) -> int:
    """Fewest trials per side at which a perfect attack's eps_LB exceeds ``eps``.

    With all n positive and no negative trials "in", the one-sided bounds are
    ``TPR_lo = (alpha/2)^(1/n)`` and ``FPR_hi = 1 - TPR_lo``, so the best possible
    ``eps_LB = ln((TPR_lo - delta) / (1 - TPR_lo))`` grows with n; below the returned n no
    attack can certify more than ``eps`` at confidence ``1 - alpha`` (e.g. 40 for
    (0.21, 1e-5) at alpha = 1e-10).
    """
    _number("eps", eps, "be a finite number >= 0", lambda x: 0.0 <= x < math.inf)
    _check_delta(delta)
    _check_level("alpha", alpha)
    hi = 1
    while perfect_eps_lb(hi, delta, alpha) <= eps:
        hi *= 2
    lo = hi // 2  # perfect_eps_lb(lo) <= eps (or lo = 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if perfect_eps_lb(mid, delta, alpha) > eps else (mid, hi)
    return hi


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
    than ``alpha`` (coverage measured in ``benchmarks/bound_coverage.py``, docs/statistics.md).
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
