"""The ``audit-impl`` procedure: a training function's runs with and without a canary, in
any mode, refused where they cannot be audited, and their audit row."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ... import canaries, subjects, trials
from ...canaries import Canary
from ...trials import Side, run as run_trials
from .claim import Design
from .modes import Mode, _tight_columns, audit_whitebox, check_mode
from .recheck import recheck_blackbox
from .rounds import evaluation_rounds, sequential_columns
from .runs import (Batches, Checks, Unauditable, _with_canary, check_seeds, run_seeds, run_side,
                   train_runs)
from .statistics import GROUPS, OWN_RUNS, accuracy_columns, audit_loss_table, run_columns


def audit_implementation(train_fn, X: torch.Tensor, y: torch.Tensor, canary: Canary | None,
                         design: Design, spec: dict, *,
                         test: tuple[torch.Tensor, torch.Tensor] | None = None,
                         mode: Mode = Mode(), checks: Checks = Checks(),
                         batches: Batches = Batches()) -> tuple[dict, pd.DataFrame]:
    """Audit ``train_fn`` against the claim of ``design`` with ``canary``.

    The validation runs choose the canary label (if not given: least likely under the
    validation runs without it) and the threshold; the evaluation runs give the counts
    (``design``). Returns the audit row (claim, runs, TPR, FPR, threshold, eps_LB, mu_LB,
    verdict, ...) and the per-run losses (split, canary_in, run, seed, loss). With ``test
    = (X_test, y_test)`` every model's accuracy on it is recorded too: ``test_acc`` in the
    losses, its mean, min and max over all runs in the row (:func:`accuracy_columns`).
    ``batches``: how many runs each call trains, and where they are kept (:class:`Batches`).

    The audit refuses (:class:`Unauditable`, before writing anything) output that breaks
    the contract and what ``checks`` refuses (:class:`Checks`): runs that do not follow
    their seeds (:func:`check_seeds` before any run, and :func:`recheck_blackbox` on runs
    of each side drawn after them, with the probe of the init), too many diverged runs,
    and, with ``test``, models at chance. The row says how many runs were usable
    (``usable_runs``, finite canary loss, of ``total_runs``), how many diverged and how
    many seeds were checked.

    ``mode`` (:class:`Mode`): ``worst-case-init`` passes its ``init`` to every call of
    ``train_fn``; ``white-box`` is :func:`audit_whitebox` (``canary`` and ``test`` unused).
    A tight mode's row adds ``mode``, ``method``, ``threat_model``, ``relation``, ``eps_th``
    (the claimed eps, of add/remove neighbours) and ``certified``. ``batches.together`` is
    for the default mode only. ``design.profile``: every mode inserts the canary, so
    add/remove neighbours.

    ``train_fn``: a :class:`dpaudit.user_code.Worker` (the user's code in a process of its
    own) or a function called in this process.

    ``design.schedule``: the evaluation runs in rounds, the audit
    :func:`.sequential.sequential_audit` (``batches.store`` unsupported); the row's bounds
    are its anytime-valid ones, with ``looks``, ``stop_reason``, ``max_runs``, and the
    refusals and the re-check apply to the runs it trained.
    """
    check_mode(train_fn, mode.name)
    if batches.together and mode.name != "black-box":
        raise ValueError(f"together: only in mode 'black-box', not {mode.name!r}")
    if design.schedule is not None and (batches.store is not None or batches.together):
        raise ValueError("schedule: a sequential audit keeps no batches (store, together)")
    if mode.name == "white-box":
        return audit_whitebox(train_fn, X, y, design, spec, mode.mates, checks, batches)
    if checks.seed_check:  # before any run: a function that ignores its seeds fails in seconds
        check_seeds(train_fn, X, y, run_seeds(design.seed, "seed-check", False,
                                              checks.seed_check), spec,
                    torch.cat([canary.x[None].to(X.dtype), X[:100]]), mode.extra,
                    checks.call_limit)
    out, label, seq = _blackbox_runs(train_fn, X, y, canary, design, spec, test, mode,
                                     checks, batches)
    if checks.seed_check:  # on seeds drawn from all the runs' outputs; with init, its probe
        recheck_blackbox(lambda chunk, inside, more, named: train_runs(
            train_fn, X, y, canary.x, chunk, spec, label if inside else None, None, more,
            named, checks.call_limit)["log_prob"], out, design.seed, checks.seed_check,
            mode.extra)
    losses = _losses(out, label, test)
    diverged = checks.diverged(losses.loss, "loss")
    if test is not None and checks.refuse_at_chance:
        _refuse_at_chance(losses.test_acc, test[1])
    row = {**run_columns(design, {"canary": canary.kind, "canary_label": label},
                         len(losses), diverged, checks.seed_check),
           **(audit_loss_table(losses, design.claimed_eps, design.delta, design.alpha,
                               design.profile) if seq is None
              else {"max_runs": design.runs, **sequential_columns(seq, losses=True)})}
    if mode.name != "black-box":
        from ..tight.blackbox import THREAT_MODEL

        row.update(_tight_columns(mode.name, "blackbox-worst-case-init", THREAT_MODEL,
                                  design.claimed_eps))
    if test is not None:
        row.update(accuracy_columns(losses.test_acc, OWN_RUNS))
    return row, losses


def _blackbox_runs(train_fn, X: torch.Tensor, y: torch.Tensor, canary: Canary, design: Design,
                   spec: dict, test, mode: Mode, checks: Checks,
                   batches: Batches) -> tuple[pd.DataFrame, int, dict | None]:
    """The black-box runs of :func:`audit_implementation` (the rows of
    :func:`dpaudit.trials.run`, with ``log_prob`` and, with ``test``, ``test_acc``), the
    canary label and the sequential audit's row (None: a fixed audit). Those without the
    canary first: their validation runs choose the label (when the canary has none)."""
    label = canary.label
    together = batches.together or {}

    def keyed(base: dict | None, canary_in: bool) -> dict:
        return {**(base or {}), "test_acc": test is not None,
                **({"canary_label": int(label)} if canary_in else {}),
                **({} if mode.name == "black-box" else {"mode": mode.name})}

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
            fn, X, y, canary.x, chunk, spec, insert, test, mode.extra, runs,
            checks.call_limit).items()} for name, fn in fns.items()}
        for name, (_, other_store, other_key) in together.items():
            if name in stats:
                trials.keep(other_store, keyed(other_key, insert is not None), side,
                            start, chunk, stats[name])
        return stats[None]

    fixed = design.schedule is None  # else the evaluation runs come in rounds, after the validation

    def sides(canary_in: bool) -> list[Side]:
        return [run_side(design.seed, "validation", canary_in, design.val_runs)] + fixed * [
            run_side(design.seed, "evaluation", canary_in, design.runs)]

    out = run_trials(sides(False), train_score, batches.size, batches.progress,
                     store=batches.store, key=keyed(batches.key, False))
    if label is None:
        label = canaries.least_likely_label(
            np.stack(out[out.split == "validation"].log_prob.to_numpy()))
    out = pd.concat([out, run_trials(sides(True), train_score, batches.size, batches.progress,
                                     store=batches.store, key=keyed(batches.key, True))],
                    ignore_index=True)
    seq = None
    if not fixed:
        seq, evaluation = evaluation_rounds(
            train_score, lambda runs: np.array([lp[label] for lp in runs.log_prob]),
            out, design, batches)
        out = pd.concat([out, evaluation], ignore_index=True)
    return out, label, seq


def _losses(out: pd.DataFrame, label: int, test) -> pd.DataFrame:
    """The per-run losses of the canary (``label``) of the runs ``out``, in the order of
    :data:`GROUPS`: split, canary_in, run, seed, loss (and, with ``test``, test_acc)."""
    out = out.assign(loss=[-lp[label] for lp in out.log_prob])
    keep = ["split", "canary_in", "run", "seed", "loss"] + (["test_acc"] if test is not None else [])
    out = out.rename(columns={"trial": "run"})[keep]
    groups = dict(list(out.groupby(["split", "canary_in"])))
    return pd.concat([groups[key] for key in GROUPS], ignore_index=True)


def _refuse_at_chance(test_acc: pd.Series, y_test) -> None:
    """Refuse (:class:`Unauditable`) models whose mean test accuracy is no better than
    always predicting the most frequent class of ``y_test``."""
    chance = float(np.bincount(np.asarray(y_test)).max() / len(y_test))
    if test_acc.mean() <= chance:
        raise Unauditable(
            f"the models' mean test accuracy {test_acc.mean():.4f} is at chance "
            f"(always predicting the most frequent test class scores {chance:.4f}): "
            "they learnt nothing, and an audit of them shows nothing")
