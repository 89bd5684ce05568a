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


def plot_trials_needed(table: str | os.PathLike, summary: str | os.PathLike,
                       out: str | os.PathLike) -> None:
    """One panel per cell: the median over subsamples of each method's value against the
    trials per side (log axis), the 25-75% range shaded, and a tick on the x axis at the
    trials each method needs for the summary's fraction of its full-count value."""
    df, meta = read_table(table)
    summ, _ = read_table(summary)
    fraction = meta["spec"]["fraction"]
    alpha = meta["audit"]["alpha"]
    keys = ["dataset", "arch", "clip", "init", "attack", "eps_label"]
    cells = list(df.groupby(keys, sort=False))
    fig, axes = figure(1, len(cells), squeeze=False)
    for ax, (cell, grp) in zip(axes[0], cells):
        d = dict(zip(keys, cell))
        stats = grp.groupby("n")[list(METHODS)]
        med, lo, hi = stats.median(), stats.quantile(0.25), stats.quantile(0.75)
        needed = summ[np.all([summ[k] == d[k] for k in keys], axis=0)].set_index("method")
        for method, what in METHODS.items():
            color, ls, marker = STYLES[method]
            n_need = needed.n_needed.get(method, math.nan)
            tag = "" if math.isnan(n_need) else f"; {fraction:.0%} of full at n = {int(n_need)}"
            ax.plot(med.index, med[method], color=color, ls=ls, marker=marker,
                    label=f"{what}{tag}")
            ax.fill_between(med.index, lo[method], hi[method], color=color, alpha=0.12, lw=0)
            if not math.isnan(n_need):
                ax.axvline(n_need, color=color, ls=ls, lw=0.8, alpha=0.5)
        ax.set_xscale("log")
        ax.set_xticks(med.index, [str(n) for n in med.index])
        ax.minorticks_off()
        ax.set_title(f"{DATASET_NAMES.get(d['dataset'], d['dataset'])} "
                     f"{ARCH_NAMES.get(d['arch'], d['arch'])} "
                     f"{ATTACK_NAMES.get(d['attack'], d['attack'])}\nC = {float(d['clip']):g}, "
                     f"{d['init']} init, eps_th label {eps_label(d['eps_label'])}", fontsize=9)
        ax.set(xlabel="trials per side (half choose the threshold, half evaluate it)",
               ylabel=f"eps: median over {grp.subsample.nunique()} subsamples")
        ax.set_ylim(bottom=0, top=max(ax.get_ylim()[1], 0.1))
        ax.legend(loc="upper left", fontsize=6)
    fig.suptitle(f"Trials needed: level {1 - alpha:.0%} (Bonferroni over k); shaded: 25-75% "
                 "of the subsamples; vertical lines: 90% of the full-count median"
                 .replace("90%", f"{fraction:.0%}"), fontsize=9, y=1.04)
    save(fig, out)
