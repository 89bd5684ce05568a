"""``audit-impl --sequential``: the evaluation runs of any mode trained in rounds by
:func:`.sequential.sequential_audit`, on the seeds the fixed audit gives them (a sequential
audit's runs are a prefix of the fixed audit's), and its row in the fixed row's layout."""

from __future__ import annotations

import math
import time
from typing import Callable

import numpy as np
import pandas as pd

from ...trials import Side, run as run_trials
from .claim import Design
from .runs import Batches, run_side
from .sequential import SIDES, Schedule, sequential_audit


def schedule_of(runs: int, budget_s: float = math.inf) -> Schedule:
    """The rounds of ``audit-impl --sequential``: at most ``runs`` evaluation runs per side
    (the first round :class:`Schedule`'s default, or all of them if fewer), no new batch
    after ``budget_s`` seconds of evaluation rounds (:func:`evaluation_rounds` always
    completes the first)."""
    return Schedule(first=min(Schedule.first, runs), max_runs=runs, budget_s=budget_s)


def evaluation_rounds(train_score: Callable, score: Callable[[pd.DataFrame], np.ndarray],
                      val: pd.DataFrame, design: Design,
                      batches: Batches) -> tuple[dict, pd.DataFrame]:
    """The sequential audit's row and the evaluation runs it trained (the rows of
    :func:`dpaudit.trials.run`) of ``design`` (its ``schedule``), on the seeds of the fixed
    audit's evaluation runs, ``batches.size`` runs per call of ``train_score`` (as for
    :func:`dpaudit.trials.run`); ``score(runs)``: their scores (higher = with the canary);
    ``val``: the validation runs (``canary_in`` and what ``score`` reads)."""
    frames = []

    def more(name: str, start: int, count: int) -> np.ndarray:
        full = run_side(design.seed, "evaluation", name == "in", start + count)
        part = Side(full.name, list(full.seeds[start:]), full.columns)
        got = run_trials([part], lambda s, at, chunk: train_score(s, start + at, chunk),
                         batches.size, batches.progress)
        got["trial"] += start
        frames.append(got)
        return score(got)

    t0 = time.monotonic()

    def clock() -> float:  # the budget never stops the first round: both sides get runs
        return time.monotonic() if len(frames) >= len(SIDES) else t0

    def report(state: dict) -> None:
        if batches.progress is not None:
            batches.progress(state["message"])

    row = sequential_audit(score(val[val.canary_in]), score(val[~val.canary_in]), more,
                           design.claimed_eps, design.delta, design.alpha, design.profile,
                           design.schedule, report, clock)
    return row, pd.concat(frames, ignore_index=True)


def sequential_columns(row: dict, losses: bool) -> dict:
    """The fixed row's bound columns from :func:`.sequential.sequential_audit`'s ``row``:
    ``runs`` the evaluation runs per side it used (the fewer of the two sides), ``mu_lb``
    NaN (the GDP bound has no anytime-valid version here), thresholds as losses where
    ``losses`` (the black-box score is minus the canary loss)."""
    out = {**row, "runs": min(row["runs_in"], row["runs_out"]), "mu_lb": math.nan,
           "sequential": True}
    if losses:
        for key in ("threshold", "profile_threshold"):
            if key in out:
                out[key] = -out[key]
    return out
