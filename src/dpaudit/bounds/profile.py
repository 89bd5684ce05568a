"""A certified test of a claimed privacy profile: is the mechanism as private as it claims
at every epsilon at once?

A DP-SGD implementation claims more than one (eps, delta) point. Run with the noise
multiplier its accountant calibrated, correct DP-SGD is (e, delta_claim(e))-DP for *every*
e, delta_claim its privacy profile (Balle, Barthe and Gaboardi 2018; add/remove:
:func:`dpaudit.accounting.privacy_profile`). So a run of evaluation trials refutes the
claim wherever a certified lower bound on the mechanism's delta at some e exceeds
delta_claim(e). With the one-sided Clopper-Pearson bounds ``TPR_lo`` and ``FPR_hi`` at
alpha/2 each (as :func:`~dpaudit.bounds.eps_lb_clopper_pearson` takes them),

    delta_lb(e) = max(TPR_lo - e^e FPR_hi, (1 - FPR_hi) - e^e (1 - TPR_lo))

(the event "in" and its complement "out": the add/remove profile bounds both directions)
and the violation ``V = max_e delta_lb(e) - delta_claim(e)``. ``V > 0`` refutes the claimed
profile at confidence 1 - alpha.

Why no correction for the many e: both rates enter only through ``TPR_lo`` and
``FPR_hi``, and every ``delta_lb(e)`` decreases in the FPR and increases in the TPR. On the
one event "TPR >= TPR_lo and FPR <= FPR_hi" (probability at least 1 - alpha) every
``delta_lb(e)`` is at most the mechanism's own ``TPR - e^e FPR`` (or its complement), which
a mechanism with that profile keeps below ``delta_claim(e)``: ``V <= 0`` for every e at
once. The maximum over e is therefore a statement about one event, not a choice among many
tests. A grid of e makes the test only weaker, never unsound.

What ``V > 0`` refutes is "the mechanism is as private as correct DP-SGD at the claimed
noise" (every point of that profile), not "(eps, delta)-DP at the claimed point", which is
what :func:`~dpaudit.bounds.eps_lb_clopper_pearson` tests. The test needs far fewer trials
when the mechanism leaks more than claimed at every e (a noise too small by a factor): eps
at a small delta is a tail quantity of the trade-off curve, while the profile test can
use the middle of the curve, where rates are estimated well.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from ._checks import (_check_counts, _check_level, _check_rate_bounds, _real,
                      _scalar_or_array)
from .counts import clopper_pearson
from .thresholds import threshold_holdout_audit

#: Largest (trials x grid points) block computed at once (memory: 8 bytes each, several).
_BLOCK = 2**22


def _check_profile(epsilons, deltas) -> tuple[np.ndarray, np.ndarray]:
    """The grid ``epsilons`` and the claimed ``deltas`` on it as float arrays: one-dimensional,
    finite, of one length; deltas in [0, 1]."""
    eps = _real("epsilons", epsilons, "be a one-dimensional array of finite numbers")
    if eps.ndim != 1 or not eps.size or not np.all(np.isfinite(eps)):
        raise ValueError(f"epsilons (shape {eps.shape}, {np.isfinite(eps).sum()} finite): "
                         "must be a non-empty one-dimensional array of finite numbers (the "
                         "grid of e)")
    dl = _real("deltas", deltas, "be a one-dimensional array of numbers in [0, 1]")
    if dl.shape != eps.shape or not np.all((dl >= 0) & (dl <= 1)):
        raise ValueError(f"deltas (shape {dl.shape}, range {np.min(dl, initial=np.nan)} to "
                         f"{np.max(dl, initial=np.nan)}): must be numbers in [0, 1], one per "
                         f"entry of epsilons (shape {eps.shape})")
    return eps.astype(float), dl.astype(float)


def _refute(ct_pos, n_pos, ct_neg, n_neg, alpha: float, eps: np.ndarray, deltas: np.ndarray):
    """``(violation, eps_star, delta_lb, delta_claim)`` arrays of the counts' shape: V, the
    e of the grid that attains it (the smallest where several do), delta_lb(e*) and
    delta_claim(e*)."""
    ct_pos, n_pos, ct_neg, n_neg = np.broadcast_arrays(ct_pos, n_pos, ct_neg, n_neg)
    p1_lo, _ = clopper_pearson(ct_pos, n_pos, alpha)
    _, p0_hi = clopper_pearson(ct_neg, n_neg, alpha)
    return _from_rates(p1_lo, p0_hi, eps, deltas)


def profile_from_rate_bounds(tpr_lo, fpr_hi, epsilons, deltas):
    """``(violation, eps_star, delta_lb, delta_claim)`` arrays of the broadcast shape of
    ``tpr_lo`` (a lower bound on the TPR) and ``fpr_hi`` (an upper bound on the FPR): the
    test of :func:`profile_violation` from any rate bounds, holding at the level at which
    both hold together (module docstring), e.g. those of a confidence sequence."""
    tpr_lo, fpr_hi = _check_rate_bounds(tpr_lo, fpr_hi)
    return _from_rates(tpr_lo, fpr_hi, *_check_profile(epsilons, deltas))


def _from_rates(p1_lo, p0_hi, eps: np.ndarray, deltas: np.ndarray):
    """:func:`profile_from_rate_bounds` of checked arrays."""
    p1_lo, p0_hi = np.broadcast_arrays(p1_lo, p0_hi)
    p1, p0 = np.ravel(p1_lo), np.ravel(p0_hi)
    with np.errstate(over="ignore"):  # e^e = inf: delta_lb = -inf (FPR_hi, 1 - TPR_lo > 0)
        growth = np.exp(eps)
    out = np.empty((4, p1.size))
    step = max(1, _BLOCK // eps.size)
    for i in range(0, p1.size, step):
        a, b = p1[i:i + step, None], p0[i:i + step, None]
        lb = np.maximum(a - growth * b, (1 - b) - growth * (1 - a))
        j = np.argmax(lb - deltas, axis=1)
        rows = np.arange(len(j))
        out[:, i:i + step] = (lb[rows, j] - deltas[j], eps[j], lb[rows, j], deltas[j])
    return [v.reshape(p1_lo.shape) for v in out]


def profile_violation(ct_pos, n_pos, ct_neg, n_neg, alpha, epsilons, deltas):
    """``V = max_e delta_lb(e) - delta_claim(e)`` over the grid ``epsilons`` with the
    claimed profile ``deltas`` (module docstring); ``V > 0`` refutes the claimed profile
    at confidence ``1 - alpha``. Broadcasts over the counts (a
    :data:`~dpaudit.bounds.Bound` once ``epsilons`` and ``deltas`` are bound), a
    float for scalar counts."""
    ct_pos, n_pos, ct_neg, n_neg = _check_counts(ct_pos, n_pos, ct_neg, n_neg)
    alpha = _check_level("alpha", alpha)
    eps, dl = _check_profile(epsilons, deltas)
    return _scalar_or_array(_refute(ct_pos, n_pos, ct_neg, n_neg, alpha, eps, dl)[0])


@dataclass(frozen=True)
class ProfileAudit:
    """The profile test at one threshold (the attack says "in" when ``score > threshold``),
    on the evaluation trials: ``violation`` V, ``violated`` (V > 0), the e* that attains V,
    the certified ``delta_lb`` at e* and the claim's ``delta_claim`` there, and the counts."""

    violation: float
    violated: bool
    eps_star: float
    delta_lb: float
    delta_claim: float
    threshold: float
    ct_pos: int
    n_pos: int
    ct_neg: int
    n_neg: int


