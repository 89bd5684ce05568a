"""The ``audit-impl`` procedure: a training function's runs with and without a canary, in
any mode, refused where they cannot be audited, and their audit row."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ... import canaries, dpsgd, subjects, trials
from ...canaries import Canary
from ...trials import Side, run as run_trials
from .claim import ALPHA
from .modes import _tight_columns, audit_whitebox, check_mode
from .profile import ClaimedProfile
from .recheck import recheck_blackbox
from .rounds import evaluation_rounds, sequential_columns
from .runs import (CALL_LIMIT, SEED_CHECK, Progress, Unauditable, _with_canary, check_options,
                   check_seeds, run_seeds, train_runs)
from .sequential import Schedule
from .statistics import GROUPS, OWN_RUNS, accuracy_columns, audit_loss_table


def audit_implementation(train_fn, X: torch.Tensor, y: torch.Tensor, canary: Canary,
                         claimed_eps: float, delta: float, runs: int, val_runs: int,
                         spec: dict, seed: int, alpha: float = ALPHA, batch_runs: int = 1000,
                         progress: Progress | None = None,
                         test: tuple[torch.Tensor, torch.Tensor] | None = None, store=None,
                         key: dict | None = None, together: dict | None = None,
                         seed_check: int = SEED_CHECK, max_diverged: float = 0.0,
                         mode: str = "black-box", init: dpsgd.Params | None = None,
                         refuse_at_chance: bool = True, profile: ClaimedProfile | None = None,
                         call_limit: float | None = CALL_LIMIT,
                         mates: float = 0.0,
                         schedule: Schedule | None = None) -> tuple[dict, pd.DataFrame]:
    """Audit ``train_fn`` against its claimed (eps, delta) with ``canary``.

    ``val_runs`` runs per side choose the canary label (if not given: least likely under
    the validation runs without it) and the threshold; ``runs`` further runs per side give
    the counts.  Returns the audit row (claim, runs, TPR, FPR, threshold, eps_LB, mu_LB,
    verdict, ...) and the per-run losses (split, canary_in, run, seed, loss).  With
    ``test = (X_test, y_test)`` every model's accuracy on it is recorded too: ``test_acc``
    in the losses, its mean, min and max over all runs in the row
    (:func:`accuracy_columns`).

    ``store`` (a folder): each batch of ``batch_runs`` runs is kept there under ``key``
    (what the runs depend on: implementation, spec, seed, data, device, trainer; the
    canary label is added for the runs with the canary) and a rerun restores it instead
    of training (:func:`dpaudit.trials.run`).  ``together``: {name: (train_fn, store,
    key)} of other implementations audited with the same spec; where
    :func:`dpaudit.subjects.train_columns` can train them beside this one (registry
    subjects), every batch trains them all as the columns of one call and keeps their
    statistics in their stores under their keys, where their own audit finds them (with
    the same canary label) instead of training.

    The audit refuses (:class:`Unauditable`, before writing anything) what it cannot
    audit: output that breaks the contract; runs that do not follow their seeds
    (:func:`check_seeds` on ``seed_check`` seeds of their own before any run, and
    :func:`recheck_blackbox` on ``seed_check`` runs of each side drawn after them, with
    the probe of ``init``; 0 skips both); more than a fraction ``max_diverged`` of runs with a non-finite canary loss
    (diverged: they count as "out", a fixed decision); and, with ``test`` and
    ``refuse_at_chance``, models whose mean test accuracy is no better than always
    predicting the most frequent test class (a user's function that learns nothing is
    broken; dpaudit's own subjects are not, and at a tiny scale may still learn nothing).
    The row says how many runs were usable (``usable_runs``, finite canary loss, of
    ``total_runs``), how many diverged and how many seeds were checked.

    ``mode`` (:data:`MODES`): ``worst-case-init`` passes ``init`` (the auditor's initial
    parameters, e.g. :func:`pretrained_init`) to every call of ``train_fn``;
    ``white-box`` is :func:`audit_whitebox` (``canary`` and ``test`` unused). A tight
    mode's row adds ``mode``, ``method``, ``threat_model``, ``relation``, ``eps_th`` (the
    claimed eps, of add/remove neighbours) and ``certified``. ``together`` is for the
    default mode only.

    ``profile`` (:func:`claimed_profile`, from the spec; every mode inserts the canary, so
    add/remove neighbours): the same runs also test the claimed DP-SGD privacy profile
    (:func:`profile_columns`), and the verdict names the test that fired.

    ``train_fn``: a :class:`dpaudit.user_code.Worker` (the user's code in a process of its
    own) or a function called in this process. Every call of it and of its predict may
    take ``call_limit`` seconds: one that fails or runs past it ends the audit
    (:class:`UserCodeFailed`, naming the call).

    ``schedule`` (:func:`.rounds.schedule_of`, ``runs`` its most per side): the evaluation
    runs in rounds, the audit :func:`.sequential.sequential_audit` (``store`` unsupported);
    the row's bounds are its anytime-valid ones, with ``looks``, ``stop_reason``,
    ``max_runs``, and the refusals and the re-check apply to the runs it trained.
    """
    if runs < 1 or val_runs < 1:
        raise ValueError("runs and val_runs must be >= 1")
    check_options(seed_check, max_diverged)
    check_mode(train_fn, mode)
    if (mode == "worst-case-init") != (init is not None):
        raise ValueError(f"init: given in mode {mode!r}; mode 'worst-case-init' needs it "
                         "(the auditor's initial parameters) and the others take none")
    if mates and mode != "white-box":
        raise ValueError(f"mates: only in mode 'white-box', not {mode!r}")
    if together and mode != "black-box":
        raise ValueError(f"together: only in mode 'black-box', not {mode!r}")
    if schedule is not None and (store is not None or together):
        raise ValueError("schedule: a sequential audit keeps no batches (store, together)")
    if mode == "white-box":
        return audit_whitebox(train_fn, X, y, claimed_eps, delta, runs, val_runs, spec, seed,
                              alpha, batch_runs, progress, store, key, seed_check,
                              max_diverged, profile, call_limit, mates, schedule)
    extra = None if init is None else {"init": init}
    label = canary.label
    if seed_check:  # before any run: a function that ignores its seeds fails in seconds
        check_seeds(train_fn, X, y, run_seeds(seed, "seed-check", False, seed_check), spec,
                    torch.cat([canary.x[None].to(X.dtype), X[:100]]), extra, call_limit)

    def side(split: str, canary_in: bool, n: int) -> Side:
        return Side(f"{split} runs {'with' if canary_in else 'without'} canary",
                    run_seeds(seed, split, canary_in, n),
                    {"split": split, "canary_in": canary_in})

    together = together or {}

    def keyed(base: dict | None, canary_in: bool) -> dict:
        return {**(base or {}), "test_acc": test is not None,
                **({"canary_label": int(label)} if canary_in else {}),
                **({} if mode == "black-box" else {"mode": mode})}

    def train_score(side: Side, start: int, chunk: list[int]) -> dict:
        insert = label if side.columns["canary_in"] else None
        fns = {None: train_fn}
        if together:  # the others as columns of the same call, when they can be
            trained = subjects.train_columns(
                [train_fn] + [fn for fn, _, _ in together.values()],
                *_with_canary(X, y, canary.x, insert), chunk, spec)
            if trained is not None:
                fns = {name: lambda *_, p=p: p for name, p in zip([None, *together], trained)}
        runs = f"{side.name} {start}-{start + len(chunk) - 1}"
        stats = {name: {k: list(v) for k, v in train_runs(
            fn, X, y, canary.x, chunk, spec, insert, test, extra, runs, call_limit).items()}
            for name, fn in fns.items()}
        for name, (_, other_store, other_key) in together.items():
            if name in stats:
                trials.keep(other_store, keyed(other_key, insert is not None), side,
                            start, chunk, stats[name])
        return stats[None]

    log = progress
    # Without the canary first: its validation runs choose the label (when not given).
    fixed = schedule is None  # else the evaluation runs come in rounds, after the validation
    out = run_trials([side("validation", False, val_runs)] + fixed * [
        side("evaluation", False, runs)], train_score, batch_runs, log, store=store,
        key=keyed(key, False))
    if label is None:
        label = canaries.least_likely_label(
            np.stack(out[out.split == "validation"].log_prob.to_numpy()))
    out = pd.concat([out, run_trials([side("validation", True, val_runs)] + fixed * [
        side("evaluation", True, runs)], train_score, batch_runs, log, store=store,
        key=keyed(key, True))], ignore_index=True)
    if not fixed:
        seq, evaluation = evaluation_rounds(
            side, train_score, lambda runs: np.array([lp[label] for lp in runs.log_prob]),
            out, claimed_eps, delta, alpha, profile, schedule, batch_runs, log)
        out = pd.concat([out, evaluation], ignore_index=True)
    if seed_check:  # on seeds drawn from all the runs' outputs; with init, its probe
        recheck_blackbox(lambda chunk, inside, more, named: train_runs(
            train_fn, X, y, canary.x, chunk, spec, label if inside else None, None, more,
            named, call_limit)["log_prob"], out, seed, seed_check, extra)
    out["loss"] = [-lp[label] for lp in out.log_prob]
    keep = ["split", "canary_in", "run", "seed", "loss"] + (["test_acc"] if test is not None else [])
    out = out.rename(columns={"trial": "run"})[keep]
    groups = dict(list(out.groupby(["split", "canary_in"])))
    losses = pd.concat([groups[key] for key in GROUPS], ignore_index=True)
    diverged = int((~np.isfinite(losses.loss)).sum())
    if diverged > max_diverged * len(losses):
        raise Unauditable(f"{diverged} of {len(losses)} runs diverged (non-finite canary "
                          f"loss); at most max_diverged={max_diverged:g} of them may")
    if test is not None and refuse_at_chance:
        chance = float(np.bincount(np.asarray(test[1])).max() / len(test[1]))
        if losses.test_acc.mean() <= chance:
            raise Unauditable(
                f"the models' mean test accuracy {losses.test_acc.mean():.4f} is at chance "
                f"(always predicting the most frequent test class scores {chance:.4f}): "
                "they learnt nothing, and an audit of them shows nothing")
    row = {"claimed_eps": claimed_eps, "delta": delta, "runs": runs, "val_runs": val_runs,
           "alpha": alpha, "canary": canary.kind, "canary_label": label, "seed": seed,
           "total_runs": len(losses), "usable_runs": len(losses) - diverged,
           "diverged_runs": diverged, "seed_check": seed_check,
           **(audit_loss_table(losses, claimed_eps, delta, alpha, profile) if fixed
              else {"max_runs": runs, **sequential_columns(seq, losses=True)})}
    if mode != "black-box":
        from ..tight.blackbox import THREAT_MODEL

        row.update(_tight_columns(mode, "blackbox-worst-case-init", THREAT_MODEL, claimed_eps))
    if test is not None:
        row.update(accuracy_columns(losses.test_acc, OWN_RUNS))
    return row, losses
