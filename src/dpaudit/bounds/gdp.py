"""Gaussian DP: a lower bound on mu from counts ([NHSB23]), and mu-GDP's (eps, delta) ([DRS19])."""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special

from ._checks import _check_counts, _check_delta, _check_level, _number, _scalar_or_array
from .counts import clopper_pearson


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
