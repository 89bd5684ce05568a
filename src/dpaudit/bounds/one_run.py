"""One-run audits of [SNJ23]: bounds from correct guesses, the guesses tested, the sweep.

``m`` canaries, ``v`` of ``r`` guesses correct; the guess counts tested are fixed in
advance (:func:`guess_grid`), and :func:`one_run_sweep` reports every bound of one audit.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
from scipy import special, stats

from ._checks import (_broadcast, _check_delta, _check_k, _check_level, _one_run_counts, _real,
                      _scalar_or_array, _whole)
from .fdp import eps_lb_one_run_fdp, mu_lb_one_run_gdp
from .gdp import eps_gdp_estimate


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
