"""Figures of the HW3 Gaussian sum audits (seed 004, Q2.1-Q2.3), from hw3-audit tables."""

from __future__ import annotations

import os

from ..io import read_table
from .style import COLORS, figure, save

_XLABEL = {"eps": r"target $\varepsilon$ of the calibration", "m": "number of canaries $m$",
           "d": "dimension $d$"}
_QUESTION = {"eps": "Q2.1", "m": "Q2.2", "d": "Q2.3"}
_TITLE = {"classical": r"classical $\sigma=\sqrt{2\ln(1.25/\delta)}/\varepsilon$",
          "analytic": r"analytic $\sigma$ (Balle-Wang, exact)"}


def plot_grid(table: str | os.PathLike, grid: str, out: str | os.PathLike) -> None:
    """One panel per calibration, against the swept value (``eps``, ``m`` or ``d``):

    - solid, band: ``eps_lb``, the pure-eps bound with Bonferroni over the m1 sweep (valid
      95% lower bound); mean over repeats, band = min-max;
    - dash-dot: ``eps_lb_delta``, the (eps, delta) bound ([SNJ23] App. D), mean;
    - dashed: ``eps_hat_max``, the homework's best over m1 (not a 95% bound), mean;
    - dotted: the true eps of the calibrated sigma at the table's delta.
    """
    if grid not in _XLABEL:
        raise ValueError(f"grid={grid!r}: must be one of {sorted(_XLABEL)}")
    df, _ = read_table(table)
    cals = list(dict.fromkeys(df.calibration))
    fig, axes = figure(1, len(cals), sharey=True, squeeze=False)
    for ax, cal in zip(axes[0], cals):
        g = df[df.calibration == cal].groupby(grid).agg(
            lb=("eps_lb", "mean"), lo=("eps_lb", "min"), hi=("eps_lb", "max"),
            lbd=("eps_lb_delta", "mean"), hw=("eps_hat_max", "mean"),
            true=("true_eps", "first")).reset_index()
        c = COLORS[cal]
        ax.plot(g[grid], g.true, ":", color=COLORS["theory"], label=r"true $\varepsilon$")
        ax.plot(g[grid], g.hw, "s--", color=c, mfc="none", alpha=0.6,
                label=r"best over $m_1$, each at 95% (homework; the max is no 95% bound)")
        ax.plot(g[grid], g.lb, "o-", color=c,
                label=r"$\varepsilon_{LB}$: Bonferroni over $m_1$, 95% (min-max band)")
        ax.fill_between(g[grid], g.lo, g.hi, color=c, alpha=0.2, lw=0)
        ax.plot(g[grid], g.lbd, "^-.", color=c, alpha=0.8, ms=3.5,
                label=r"$\varepsilon_{LB}$ as an $(\varepsilon,\delta)$ bound (App. D)")
        if grid == "m":
            ax.set_xscale("log", base=2)
        elif grid == "d":
            ax.set_xscale("log")
        ax.set_title(_TITLE.get(cal, cal))
        ax.set_xlabel(_XLABEL[grid])
        ax.set_ylim(bottom=0)
    fixed = {k: sorted(df[k].unique()) for k in ("eps", "m", "d") if k != grid}
    desc = ", ".join(f"{k}={v[0]:g}" if len(v) == 1 else f"{k} varies" for k, v in fixed.items())
    fig.suptitle(f"HW3 {_QUESTION[grid]}: one-run audit of the Gaussian sum ({desc}, "
                 rf"$\delta$={df.delta.iloc[0]:g}, {df.repeat.nunique()} repeats)", fontsize=10,
                 y=1.04)
    axes[0, 0].set_ylabel(r"$\varepsilon$: 95% lower bounds and truth")
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="upper center", ncol=2,
               bbox_to_anchor=(0.5, 0.0))
    save(fig, out)
