"""How many trials does each way from counts to epsilon need?

The cost of a many-model audit is its trials (trained models).  This study takes the
score tables of a few cells the Jagielski et al. grids already train, draws ``n`` of each
side's trials without replacement (``subsamples`` times for each ``n`` of a geometric grid
from ``n_min`` to the full count) and audits every draw exactly as the cell's result row
is computed (:func:`dpaudit.experiments.jagielski.summarize_cell`: the first half of the
drawn trials choose the threshold, the second half evaluate it, every k at
``alpha / len(ks)``).  Methods (:data:`METHODS`): the certified Clopper-Pearson bound, the
approximate Katz bound, the lower end of the Bayesian credible interval and the GDP
estimate.  The summary compares the methods against one common target per cell,
``fraction`` of the certified bound's median at the full count: the trials per side at
which each method's median reaches it (interpolated between grid points), beside each
method's own median at the full count.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import pandas as pd

from .. import seeds
from . import jagielski
from .jagielski import cell_path, grid_cells, init_label

#: Result columns of the study, and what each is (figure legend and docs say the same).
METHODS = {
    "eps_lb": "Clopper-Pearson (certified)",
    "eps_lb_katz": "Katz (approximate)",
    "eps_lb_bayes": "Bayesian credible interval, lower end",
    "eps_lb_gdp": "GDP estimate (not a bound)",
}


def cells(spec: dict, jag: dict, onerun: dict | None = None) -> list[tuple]:
    """The cells (as :func:`grid_cells`) of the ``trials_needed`` config section: its data
    set, model, clip, init and attack at each of its eps labels.  A ValueError names the
    key when a cell is not one the training jobs train (the study adds no training)."""
    wanted = [(spec["dataset"], spec["arch"], float(spec["clip"]), init_label(spec["init"]),
               e, spec["attack"]) for e in spec["eps"]]
    trained = set(grid_cells(jag, onerun)["all"])
    for cell in wanted:
        if cell not in trained:
            raise ValueError(
                f"config trials_needed: the cell {cell_path(*cell)} (eps label {cell[4]!r}) "
                "is not trained by the jagielski grids; choose trials_needed.dataset, arch, "
                "clip, init, attack and eps among the cells of jagielski.fig2 or "
                "jagielski.table2 (the study reads their score tables and trains nothing)")
    return wanted


def n_grid(n_min: int, n_full: int, points: int) -> list[int]:
    """Trials per side: ``points`` geometrically spaced whole numbers from
    ``min(n_min, n_full)`` to ``n_full`` (both included, duplicates dropped)."""
    lo = min(n_min, n_full)
    return sorted({int(round(v)) for v in np.geomspace(lo, n_full, max(points, 1))} | {n_full})


def subsample(scores: pd.DataFrame, n: int, rng: np.random.Generator) -> pd.DataFrame:
    """``n`` trials of each side drawn without replacement, renumbered 0..n-1 in the
    order drawn (the split into threshold choice and evaluation follows that order)."""
    parts = []
    for _, side in scores.groupby("side", sort=True):
        if len(side) < n:
            raise ValueError(f"side {side.side.iloc[0]!r} has {len(side)} trials, fewer than {n}")
        part = side.iloc[rng.permutation(len(side))[:n]].copy()
        part["trial"] = np.arange(n)
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


def study(tables: list[tuple[pd.DataFrame, dict]], alpha: float, delta: float,
          select_frac: float, n_min: int, n_points: int, subsamples: int, seed: int,
          log: Callable[[str], None] | None = None) -> pd.DataFrame:
    """One row per (cell, n, subsample): the cell (``cell`` dicts of the score tables'
    provenance), ``n`` trials per side, ``subsample`` and the :data:`METHODS` columns."""
    say = log or (lambda msg: None)
    rows = []
    for scores, cell in tables:
        n_full = int(scores.groupby("side").size().min())
        grid = n_grid(n_min, n_full, n_points)
        name = cell_path(cell["dataset"], cell["arch"], cell["clip"], cell["init"],
                         cell["eps"], cell["attack"])
        say(f"{name}: n = {grid}, {subsamples} subsamples each")
        for n in grid:
            rng = seeds.rng(int(seed), f"trials_needed/{name}/{n}")
            for i in range(subsamples):
                row = jagielski.summarize_cell(subsample(scores, n, rng), cell["attack"], alpha,
                                               delta, select_frac)
                rows.append({**{k: cell[k] for k in ("dataset", "arch", "clip", "init",
                                                      "attack")},
                             "eps_label": cell["eps"], "n_full": n_full, "n": n,
                             "subsample": i, **{m: row[m] for m in METHODS}})
    return pd.DataFrame(rows)


#: The method whose median at the full count sets the common target of every method: the
#: certified bound, so that the study asks how many trials each method needs to reach
#: what the certified bound reaches with all of them.
TARGET_METHOD = "eps_lb"


def crossing(ns, medians, target: float) -> tuple[float, bool]:
    """Where a median curve first reaches ``target``: ``(n, at_first)``.

    ``n`` is interpolated linearly in log n between the last grid point below ``target``
    and the first at or above it (medians are on a coarse grid; the first grid point alone
    would jump between neighbours as the draws change); ``at_first`` is True when the
    curve already reaches ``target`` at the first grid point (then ``n`` is that point: at
    most so many trials are needed); ``n`` is NaN when no grid point reaches it.
    """
    ns, med = np.asarray(ns, float), np.asarray(medians, float)
    hit = np.flatnonzero(med >= target)
    if not hit.size:
        return math.nan, False
    i = int(hit[0])
    if i == 0:
        return float(ns[0]), True
    w = (target - med[i - 1]) / (med[i] - med[i - 1])
    return float(np.exp(np.log(ns[i - 1]) + w * (np.log(ns[i]) - np.log(ns[i - 1])))), False


def summary(table: pd.DataFrame, fraction: float) -> pd.DataFrame:
    """Per cell and method: ``full``, the method's median at the full count; ``target``,
    ``fraction`` times the certified bound's (:data:`TARGET_METHOD`) median at the full
    count, the same for every method of the cell; and ``n_needed``, the trials per side at
    which the method's median curve reaches ``target`` (:func:`crossing`: interpolated in
    log n, NaN when it never does, ``at_first`` when it does at the grid's first point).
    No target (NaN) when the certified bound's median at the full count is 0."""
    keys = ["dataset", "arch", "clip", "init", "attack", "eps_label"]
    med = table.groupby(keys + ["n"], sort=False)[list(METHODS)].median().reset_index()
    out = []
    for cell, grp in med.groupby(keys, sort=False):
        grp = grp.sort_values("n")
        reference = float(grp[TARGET_METHOD].iloc[-1])
        target = fraction * reference if reference > 0 else math.nan
        for method in METHODS:
            n_needed, at_first = (crossing(grp.n, grp[method], target) if reference > 0
                                  else (math.nan, False))
            out.append({**dict(zip(keys, cell)), "method": method,
                        "n_full": int(grp.n.iloc[-1]), "full": float(grp[method].iloc[-1]),
                        "target": target, "n_needed": n_needed, "at_first": at_first})
    return pd.DataFrame(out)


