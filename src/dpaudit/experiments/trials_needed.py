"""How many trials does each way from counts to epsilon need?

The cost of a many-model audit is its trials (trained models).  This study takes the
score tables of a few cells the Jagielski et al. grids already train, draws ``n`` of each
side's trials without replacement (``subsamples`` times for each ``n`` of a geometric grid
from ``n_min`` to the full count) and audits every draw exactly as the cell's result row
is computed (:func:`dpaudit.experiments.jagielski.summarize_cell`: the first half of the
drawn trials choose the threshold, the second half evaluate it, every k at
``alpha / len(ks)``).  Methods (:data:`METHODS`): the certified Clopper-Pearson bound, the
approximate Katz bound, the lower end of the Bayesian credible interval and the GDP
estimate.  The summary reports, per cell and method, the median at the full count and the
fewest trials per side whose median reaches ``fraction`` of it.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import pandas as pd

from .. import seeds
from .jagielski import cell_path, grid_cells, init_label, summarize_cell

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
                row = summarize_cell(subsample(scores, n, rng), cell["attack"], alpha, delta,
                                     select_frac)
                rows.append({**{k: cell[k] for k in ("dataset", "arch", "clip", "init",
                                                      "attack")},
                             "eps_label": cell["eps"], "n_full": n_full, "n": n,
                             "subsample": i, **{m: row[m] for m in METHODS}})
    return pd.DataFrame(rows)


def summary(table: pd.DataFrame, fraction: float) -> pd.DataFrame:
    """Per cell and method: the median at the full count (``full``) and ``n_needed``, the
    fewest trials per side of the grid whose median is at least ``fraction * full``
    (NaN when ``full`` is 0: nothing to reach)."""
    keys = ["dataset", "arch", "clip", "init", "attack", "eps_label"]
    med = table.groupby(keys + ["n"], sort=False)[list(METHODS)].median().reset_index()
    out = []
    for cell, grp in med.groupby(keys, sort=False):
        grp = grp.sort_values("n")
        for method in METHODS:
            full = float(grp[method].iloc[-1])
            reached = grp.n[grp[method] >= fraction * full] if full > 0 else grp.n[:0]
            out.append({**dict(zip(keys, cell)), "method": method,
                        "n_full": int(grp.n.iloc[-1]), "full": full,
                        "n_needed": int(reached.iloc[0]) if len(reached) else math.nan})
    return pd.DataFrame(out)


def markdown(summ: pd.DataFrame, fraction: float, alpha: float, subsamples: int) -> str:
    """The summary as Markdown: one row per cell, per method "n_needed (full value)"."""
    lines = [f"Trials per side each method needs for {fraction:.0%} of its value at the full "
             f"count (median over {subsamples} random subsamples; half of the trials choose "
             f"the threshold, half evaluate it; level {1 - alpha:.0%}, Bonferroni over k).", "",
             "- " + "; ".join(f"`{m}`: {what}" for m, what in METHODS.items()) + ".",
             "- Each entry: trials needed (the median at the full count); '-' where the full "
             "count's median is 0.", "",
             "| cell | trials (full) | " + " | ".join(f"`{m}`" for m in METHODS) + " |",
             "|---" * (2 + len(METHODS)) + "|"]
    keys = ["dataset", "arch", "clip", "init", "attack", "eps_label"]
    for cell, grp in summ.groupby(keys, sort=False):
        d = dict(zip(keys, cell))
        name = (f"{d['dataset']} {d['arch']} {d['attack']}, C = {float(d['clip']):g}, "
                f"{d['init']} init, eps_th label {d['eps_label']}")
        by = grp.set_index("method")
        cells = [("-" if math.isnan(by.n_needed[m]) else f"{int(by.n_needed[m])}")
                 + f" ({by.full[m]:.2f})" for m in METHODS]
        lines.append(f"| {name} | {int(grp.n_full.iloc[0])} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


__all__ = ["METHODS", "cells", "n_grid", "subsample", "study", "summary",
           "markdown"]
