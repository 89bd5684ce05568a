"""Figures of the HW3 Gaussian sum audits (seed 004, Q2.1-Q2.3), from hw3-audit tables."""

from __future__ import annotations

import os

from ..io import read_table
from .style import COLORS, figure, save

_XLABEL = {"eps": r"target $\varepsilon$ of the calibration", "m": "number of canaries $m$",
           "d": "dimension $d$"}
_QUESTION = {"eps": "Q2.1", "m": "Q2.2", "d": "Q2.3"}


def plot_grid(table: str | os.PathLike, grid: str, out: str | os.PathLike) -> None:
    """eps_LB (Bonferroni over m1, 95%; mean over repeats, min-max band) against the swept
    value, per calibration; dashed: the homework's best-over-m1 eps-hat (not a 95% bound);
    dotted: the true eps of each calibrated sigma at the table's delta."""
    if grid not in _XLABEL:
        raise ValueError(f"grid={grid!r}: must be one of {sorted(_XLABEL)}")
    df, _ = read_table(table)
    fig, ax = figure()
    for cal, sub in df.groupby("calibration", sort=False):
        g = sub.groupby(grid).agg(lb=("eps_lb", "mean"), lo=("eps_lb", "min"),
                                  hi=("eps_lb", "max"), hw=("eps_hat_max", "mean"),
                                  true=("true_eps", "first")).reset_index()
        c = COLORS[cal]
        ax.plot(g[grid], g.lb, "o-", color=c, label=rf"$\varepsilon_{{LB}}$, {cal} $\sigma$")
        ax.fill_between(g[grid], g.lo, g.hi, color=c, alpha=0.2, lw=0)
        ax.plot(g[grid], g.hw, "s--", color=c, mfc="none", alpha=0.7,
                label=rf"best over $m_1$ (homework, not 95%), {cal}")
        ax.plot(g[grid], g.true, ":", color=c, lw=1.3,
                label=rf"true $\varepsilon$ of {cal} $\sigma$")
    if grid == "m":
        ax.set_xscale("log", base=2)
    elif grid == "d":
        ax.set_xscale("log")
    fixed = {k: sorted(df[k].unique()) for k in ("eps", "m", "d") if k != grid}
    desc = ", ".join(f"{k}={v[0]:g}" if len(v) == 1 else f"{k} varies" for k, v in fixed.items())
    ax.set_title(f"HW3 {_QUESTION[grid]}: one-run audit of the Gaussian sum\n({desc}, "
                 rf"$\delta$={df.delta.iloc[0]:g}, {df.repeat.nunique()} repeats, "
                 "band = min-max)")
    ax.set_xlabel(_XLABEL[grid])
    ax.set_ylabel(r"$\varepsilon$ (lower bound at 95% / true)")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", fontsize=6.5)
    save(fig, out)
