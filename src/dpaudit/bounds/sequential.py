"""Time-uniform bounds: a confidence sequence for a Bernoulli rate, and eps_LB and the profile
test from it, valid at every number of trials at once (look after every trial, stop at will).

A Clopper-Pearson bound holds at one n fixed in advance; looking after every trial and
stopping at the first bound above a claim would exceed it far more often than alpha. A
confidence sequence ([HRMS21]) is a sequence of intervals ``[lo_n, hi_n]`` that contain the
true rate p at *every* n at once with probability at least ``1 - alpha``, so any stopping
rule, data-dependent or a wall-clock budget, keeps the level.

The construction: Robbins' conjugate mixture martingale ([Rob70]) for Bernoulli trials, the
beta-binomial mixture of [HRMS21] as their package ``confseq`` builds it in
``bernoulli_confidence_interval`` (a prior centred at each null rate). For a null rate p and
the prior ``Beta(c p, c (1 - p))`` (mean p, concentration c),

    M_n(p) = int (theta/p)^S ((1-theta)/(1-p))^(n-S) dBeta(theta)
           = B(c p + S, c (1-p) + n - S) / B(c p, c (1-p)) / (p^S (1-p)^(n-S))

after n trials with S successes is a nonnegative martingale of mean 1 under p, so by
Ville's inequality ``P_p[M_n(p) >= 1/a for some n] <= a``: the sets ``C_n = {p: M_n(p) <
1/a}`` contain the true p at every n at once with probability at least ``1 - a``. Each
``log M_n(p)`` is a sum of ``log(c + i/p)`` and ``log(c + j/(1-p))`` (i < S, j < n - S) less a
constant, each convex in p, so ``C_n`` is an interval; it contains ``S/n`` (a mixture of
likelihood ratios is at most the largest, at the maximum-likelihood rate: ``M_n(S/n) <= 1``).
Its ends are found by Newton's method from outside (:func:`_lower_end`), and each returned
end is certified *outside* ``C_n`` against a bound on the rounding of ``log M_n``: never
inside the true interval, so rounding can only widen it. The prior is fixed before the data (c
depends only on ``n_opt`` and the level), which is all validity needs; c is the normal
mixture's best precision for ``n_opt`` trials (as ``confseq`` sets it), so the sequence is
tightest near ``n_opt``.

One rate per side of an audit: the TPR from below and the FPR from above, each end at
``alpha / 2`` (the two independent sides then hold together at ``1 - alpha``, as
:func:`~dpaudit.bounds.eps_lb_clopper_pearson` splits it). Each end is taken from the
two-sided set at ``a = alpha / 2``, which covers both ends at once: a little conservative
(about ``ln 2`` of a threshold of ``ln(2/alpha)``, 3% at alpha = 1e-10), and the interval
is exactly convex. On the event that every sequence holds at every n, the running
intersection (the largest ``lo`` and smallest ``hi`` seen so far) holds too, and so does
every eps_LB and profile violation computed from it, at every look: eps_LB and V increase
in the TPR and decrease in the FPR, as in :mod:`.profile`.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from ._checks import (_broadcast, _check_counts, _check_delta, _check_k, _check_level,
                      _number, _scalar_or_array, _whole)
from .counts import eps_from_rate_bounds
from .profile import _check_profile, _from_rates

#: Default trials at which the mixture is tightest: the evaluation runs of a fixed audit
#: (``audit-impl --runs``).
N_OPT = 1000


def mixture_concentration(n_opt: float, level: float) -> float:
    """The prior's concentration ``c = rho / (p (1 - p)) - 1`` with ``rho = n_opt p (1 - p) /
    (2 ln(1/a) + ln(1 + 2 ln(1/a)))``: the precision of the two-sided normal mixture that is
    tightest at ``n_opt`` trials at level ``a`` ([HRMS21]; ``confseq``'s
    ``TwoSidedNormalMixture::best_rho``, floored at 1e-3 as there)."""
    n_opt = _number("n_opt", n_opt, "be a number >= 1 (trials)", lambda x: 1 <= x < math.inf)
    level = _check_level("level", level)
    big = 2 * math.log(1 / level)
    return max(n_opt / (big + math.log1p(big)) - 1.0, 1e-3)


def _log_mixture(ct, n, u, c: float):
    """``(log M_n(p), d log M_n(p) / du, rounding)`` of the module docstring at ``p = e^u <
    1`` (float arrays); ``rounding`` bounds the error of the first: 1e-14 times the sum of
    its terms' magnitudes, several times floating point's and the log-gamma function's
    relative error over that many terms (it grows with n: 3e-7 at 10^6 trials)."""
    p, q = np.exp(u), -np.expm1(u)
    a, b, rest = c * p, c * q, n - ct
    lg = special.gammaln  # B(a + ct, b + rest) / B(a, b), as a + b = c
    terms = (lg(a + ct), lg(b + rest), -lg(a), -lg(b), -lg(c + n), lg(c), -ct * u,
             -np.where(rest > 0, rest * np.log(np.where(rest > 0, q, 1.0)), 0.0))
    f = sum(terms)
    rounding = 1e-14 * sum(np.abs(t) for t in terms)
    df = (a * (special.digamma(a + ct) - special.digamma(a)) - ct
          + p * (c * (special.digamma(b) - special.digamma(b + rest)) + rest / q))
    return f, df, rounding


#: Newton's start, log(1e-300), and most steps; the relative margin kept below the root.
_U0, _STEPS, _MARGIN = math.log(1e-300), 200, 1e-12


def _lower_end(ct, n, threshold: float, c: float):
    """The lower end of ``{p: log M_n(p) < threshold}`` by Newton's method in ``u = log p``
    from ``p = 1e-300``: ``log M_n`` is convex in u (a sum of log-sum-exps of convex
    functions) and above the threshold there, so every Newton step stays left of the root
    (the tangent lies below a convex function) and the iterates rise to it. The end returned
    is then certified outside the set, ``log M_n - rounding >= threshold``, stepping left
    where rounding leaves it in doubt; 0 where no point is (e.g. ``ct <= 1``)."""
    shape, ct, n = ct.shape, ct.ravel(), n.ravel()
    u = np.full(ct.shape, _U0)
    f, _, rounding = _log_mixture(ct, n, u, c)
    live = (ct > 0) & (f - rounding >= threshold)
    todo = live.copy()
    for _ in range(_STEPS):
        if not live.any():
            break
        f, df, _ = _log_mixture(ct[live], n[live], u[live], c)
        with np.errstate(divide="ignore", invalid="ignore"):
            step = np.where((f > threshold) & (df < 0), (threshold - f) / df, 0.0)
        step = np.where(np.isfinite(step), step, 0.0)
        u[live] = np.minimum(u[live] + step, np.log(ct[live] / n[live]) - 1e-15)  # p < S/n
        live[live] = step > 1e-13 * np.maximum(1.0, np.abs(u[live]))
    for k in range(_STEPS):  # certify each end; a growing step left where in doubt
        idx = np.flatnonzero(todo)
        if not idx.size:
            break
        f, df, rounding = _log_mixture(ct[idx], n[idx], u[idx], c)
        doubt = f - rounding < threshold
        todo[idx[~doubt]] = False
        idx, gap, df = idx[doubt], (threshold - f + rounding)[doubt], df[doubt]
        with np.errstate(divide="ignore", invalid="ignore"):
            move = np.where(df < 0, 2 * gap / -df, 0.0)
        move = np.maximum(np.where(np.isfinite(move), move, 0.0),
                          1e-12 * np.maximum(1.0, np.abs(u[idx]))) * 2.0 ** k
        u[idx] = np.maximum(u[idx] - move, _U0)
    certified = (ct > 0) & (u > _U0) & ~todo
    return np.where(certified, np.exp(u) * (1 - _MARGIN), 0.0).reshape(shape)


def bernoulli_confidence_sequence(ct, n, alpha: float, n_opt: float = N_OPT):
    """``(lo, hi)``: the beta-binomial mixture confidence sequence at level ``1 - alpha/2``
    after ``ct`` successes in ``n`` trials, so that each end, as one-sided bound, holds at
    every n at once with probability at least ``1 - alpha / 2`` (the convention of
    :func:`~dpaudit.bounds.clopper_pearson`, which it replaces when one looks more than once;
    module docstring). ``lo = 0`` at ``ct <= 1`` is possible (the mixture's price of
    uniformity). Broadcasts; a float pair for scalar counts."""
    ct, n = _whole("ct", ct), _whole("n", n)
    ct, n = _broadcast(ct=ct, n=n)
    if np.any(n < 1):
        raise ValueError(f"n={n!r}: must be >= 1")
    if np.any((ct < 0) | (ct > n)):
        raise ValueError(f"ct={ct!r}: must satisfy 0 <= ct <= n (n={n!r})")
    alpha = _check_level("alpha", alpha)
    level = alpha / 2
    c = mixture_concentration(n_opt, level)
    # Each distinct (ct, n) once: running counts of many trials repeat them.
    pairs, inverse = np.unique(np.stack([ct.ravel(), n.ravel()]), axis=1, return_inverse=True)
    uct, un = pairs.astype(float)
    threshold = math.log(1 / level)
    lo = _lower_end(uct, un, threshold, c)
    hi = 1.0 - _lower_end(un - uct, un, threshold, c)  # the mixture is symmetric in p, 1 - p
    inverse = inverse.reshape(ct.shape)
    return _scalar_or_array(lo[inverse]), _scalar_or_array(hi[inverse])


def running_confidence_sequence(hits, alpha: float, n_opt: float = N_OPT):
    """``(lo, hi)`` after each trial of ``hits`` (0/1 or boolean outcomes in trial order
    along the last axis): :func:`bernoulli_confidence_sequence` of the running counts,
    intersected with every earlier look (the largest ``lo`` and smallest ``hi`` so far),
    which holds on the same event. Entry ``i`` uses trials ``0..i``."""
    try:
        as_bool = np.asarray(hits).dtype == bool
    except (TypeError, ValueError):  # ragged: _whole says so
        as_bool = False
    h = _whole("hits", np.asarray(hits, np.int8) if as_bool else hits)
    if h.ndim < 1 or np.any((h != 0) & (h != 1)):
        raise ValueError(f"hits (shape {h.shape}): must be an array of 0/1 outcomes, trials "
                         f"along the last axis")
    ct = np.cumsum(h, axis=-1)
    n = np.broadcast_to(np.arange(1, h.shape[-1] + 1), ct.shape)
    lo, hi = bernoulli_confidence_sequence(ct, n, alpha, n_opt)
    return (np.maximum.accumulate(np.asarray(lo), axis=-1),
            np.minimum.accumulate(np.asarray(hi), axis=-1))


def eps_lb_sequential(ct_pos, n_pos, ct_neg, n_neg, alpha: float = 0.01, delta: float = 0.0,
                      k: int = 1, n_opt: float = N_OPT):
    """eps_LB of :func:`~dpaudit.bounds.eps_lb_clopper_pearson` with the confidence sequence
    in place of the Clopper-Pearson bounds (the TPR's lower and the FPR's upper end, each at
    ``alpha / 2``): valid at ``1 - alpha`` at every (n_pos, n_neg) at once, so at any look
    and any stopping time. Broadcasts; 0 when nothing can be claimed."""
    ct_pos, n_pos, ct_neg, n_neg = _check_counts(ct_pos, n_pos, ct_neg, n_neg)
    _check_level("alpha", alpha)
    delta = _check_delta(delta)
    k = _check_k(k)
    p1_lo, _ = bernoulli_confidence_sequence(ct_pos, n_pos, alpha, n_opt)
    _, p0_hi = bernoulli_confidence_sequence(ct_neg, n_neg, alpha, n_opt)
    return _scalar_or_array(eps_from_rate_bounds(p1_lo, p0_hi, delta, k))


def profile_violation_sequential(ct_pos, n_pos, ct_neg, n_neg, alpha, epsilons, deltas,
                                 n_opt: float = N_OPT):
    """The profile test's V of :func:`~dpaudit.bounds.profile_violation` with the confidence
    sequence in place of the Clopper-Pearson bounds: ``V > 0`` refutes the claimed profile at
    ``1 - alpha``, valid at every look at once. Broadcasts over the counts."""
    ct_pos, n_pos, ct_neg, n_neg = _check_counts(ct_pos, n_pos, ct_neg, n_neg)
    alpha = _check_level("alpha", alpha)
    eps, dl = _check_profile(epsilons, deltas)
    p1_lo, _ = bernoulli_confidence_sequence(ct_pos, n_pos, alpha, n_opt)
    _, p0_hi = bernoulli_confidence_sequence(ct_neg, n_neg, alpha, n_opt)
    return _scalar_or_array(_from_rates(np.asarray(p1_lo), np.asarray(p0_hi), eps, dl)[0])


__all__ = ["N_OPT", "mixture_concentration", "bernoulli_confidence_sequence",
           "running_confidence_sequence", "eps_lb_sequential", "profile_violation_sequential"]
