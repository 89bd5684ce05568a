"""The claim under test and what runs can show of it: the verdicts, the confidence of Tramer
et al. 2022, the mu of the Gaussian mechanism that claims (eps, delta), the fewest runs
at which a perfect attack refutes a claim, and an audit's design (:class:`Design`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from scipy import optimize

from ... import bounds

if TYPE_CHECKING:
    from .profile import ClaimedProfile
    from .sequential import Schedule


#: The confidence of the lecture's worked check of Tramer et al. 2022: each claim holds
#: with probability at least 1 - 1e-10.
ALPHA = 1e-10


VIOLATES = "violates its claimed guarantee"


#: The verdict where only the profile test fired (:func:`dpaudit.bounds.profile_audit`).
VIOLATES_PROFILE = "violates the claimed DP-SGD privacy profile"


NO_VIOLATION = "no violation detected"


def mu_claimed(eps: float, delta: float) -> float:
    """mu of the Gaussian mechanism that is exactly (eps, delta)-DP: the root of
    ``delta_from_mu(mu, eps) = delta`` ([DRS19] Corollary 2.13; increasing in mu)."""
    f = lambda mu: bounds.delta_from_mu(mu, eps) - delta  # noqa: E731
    hi = 1.0
    while f(hi) < 0:
        hi *= 2
    return float(optimize.brentq(f, 1e-12, hi, xtol=1e-14, rtol=1e-12))


def verdict(eps_lb: float, claimed_eps: float, profile_violated: bool = False) -> str:
    """The verdict, naming the test that fired: the eps test (``eps_lb`` above the claimed
    eps) before the profile test, which refutes less."""
    if eps_lb > claimed_eps:
        return VIOLATES
    return VIOLATES_PROFILE if profile_violated else NO_VIOLATION


def max_eps_lb(runs: int, delta: float, alpha: float = ALPHA) -> float:
    """eps_LB of a perfect attack (TPR = 1, FPR = 0) on ``runs`` evaluation runs per side
    (:func:`dpaudit.bounds.perfect_eps_lb`)."""
    return bounds.perfect_eps_lb(runs, delta, alpha)


def min_runs(claimed_eps: float, delta: float, alpha: float = ALPHA) -> int:
    """Fewest evaluation runs per side at which a perfect attack's eps_LB exceeds
    ``claimed_eps``: below it no attack can refute the claim at confidence ``1 - alpha``
    (:func:`dpaudit.bounds.runs_to_exceed`; e.g. 40 for (0.21, 1e-5) at alpha = 1e-10)."""
    return bounds.runs_to_exceed(claimed_eps, delta, alpha)


@dataclass(frozen=True)
class Design:
    """What an audit tests and with which runs: the claim (``claimed_eps``, ``delta``; with
    ``profile``, :func:`claimed_profile`, the claimed DP-SGD privacy profile too, and the
    verdict names the test that fired); ``val_runs`` runs per side that choose the canary
    label and the threshold, then ``runs`` evaluation runs per side that give the counts,
    their seeds drawn under ``seed``; each test holds at confidence ``1 - alpha``. With
    ``schedule`` (:func:`schedule_of`, ``runs`` its most per side) the evaluation runs come
    in rounds and the audit is :func:`.sequential.sequential_audit`, its bounds
    anytime-valid."""

    claimed_eps: float
    delta: float
    runs: int
    val_runs: int
    seed: int
    alpha: float = ALPHA
    profile: ClaimedProfile | None = None
    schedule: Schedule | None = None

    def __post_init__(self):
        if self.runs < 1 or self.val_runs < 1:
            raise ValueError("runs and val_runs must be >= 1")
