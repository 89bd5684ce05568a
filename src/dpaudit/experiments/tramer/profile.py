"""The profile test: the privacy profile an implementation claims with (eps, delta) in its
DP-SGD setting, tested on the same runs as the eps test
(:func:`dpaudit.bounds.profile_audit`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ... import accounting, bounds
from .claim import ALPHA


#: The grid of e on which the profile test compares the claimed profile: beyond e = 20 no
#: count of at most 10^7 runs per side could show a delta above 0 (FPR_hi e^e > 1).
PROFILE_GRID = np.linspace(0.0, 20.0, 2001)


@dataclass(frozen=True)
class ClaimedProfile:
    """The privacy profile an implementation claims with (eps, delta) in its setting: that
    of correct DP-SGD, T = ``steps`` Poisson-subsampled Gaussian steps at rate ``q`` with
    the noise multiplier ``sigma`` its accountant calibrates, ``deltas`` on ``epsilons``
    (add/remove, :func:`dpaudit.accounting.privacy_profile`: an upper bound)."""

    sigma: float
    q: float
    steps: int
    epsilons: np.ndarray
    deltas: np.ndarray


def claimed_profile(sigma: float, q: float, steps: int) -> ClaimedProfile:
    """The :class:`ClaimedProfile` of correct DP-SGD at noise multiplier ``sigma``, sample
    rate ``q`` and ``steps`` steps, on :data:`PROFILE_GRID`."""
    return ClaimedProfile(float(sigma), float(q), int(steps), PROFILE_GRID,
                          accounting.privacy_profile(sigma, q, int(steps), PROFILE_GRID))


def profile_columns(val_in, val_out, eval_in, eval_out, profile: ClaimedProfile,
                    alpha: float = ALPHA) -> dict:
    """The profile test (:func:`dpaudit.bounds.profile_audit`; "in" iff score > threshold)
    as row columns: ``profile_violated``, the violation V, ``delta_lb`` and
    ``delta_claim_at_eps_star`` at ``eps_star``, its threshold and evaluation rates, and the
    claimed DP-SGD it tests against (``profile_sigma``, ``profile_q``, ``profile_steps``)."""
    res = bounds.profile_audit(val_in, val_out, eval_in, eval_out, profile.epsilons,
                               profile.deltas, alpha)
    return {"profile_violated": res.violated, "profile_violation": res.violation,
            "eps_star": res.eps_star, "delta_lb": res.delta_lb,
            "delta_claim_at_eps_star": res.delta_claim, "profile_threshold": res.threshold,
            "profile_tpr": res.ct_pos / res.n_pos, "profile_fpr": res.ct_neg / res.n_neg,
            "profile_sigma": profile.sigma, "profile_q": profile.q,
            "profile_steps": profile.steps}
