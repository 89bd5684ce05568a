"""Anytime-valid audits: evaluation runs trained in rounds, a verdict as soon as the evidence
suffices (Howard et al. 2021; Gonzalez et al. 2025 audit DP sequentially in the same way).

The fixed audit (:func:`.statistics.audit_scores`) trains all its evaluation runs, then
computes Clopper-Pearson bounds once. Here the validation runs, fixed up front, choose the
thresholds exactly as there; the evaluation runs then come in rounds from a callback, and
after every round eps_LB and the profile test's V are computed from confidence sequences
(:mod:`dpaudit.bounds.sequential`), which hold at every number of runs at once. So the
audit may stop at the first certified violation, at ``max_runs`` or when its wall-clock
budget runs out, and whatever it reports holds at ``1 - alpha`` (each test, as in the fixed
audit), however many looks it took.

Why the threshold still comes from separate validation runs: the counts are Bernoulli trials
of known rate only for a decision fixed before the evaluation runs are seen. Choosing it on
the evaluation runs themselves, after every round, would be a choice among data-dependent
decisions that the confidence sequence does not cover.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import partial
from typing import Callable

import numpy as np

from ... import bounds
from .claim import ALPHA, mu_claimed, verdict
from .profile import ClaimedProfile

#: The two sides of the evaluation runs, in the order each round trains them.
SIDES = ("in", "out")

#: Why an audit stopped.
STOPS = ("certified", "max_runs", "budget")


@dataclass(frozen=True)
class Schedule:
    """Rounds of evaluation runs: ``first`` runs per side, then the runs so far times
    ``growth`` (rounded up), at most ``max_runs`` per side; no new batch once ``budget_s``
    seconds have passed. The confidence sequences are tightest near ``n_opt`` runs (default
    ``max_runs``)."""

    first: int = 20
    growth: float = 1.5
    max_runs: int = 1300
    budget_s: float = math.inf
    n_opt: int | None = None

    def __post_init__(self):
        checks = (("first", self.first, isinstance(self.first, int) and self.first >= 1,
                   "a whole number >= 1"),
                  ("growth", self.growth, isinstance(self.growth, (int, float))
                   and 1 < self.growth < math.inf, "a number > 1"),
                  ("max_runs", self.max_runs, isinstance(self.max_runs, int)
                   and self.max_runs >= self.first, f"a whole number >= first ({self.first})"),
                  ("budget_s", self.budget_s, isinstance(self.budget_s, (int, float))
                   and self.budget_s > 0, "a number of seconds > 0 (math.inf: none)"),
                  ("n_opt", self.n_opt, self.n_opt is None or (
                      isinstance(self.n_opt, int) and self.n_opt >= 1),
                   "None (max_runs) or a whole number >= 1"))
        for name, value, ok, allowed in checks:
            if isinstance(value, bool) or not ok:
                raise ValueError(f"schedule.{name}={value!r}: must be {allowed}")

    def targets(self) -> list[int]:
        """The runs per side after each round."""
        out = [min(self.first, self.max_runs)]
        while out[-1] < self.max_runs:
            out.append(min(self.max_runs, max(out[-1] + 1, math.ceil(out[-1] * self.growth))))
        return out


def _tests(val_in, val_out, delta: float, alpha: float, profile: ClaimedProfile | None):
    """``{test: threshold}`` chosen on the validation runs as :func:`.statistics.audit_scores`
    chooses them (the bound the validation counts would give, ties to the largest TPR - FPR)."""
    statistic = {"eps": partial(bounds.eps_lb_clopper_pearson, delta=delta)}
    if profile is not None:
        statistic["profile"] = partial(bounds.profile_violation, epsilons=profile.epsilons,
                                       deltas=profile.deltas)
    return {test: bounds.choose_threshold(val_in, val_out, f, alpha, ties="youden").threshold
            for test, f in statistic.items()}


def _state(scores: dict, thresholds: dict, delta: float, alpha: float, n_opt: int,
           profile: ClaimedProfile | None) -> dict:
    """The bounds after the runs so far: per test, the running confidence sequences of the
    TPR (from below) and the FPR (from above) at its threshold, and eps_LB or V from them."""
    out = {"runs_in": len(scores["in"]), "runs_out": len(scores["out"])}
    for test, tau in thresholds.items():
        hits = {side: np.asarray(scores[side]) > tau for side in SIDES}
        tpr_lo = bounds.running_confidence_sequence(hits["in"], alpha, n_opt)[0][-1]
        fpr_hi = bounds.running_confidence_sequence(hits["out"], alpha, n_opt)[1][-1]
        key = "" if test == "eps" else "profile_"
        out.update({f"{key}threshold": tau, f"{key}tpr": float(hits["in"].mean()),
                    f"{key}fpr": float(hits["out"].mean()), f"{key}tpr_lo": float(tpr_lo),
                    f"{key}fpr_hi": float(fpr_hi)})
        if test == "eps":
            out.update(ct_pos=int(hits["in"].sum()), ct_neg=int(hits["out"].sum()),
                       eps_lb=float(bounds.eps_from_rate_bounds(tpr_lo, fpr_hi, delta)))
        else:
            v, e, lb, claim = (float(x) for x in bounds.profile_from_rate_bounds(
                tpr_lo, fpr_hi, profile.epsilons, profile.deltas))
            out.update(profile_violated=v > 0, profile_violation=v, eps_star=e, delta_lb=lb,
                       delta_claim_at_eps_star=claim)
    return out


def _more(more: Callable, side: str, start: int, count: int) -> np.ndarray:
    """``count`` scores of new evaluation runs of ``side`` from the callback, checked."""
    name = f"more({side!r}, {start}, {count})"
    scores = bounds.scores_array(name, more(side, start, count))
    if scores.size != count:
        raise ValueError(f"{name} returned {scores.size} scores: must return one per run "
                         f"({count})")
    return scores


def _message(look: int, state: dict, claimed_eps: float) -> str:
    text = (f"look {look}: {state['runs_in']} + {state['runs_out']} runs (in + out), "
            f"eps_LB {state['eps_lb']:.3f} (claim {claimed_eps:g}; certified above it: "
            f"{state['eps_lb'] > claimed_eps})")
    if "profile_violation" in state:
        text += (f", profile V {state['profile_violation']:+.4f} (> 0 refutes the claimed "
                 f"profile)")
    return text


def sequential_audit(val_in, val_out, more: Callable, claimed_eps: float, delta: float,
                     alpha: float = ALPHA, profile: ClaimedProfile | None = None,
                     schedule: Schedule = Schedule(), progress: Callable | None = None,
                     clock: Callable[[], float] = time.monotonic) -> dict:
    """Audit in rounds; the row of :func:`.statistics.audit_scores`'s bounds and verdict.

    ``val_in``/``val_out``: the validation runs' scores (higher = with the canary; losses
    negated), fixed before any evaluation run. ``more(side, start, count)``: the scores of
    ``count`` new evaluation runs of ``side`` (``"in"`` or ``"out"``), runs ``start`` to
    ``start + count - 1`` of that side (for their seeds). ``progress(state)``: after every
    round, a dict of the bounds so far with a ``"message"`` line. Stops at the first round
    whose eps_LB exceeds ``claimed_eps`` or whose V is above 0 (``"certified"``), when both
    sides have ``schedule.max_runs`` runs, or when ``schedule.budget_s`` has passed
    (checked before every batch). The row adds ``looks`` (rounds seen, the last the one it
    stopped at), ``stop_reason`` and ``elapsed_s`` to the fixed audit's columns.
    """
    val_in, val_out = bounds.scores_array("val_in", val_in), bounds.scores_array("val_out",
                                                                                 val_out)
    if isinstance(claimed_eps, bool) or not isinstance(claimed_eps, (int, float)) or not (
            0 < claimed_eps < math.inf):
        raise ValueError(f"claimed_eps={claimed_eps!r}: must be a number > 0 (the claim)")
    if not isinstance(schedule, Schedule):
        raise ValueError(f"schedule={schedule!r}: must be a Schedule")
    thresholds = _tests(val_in, val_out, delta, alpha, profile)
    n_opt = schedule.n_opt or schedule.max_runs
    scores = {side: np.empty(0) for side in SIDES}
    start, stop, state = clock(), None, None
    for look, target in enumerate(schedule.targets(), 1):
        added = False
        for side in SIDES:
            if clock() - start >= schedule.budget_s:
                stop = "budget"
                break
            n = len(scores[side])
            scores[side] = np.concatenate([scores[side], _more(more, side, n, target - n)])
            added = True
        if not added or min(len(s) for s in scores.values()) == 0:
            break  # the budget ran out before this round, or before a run of each side
        state = _state(scores, thresholds, delta, alpha, n_opt, profile)
        state.update(look=look, message=_message(look, state, claimed_eps))
        if progress is not None:
            progress(state)
        if state["eps_lb"] > claimed_eps or state.get("profile_violated", False):
            stop = "certified"
        if stop:
            break
    if state is None:
        raise ValueError(f"schedule.budget_s={schedule.budget_s!r}: ran out before one "
                         f"evaluation run of each side; nothing to audit")
    row = {k: v for k, v in state.items() if k not in ("message", "look")}
    row.update(n_pos=row["runs_in"], n_neg=row["runs_out"], looks=state["look"], n_opt=n_opt,
               stop_reason=stop or "max_runs", elapsed_s=clock() - start,
               mu_claimed=mu_claimed(claimed_eps, delta),
               verdict=verdict(row["eps_lb"], claimed_eps,
                               row.get("profile_violated", False)))
    if profile is not None:
        row.update(profile_sigma=profile.sigma, profile_q=profile.q,
                   profile_steps=profile.steps)
    return row
