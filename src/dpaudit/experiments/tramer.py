"""Auditing a DP training implementation with a canary (Tramer et al. 2022).

The test of "Debugging Differential Privacy: A Case Study for Privacy Auditing": train
many models on the data set D (negative runs) and on D' = D + {(x', y')} (positive runs),
with one *canary* (x', y') inserted once, and record the canary's loss
``l(x', y') = -log softmax(f(x'))_{y'}`` in every run.  The attack says "canary in" when
that loss is below a threshold tau, chosen on separate *validation* runs so that the
*evaluation* runs that give the counts are independent of the choice.  With ``ct_pos`` of
``n`` positive and ``ct_neg`` of ``n`` negative evaluation runs said "in":

* Clopper-Pearson (Tramer et al. 2022): an (eps, delta)-DP algorithm has
  ``TPR <= e^eps FPR + delta`` (and the same for the complementary event), so the
  one-sided Clopper-Pearson bounds ``TPR_lo`` and ``FPR_hi`` refute every
  ``eps < ln((TPR_lo - delta) / FPR_hi)``.  The CSCI 699 Week 4 lecture notes' worked
  check of Tramer et al. 2022 states its result "with p = 1e-10" and takes each of the
  two one-sided bounds at p/2 = 5e-11: that reproduces its ``alpha^+ <= 0.95509`` (FNR)
  and ``beta^- >= 0.00274`` (written for the FPR's upper bound) from TPR 4922 / 1e5 and
  FPR 174 / 1e5.  :func:`dpaudit.bounds.eps_lb_clopper_pearson` splits ``alpha`` in the
  same way, so ``alpha = 1e-10`` here is the lecture's p.
* GDP test ([NHSB23]; also in the same lecture): a mu-GDP algorithm has
  ``mu >= Phi^-1(TPR) - Phi^-1(FPR)``; the same two bounds give ``mu_LB``
  (:func:`dpaudit.bounds.mu_lb_gdp`), reported with the eps it implies at the claimed
  delta and with the mu a Gaussian mechanism claiming (eps, delta) would have.  It
  assumes the mechanism's trade-off curve is Gaussian; the verdict rests on the
  assumption-free Clopper-Pearson bound.
* For comparison, from the same counts: the approximate Katz bound
  (:func:`dpaudit.bounds.eps_lb_katz`, asymptotic) and the lower end of the Bayesian
  credible interval of Zanella-Beguelin et al. 2023 (:func:`dpaudit.bounds.eps_lb_bayes`);
  and the attack's ROC measures on the evaluation runs (Carlini et al. 2022): TPR at
  FPR <= 0.1% and <= 1%, and the AUC of minus the loss.  Neither enters the verdict.

The verdict "violates its claimed guarantee" is given when ``eps_LB`` exceeds the
claimed eps: then, unless an event of probability at most ``alpha`` occurred, the
implementation is not (eps, delta)-DP.

Training functions follow the contract of :mod:`dpaudit.subjects`:
``train(X, y, seeds, spec) -> predict``, ``predict(x) -> logits (len(seeds), m, C)``.
"""

from __future__ import annotations

from functools import partial
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch
from scipy import optimize

from .. import bounds, canaries, seeds, subjects, trials
from ..trials import Side, run as run_trials
from ..canaries import Canary

#: The confidence of the lecture's worked check of Tramer et al. 2022: each claim holds
#: with probability at least 1 - 1e-10.
ALPHA = 1e-10
VIOLATES = "violates its claimed guarantee"
NO_VIOLATION = "no violation detected"

#: Keys of the ``tramer`` config section each audit depends on (``dpaudit tramer-audit
#: --target``): the rule passes only these, so editing one audit never reruns the other.
SPEC_KEYS = {
    "case-study": ("implementations", "eps", "delta", "alpha", "canary", "classes", "n_train",
                   "runs", "val_runs", "batch_runs", "model"),
    "user": ("user", "alpha", "classes", "n_train", "batch_runs"),
}

Progress = Callable[[str], None]


# ---- training runs --------------------------------------------------------------------

def run_seeds(seed: int, split: str, canary_in: bool, count: int) -> list[int]:
    """Distinct 63-bit seeds of the ``count`` runs of one (split, side) under ``seed``
    (:func:`dpaudit.seeds.int_seeds`, keyed by the split and the side)."""
    return seeds.int_seeds(count, int(seed), f"tramer/{split}/{'in' if canary_in else 'out'}")