def profile_audit(val_pos, val_neg, eval_pos, eval_neg, epsilons, deltas,
                  alpha) -> ProfileAudit:
    """The profile test with a held-out threshold: on the validation scores, the decision
    "score > t" that maximises :func:`profile_violation` at ``alpha`` (ties: the largest
    TPR - FPR), then V, e*, delta_lb(e*) and delta_claim(e*) at that threshold on the
    evaluation scores, which the choice never saw (:func:`~dpaudit.bounds.threshold_holdout_audit`,
    the eps test's machinery), so the test holds at ``1 - alpha`` with no correction."""
    eps, dl = _check_profile(epsilons, deltas)
    res = threshold_holdout_audit(val_pos, val_neg, eval_pos, eval_neg,
                                  partial(profile_violation, epsilons=eps, deltas=dl), alpha,
                                  ties="youden")
    v, e, lb, claim = (float(x) for x in _refute(res.ct_pos, res.n_pos, res.ct_neg, res.n_neg,
                                                  alpha, eps, dl))
    return ProfileAudit(v, v > 0, e, lb, claim, res.threshold, res.ct_pos, res.n_pos,
                        res.ct_neg, res.n_neg)


__all__ = ["profile_violation", "profile_audit", "ProfileAudit", "profile_from_rate_bounds"]