def markdown(summ: pd.DataFrame, fraction: float, alpha: float, subsamples: int) -> str:
    """The summary as Markdown: one row per cell, the common target, per method "trials
    needed (median at the full count)"."""
    lines = [f"Trials per side each method needs to reach one common target, {fraction:.0%} "
             f"of the certified Clopper-Pearson bound's median at the full count (median over "
             f"{subsamples} random subsamples per n, interpolated in log n between grid "
             f"points; half of the trials choose the threshold, half evaluate it; level "
             f"{1 - alpha:.0%}, Bonferroni over k).", "",
             "- " + "; ".join(f"`{m}`: {what}" for m, what in METHODS.items()) + ".",
             "- Each entry: trials needed (the method's own median at the full count); "
             "'<= n' where the smallest n already reaches the target; 'not reached' where "
             "the full count does not; '-' where the certified bound is 0 at the full count "
             "(no target).",
             "- Reaching the target with a method that is not a certified bound certifies "
             "nothing: it says how far that method's number runs ahead of the certified one.",
             "", "| cell | trials (full) | target | " + " | ".join(f"`{m}`" for m in METHODS)
             + " |", "|---" * (3 + len(METHODS)) + "|"]
    keys = ["dataset", "arch", "clip", "init", "attack", "eps_label"]
    for cell, grp in summ.groupby(keys, sort=False):
        d = dict(zip(keys, cell))
        name = (f"{d['dataset']} {d['arch']} {d['attack']}, C = {float(d['clip']):g}, "
                f"{d['init']} init, eps_th label {d['eps_label']}")
        by = grp.set_index("method")
        target = float(grp.target.iloc[0])
        cells = []
        for m in METHODS:
            n, full = by.n_needed[m], by.full[m]
            if math.isnan(target):
                text = "-"
            elif math.isnan(n):
                text = "not reached"
            else:
                text = f"<= {int(n)}" if by.at_first[m] else f"{int(round(n))}"
            cells.append(f"{text} ({full:.2f})")
        target_text = "-" if math.isnan(target) else f"{target:.2f}"
        lines.append(f"| {name} | {int(grp.n_full.iloc[0])} | {target_text} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


__all__ = ["METHODS", "TARGET_METHOD", "cells", "n_grid", "subsample", "study", "crossing",
           "summary", "markdown"]
