"""Figure of the trials-needed study: median bound of each method against trials per side."""

from __future__ import annotations

import math
import os

import numpy as np

from ..experiments.trials_needed import METHODS
from ..io import read_table
from ..experiments.jagielski import eps_label
from .jagielski import ARCH_NAMES, ATTACK_NAMES, DATASET_NAMES
from .style import figure, save

#: Line style per method: the certified bound solid, the others dashed or dotted.
STYLES = {"eps_lb": ("#1f77b4", "-", "o"), "eps_lb_katz": ("#ff7f0e", "--", "v"),
          "eps_lb_bayes": ("#2ca02c", "--", "s"), "eps_lb_gdp": ("#7f7f7f", ":", "x")}
#: Methods the panels are not scaled to (they may leave the panel at the top).
UNSCALED = ["eps_lb_gdp"]
#: The columns that tell the cells apart, in the table and in its summary.
CELL = ("dataset", "arch", "clip", "init", "attack", "eps_label")


def plot_trials_needed(table: str | os.PathLike, summary: str | os.PathLike,
                       out: str | os.PathLike) -> None:
    """One panel per cell: the median over subsamples of each method's value against the
    trials per side (log axis), the 25-75% range shaded, the common target (the summary's
    fraction of the certified bound's full-count median) as a horizontal line, and a
    vertical line where each method's median reaches it."""
    df, meta = read_table(table, columns=(*CELL, "n", "subsample", *METHODS),
                          what="trials-needed --out")
    summ, _ = read_table(summary, columns=(*CELL, "method", "target", "n_needed", "at_first"),
                         what="trials-needed --summary")
    fraction = meta["spec"]["fraction"]
    alpha = meta["audit"]["alpha"]
    keys = list(CELL)
    cells = list(df.groupby(keys, sort=False))
    fig, axes = figure(1, len(cells), squeeze=False)
    for ax, (cell, grp) in zip(axes[0], cells):
        d = dict(zip(keys, cell))
        stats = grp.groupby("n")[list(METHODS)]
        med, lo, hi = stats.median(), stats.quantile(0.25), stats.quantile(0.75)
        needed = summ[np.all([summ[k] == d[k] for k in keys], axis=0)].set_index("method")
        target = float(needed.target.iloc[0])
        # The GDP estimate can run far above the bounds (not a bound itself): the panel is
        # scaled to the others and the target, and its label says where it leaves.
        top = 1.15 * max(float(hi.drop(columns=UNSCALED).max().max()),
                         0 if math.isnan(target) else target, 0.1)
        for method, what in METHODS.items():
            color, ls, marker = STYLES[method]
            n_need = needed.n_needed.get(method, math.nan)
            if math.isnan(target):
                tag = ""
            elif math.isnan(n_need):
                tag = "; target not reached"
            else:
                tag = f"; target at n {'<=' if needed.at_first[method] else '='} {n_need:.0f}"
            if med[method].max() > top:
                tag += f"; leaves the panel ({med[method].iloc[-1]:.1f} at {med.index[-1]})"
            ax.plot(med.index, med[method], color=color, ls=ls, marker=marker,
                    label=f"{what}{tag}")
            ax.fill_between(med.index, lo[method], hi[method], color=color, alpha=0.12, lw=0)
            if not math.isnan(n_need):
                ax.axvline(n_need, color=color, ls=ls, lw=0.8, alpha=0.5)
        # A band of zero width does not show: the title says so, not the empty legend.
        flat = [m for m in METHODS if np.allclose(lo[m], hi[m], rtol=0, atol=1e-9)]
        if math.isnan(target):
            ax.text(0.5, 0.5, "certified bound 0 at the full count: no target",
                    transform=ax.transAxes, ha="center", fontsize=8)
        else:
            ax.axhline(target, color="black", lw=0.8, ls="-.",
                       label=f"target: {fraction:.0%} of the certified bound at "
                             f"n = {med.index[-1]} ({target:.2f})")
        ax.set_xscale("log")
        ax.set_xticks(med.index, [str(n) for n in med.index])
        ax.minorticks_off()
        ax.set_title(f"{DATASET_NAMES.get(d['dataset'], d['dataset'])} "
                     f"{ARCH_NAMES.get(d['arch'], d['arch'])} "
                     f"{ATTACK_NAMES.get(d['attack'], d['attack'])}\nC = {float(d['clip']):g}, "
                     f"{d['init']} init, eps_th label {eps_label(d['eps_label'])}"
                     + ("\nno shaded range: every subsample gives the same values"
                        if len(flat) == len(METHODS) else
                        "".join(f"\n{METHODS[m]}: every subsample the same" for m in flat)),
                     fontsize=9)
        ax.set(xlabel="trials per side (half choose the threshold, half evaluate it)",
               ylabel=f"eps: median over {grp.subsample.nunique()} subsamples")
        ax.set_ylim(bottom=0, top=top)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), fontsize=7)
    # two short lines, above the tallest panel title: no wider than one panel
    fig.suptitle(f"Trials needed: level {1 - alpha:.0%} (Bonferroni over k); shaded: 25-75% "
                 f"of the subsamples\nvertical lines: where each median reaches the common "
                 f"target", fontsize=9,
                 y=1.0 + 0.04 * max(ax.get_title().count("\n") + 1 for ax in axes[0]))
    save(fig, out)