def _with_canary(X: torch.Tensor, y: torch.Tensor, x: torch.Tensor,
                 insert_label: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The training data, with (x, insert_label) appended once unless the label is None."""
    if insert_label is None:
        return X, y
    return (torch.cat([X, x[None].to(X.dtype)]),
            torch.cat([y, torch.tensor([insert_label], dtype=y.dtype)]))


def trainer_digest() -> str:
    """SHA-256 of the code that turns a run's seed into its statistics (the trainer, the
    subjects, the canaries, the seed derivation, the trials loop and this module): kept
    batches of runs are reused only under the same digest."""
    import hashlib
    import inspect
    import sys

    from .. import dpsgd

    h = hashlib.sha256()
    for module in (dpsgd, subjects, canaries, seeds, trials, sys.modules[__name__]):
        h.update(inspect.getsource(module).encode())
    return h.hexdigest()


def canary_log_probs(train_fn, X: torch.Tensor, y: torch.Tensor, x: torch.Tensor,
                     seeds: Sequence[int], spec: dict,
                     insert_label: int | None = None) -> np.ndarray:
    """Log-probabilities (runs, C) that ``len(seeds)`` models trained at once by
    ``train_fn`` give the canary input ``x``; with ``insert_label`` the canary
    (x, insert_label) is appended once to the training data.  NaN outputs (a diverged run)
    become -inf log-probabilities, i.e. infinite loss: a fixed decision.
    """
    X, y = _with_canary(X, y, x, insert_label)
    predict = train_fn(X, y, list(seeds), spec)
    with torch.no_grad():
        logits = predict(x[None].to(X.dtype))
    if logits.ndim != 3 or logits.shape[:2] != (len(seeds), 1):
        raise ValueError(f"predict(x) returned shape {tuple(logits.shape)}; the contract is "
                         f"(len(seeds)={len(seeds)}, len(x)=1, n_classes)")
    lp = torch.log_softmax(logits[:, 0].to(torch.float64), dim=-1).cpu().numpy()
    return np.nan_to_num(lp, nan=-np.inf)


# ---- statistics -----------------------------------------------------------------------

def mu_claimed(eps: float, delta: float) -> float:
    """mu of the Gaussian mechanism that is exactly (eps, delta)-DP: the root of
    ``delta_from_mu(mu, eps) = delta`` ([DRS19] Corollary 2.13; increasing in mu)."""
    f = lambda mu: bounds.delta_from_mu(mu, eps) - delta  # noqa: E731
    hi = 1.0
    while f(hi) < 0:
        hi *= 2
    return float(optimize.brentq(f, 1e-12, hi, xtol=1e-14, rtol=1e-12))


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
            "verdict": VIOLATES if eps_lb > claimed_eps else NO_VIOLATION}


def audit_losses(val_in, val_out, eval_in, eval_out, claimed_eps: float, delta: float,
                 alpha: float = ALPHA) -> dict:
    """The attack "in iff loss < tau": tau chosen on the validation losses, counts and
    bounds on the evaluation losses (:func:`dpaudit.bounds.threshold_holdout_audit` on
    the scores ``-loss``, so ``pos`` = with the canary, ``neg`` = without).

    Over every distinct decision on the validation runs, tau maximizes the
    Clopper-Pearson eps_LB the validation counts would give at the same ``alpha``; ties
    (e.g. all zero, as for a correct implementation) go to the largest ``TPR - FPR``, and
    tau lies midway between two validation losses, a margin on both sides for the
    evaluation runs.  NaN losses are refused; an infinite loss (a diverged run) is "out".
    """
    res = bounds.threshold_holdout_audit(
        -np.asarray(val_in, float), -np.asarray(val_out, float), -np.asarray(eval_in, float),
        -np.asarray(eval_out, float), partial(bounds.eps_lb_clopper_pearson, delta=delta),
        alpha, ties="youden")
    scores_in, scores_out = -np.asarray(eval_in, float), -np.asarray(eval_out, float)
    return {"tpr": res.ct_pos / res.n_pos, "fpr": res.ct_neg / res.n_neg,
            "threshold": -res.threshold, "ct_pos": res.ct_pos, "ct_neg": res.ct_neg,
            "tpr_at_fpr_0_1pct": bounds.tpr_at_fpr(scores_in, scores_out, 0.001),
            "tpr_at_fpr_1pct": bounds.tpr_at_fpr(scores_in, scores_out, 0.01),
            "auc": bounds.auc(scores_in, scores_out),
            **audit_counts(res.ct_pos, res.n_pos, res.ct_neg, res.n_neg, claimed_eps, delta,
                           alpha)}


def max_eps_lb(runs: int, delta: float, alpha: float = ALPHA) -> float:
    """eps_LB of a perfect attack (TPR = 1, FPR = 0) on ``runs`` evaluation runs per side."""
    return bounds.eps_lb_clopper_pearson(runs, runs, 0, runs, alpha, delta)


def min_runs(claimed_eps: float, delta: float, alpha: float = ALPHA) -> int:
    """Fewest evaluation runs per side at which a perfect attack's eps_LB exceeds ``claimed_eps``.

    With all n positive and no negative runs "in", the one-sided bounds are
    ``TPR_lo = (alpha/2)^(1/n)`` and ``FPR_hi = 1 - TPR_lo``, so the best possible
    ``eps_LB = ln((TPR_lo - delta) / (1 - TPR_lo))`` grows with n; below the returned n no
    attack can refute the claim at confidence ``1 - alpha`` (e.g. 40 for (0.21, 1e-5) at
    alpha = 1e-10).
    """
    hi = 1
    while max_eps_lb(hi, delta, alpha) <= claimed_eps:
        hi *= 2
    lo = hi // 2  # max_eps_lb(lo) <= claimed_eps (or lo = 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if max_eps_lb(mid, delta, alpha) > claimed_eps else (mid, hi)
    return hi


def audit_implementation(train_fn, X: torch.Tensor, y: torch.Tensor, canary: Canary,
                         claimed_eps: float, delta: float, runs: int, val_runs: int,
                         spec: dict, seed: int, alpha: float = ALPHA, batch_runs: int = 1000,
                         progress: Progress | None = None, store=None, key: dict | None = None,
                         together: dict | None = None) -> tuple[dict, pd.DataFrame]:
    """Audit ``train_fn`` against its claimed (eps, delta) with ``canary``.

    ``val_runs`` runs per side choose the canary label (if not given: least likely under
    the validation runs without it) and the threshold; ``runs`` further runs per side give
    the counts.  Returns the audit row (claim, runs, TPR, FPR, threshold, eps_LB, mu_LB,
    verdict, ...) and the per-run losses (split, canary_in, run, seed, loss).

    ``store`` (a folder): each batch of ``batch_runs`` runs is kept there under ``key``
    (what the runs depend on: implementation, spec, seed, data, device, trainer; the
    canary label is added for the runs with the canary) and a rerun restores it instead
    of training (:func:`dpaudit.trials.run`).  ``together``: {name: (train_fn, store,
    key)} of other implementations audited with the same spec; where
    :func:`dpaudit.subjects.train_columns` can train them beside this one (registry
    subjects), every batch trains them all as the columns of one call and keeps their
    statistics in their stores under their keys, where their own audit finds them (with
    the same canary label) instead of training.
    """
    if runs < 1 or val_runs < 1:
        raise ValueError("runs and val_runs must be >= 1")
    label = canary.label

    def side(split: str, canary_in: bool, n: int) -> Side:
        return Side(f"{split} runs {'with' if canary_in else 'without'} canary",
                    run_seeds(seed, split, canary_in, n),
                    {"split": split, "canary_in": canary_in})

    together = together or {}

    def keyed(base: dict | None, canary_in: bool) -> dict:
        return {**(base or {}), **({"canary_label": int(label)} if canary_in else {})}

    def train_score(side: Side, chunk: list[int]) -> dict:
        insert = label if side.columns["canary_in"] else None
        fns = {None: train_fn}
        if together:  # the others as columns of the same call, when they can be
            trained = subjects.train_columns(
                [train_fn] + [fn for fn, _, _ in together.values()],
                *_with_canary(X, y, canary.x, insert), chunk, spec)
            if trained is not None:
                fns = {name: lambda *_, p=p: p for name, p in zip([None, *together], trained)}
        stats = {name: {"log_prob": list(canary_log_probs(fn, X, y, canary.x, chunk, spec,
                                                          insert))}
                 for name, fn in fns.items()}
        for name, (_, other_store, other_key) in together.items():
            if name in stats:
                trials.keep(other_store, keyed(other_key, insert is not None), side,
                            list(side.seeds).index(chunk[0]), chunk, stats[name])
        return stats[None]

    log = progress
    # Without the canary first: its validation runs choose the label (when not given).
    out = run_trials([side("validation", False, val_runs), side("evaluation", False, runs)],
                     train_score, batch_runs, log, store=store, key=keyed(key, False))
    if label is None:
        label = canaries.least_likely_label(
            np.stack(out[out.split == "validation"].log_prob.to_numpy()))
    out = pd.concat([out, run_trials([side("validation", True, val_runs),
                                      side("evaluation", True, runs)],
                                     train_score, batch_runs, log, store=store,
                                     key=keyed(key, True))], ignore_index=True)
    out["loss"] = [-lp[label] for lp in out.log_prob]
    out = out.rename(columns={"trial": "run"})[["split", "canary_in", "run", "seed", "loss"]]
    order = [("validation", False), ("validation", True), ("evaluation", False),
             ("evaluation", True)]
    groups = dict(list(out.groupby(["split", "canary_in"])))
    losses = pd.concat([groups[key] for key in order], ignore_index=True)
    loss = {key: groups[key].loss.to_numpy() for key in order}
    row = {"claimed_eps": claimed_eps, "delta": delta, "runs": runs, "val_runs": val_runs,
           "alpha": alpha, "canary": canary.kind, "canary_label": label, "seed": seed,
           **audit_losses(loss[("validation", True)], loss[("validation", False)],
                          loss[("evaluation", True)], loss[("evaluation", False)],
                          claimed_eps, delta, alpha)}
    return row, losses


__all__ = ["ALPHA", "VIOLATES", "NO_VIOLATION", "SPEC_KEYS", "run_seeds", "trainer_digest",
           "canary_log_probs", "mu_claimed", "audit_counts", "audit_losses", "max_eps_lb",
           "min_runs", "audit_implementation"]
