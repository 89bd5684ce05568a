"""The attack on the runs' scores and its bounds (Tramer et al. 2022): the threshold chosen on
the validation runs, the counts and bounds of the evaluation runs, the verdict; and the
audit row's test-accuracy columns."""

from __future__ import annotations

from functools import partial

import numpy as np
import pandas as pd

from ... import bounds
from .claim import ALPHA, Design, mu_claimed, verdict
from .profile import ClaimedProfile, profile_columns


def accuracy_columns(test_acc, source: str) -> dict:
    """The audit row's test-accuracy columns from the per-model accuracies ``test_acc``:
    mean, min and max, how many models, and ``source`` (which models they are)."""
    acc = np.asarray(test_acc, float)
    if acc.size == 0 or not np.isfinite(acc).all():
        raise ValueError(f"test_acc: need finite accuracies of at least one model; got "
                         f"{acc.size} values")
    return {"test_acc_mean": float(acc.mean()), "test_acc_min": float(acc.min()),
            "test_acc_max": float(acc.max()), "test_acc_models": int(acc.size),
            "test_acc_source": source}


def run_columns(design: Design, canary: dict, total: int, diverged: int,
                seed_check: int) -> dict:
    """The audit row's leading columns: the ``design``'s, the ``canary``'s, how many runs
    were trained, usable (a finite canary score) and diverged, and the seeds checked."""
    return {"claimed_eps": design.claimed_eps, "delta": design.delta, "runs": design.runs,
            "val_runs": design.val_runs, "alpha": design.alpha, **canary,
            "seed": design.seed, "total_runs": total, "usable_runs": total - diverged,
            "diverged_runs": diverged, "seed_check": seed_check}


def audit_counts(ct_pos: int, n_pos: int, ct_neg: int, n_neg: int, claimed_eps: float,
                 delta: float, alpha: float = ALPHA) -> dict:
    """eps_LB (Clopper-Pearson), mu_LB (GDP) and the verdict from evaluation counts; the
    approximate Katz bound and the Bayesian credible bound beside them (not in the verdict)."""
    counts = (ct_pos, n_pos, ct_neg, n_neg, alpha, delta)
    eps_lb = bounds.eps_lb_clopper_pearson(*counts)
    mu_lb = bounds.mu_lb_gdp(ct_pos, n_pos, ct_neg, n_neg, alpha)
    return {"eps_lb": eps_lb, "mu_lb": mu_lb,
            "eps_lb_gdp": bounds.eps_gdp_estimate(mu_lb, delta),
            "eps_lb_katz": bounds.eps_lb_katz(*counts),
            "eps_lb_bayes": bounds.eps_lb_bayes(*counts),
            "mu_claimed": mu_claimed(claimed_eps, delta),
            "verdict": verdict(eps_lb, claimed_eps)}


#: How audit-impl breaks ties between equally good validation thresholds: the largest
#: TPR - FPR (e.g. among the all-zero bounds of a correct implementation).
TIES = "youden"


def attack_bound(delta: float) -> bounds.Bound:
    """The bound audit-impl chooses its threshold by and certifies with: Clopper-Pearson
    eps_LB at ``delta``."""
    return partial(bounds.eps_lb_clopper_pearson, delta=delta)


def choose_threshold(val_in, val_out, delta: float, alpha: float = ALPHA) -> float:
    """The threshold :func:`audit_scores` chooses on the validation scores (higher = with
    the canary): "in" iff an evaluation score exceeds it."""
    return bounds.choose_threshold(val_in, val_out, attack_bound(delta), alpha, TIES).threshold


def audit_scores(val_in, val_out, eval_in, eval_out, claimed_eps: float, delta: float,
                 alpha: float = ALPHA, profile: ClaimedProfile | None = None) -> dict:
    """The attack "in iff score > tau" (higher = with the canary): tau chosen on the
    validation scores, counts and bounds on the evaluation scores
    (:func:`dpaudit.bounds.threshold_holdout_audit`, ``pos`` = with the canary, ``neg`` =
    without).

    Over every distinct decision on the validation runs, tau maximizes the
    Clopper-Pearson eps_LB the validation counts would give at the same ``alpha``; ties
    (e.g. all zero, as for a correct implementation) go to the largest ``TPR - FPR``, and
    tau lies midway between two validation scores, a margin on both sides for the
    evaluation runs.  NaN scores are refused; a score of -inf is "out".

    With ``profile``, the same runs also test the claimed privacy profile
    (:func:`profile_columns`, its own threshold chosen the same way for its own statistic),
    and the verdict names the test that fired (:func:`verdict`).
    """
    scores_in, scores_out = np.asarray(eval_in, float), np.asarray(eval_out, float)
    val_in, val_out = np.asarray(val_in, float), np.asarray(val_out, float)
    res = bounds.threshold_holdout_audit(val_in, val_out, scores_in, scores_out,
                                         attack_bound(delta), alpha, ties=TIES)
    row = {"tpr": res.ct_pos / res.n_pos, "fpr": res.ct_neg / res.n_neg,
           "threshold": res.threshold, "ct_pos": res.ct_pos, "ct_neg": res.ct_neg,
           "tpr_at_fpr_0_1pct": bounds.tpr_at_fpr(scores_in, scores_out, 0.001),
           "tpr_at_fpr_1pct": bounds.tpr_at_fpr(scores_in, scores_out, 0.01),
           "auc": bounds.auc(scores_in, scores_out),
           **audit_counts(res.ct_pos, res.n_pos, res.ct_neg, res.n_neg, claimed_eps, delta,
                          alpha)}
    if profile is not None:
        row.update(profile_columns(val_in, val_out, scores_in, scores_out, profile, alpha))
        row["verdict"] = verdict(row["eps_lb"], claimed_eps, row["profile_violated"])
    return row


def audit_losses(val_in, val_out, eval_in, eval_out, claimed_eps: float, delta: float,
                 alpha: float = ALPHA, profile: ClaimedProfile | None = None) -> dict:
    """The attack "in iff loss < tau": :func:`audit_scores` of the scores ``-loss``, with
    tau a loss (and the profile test's threshold too). An infinite loss (a diverged run) is
    "out"."""
    out = audit_scores(*(-np.asarray(v, float) for v in (val_in, val_out, eval_in, eval_out)),
                       claimed_eps, delta, alpha, profile)
    for key in ("threshold", "profile_threshold"):
        if key in out:
            out[key] = -out[key]
    return out


#: The four groups of an implementation's runs, in the order of the losses table.
GROUPS = (("validation", False), ("validation", True), ("evaluation", False),
          ("evaluation", True))


#: ``test_acc_source`` of an audit whose accuracies are those of its own runs.
OWN_RUNS = "the audited runs"


def audit_loss_table(losses: pd.DataFrame, claimed_eps: float, delta: float,
                     alpha: float = ALPHA, profile: ClaimedProfile | None = None) -> dict:
    """:func:`audit_losses` of one implementation's per-run losses (columns ``split``,
    ``canary_in``, ``loss``: the layout :func:`audit_implementation` returns)."""
    groups = {key: grp.loss.to_numpy(float)
              for key, grp in losses.groupby(["split", "canary_in"])}
    missing = [key for key in GROUPS if key not in groups]
    if missing:
        raise ValueError(f"losses: no runs of (split, canary_in) {missing}")
    return audit_losses(groups[("validation", True)], groups[("validation", False)],
                        groups[("evaluation", True)], groups[("evaluation", False)],
                        claimed_eps, delta, alpha, profile)
