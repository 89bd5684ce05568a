"""Figure: one-run audit lower bounds for private ridge regression vs. theoretical eps."""

from __future__ import annotations

import os

import numpy as np

from ..io import read_table
from .style import COLORS, figure, legend_below, note_hidden, save

#: The columns of the ridge-audit table that :func:`plot_audit` reads.
COLUMNS = ("rho", "repeat", "delta", "m", "d", "n", "eps_lb", "eps_lb_fdp", "eps_hat_max",
           "eps_theory_bs", "eps_theory_exact")

def plot_audit(table: str | os.PathLike, out: str | os.PathLike) -> None:
    """``eps_lb`` (the (eps, delta) bound at 95%, Bonferroni over the tested k; mean over
    repeats of these per-run bounds, which is no 95% bound itself; min-max bars) against the theoretical eps at the audit's delta, once per zCDP->DP
    conversion; ``eps_lb_fdp`` (f-DP analysis) and the homework-style ``eps_hat_max``
    (an estimate) against the exact conversion; the ``y = x`` line."""
    df, _ = read_table(table, columns=COLUMNS, what="ridge-audit")
    g = df.groupby("rho").agg(lb=("eps_lb", "mean"), lo=("eps_lb", "min"),
                              hi=("eps_lb", "max"), nominal=("eps_hat_max", "mean"),
                              fdp=("eps_lb_fdp", "mean"),
                              bs=("eps_theory_bs", "first"),
                              exact=("eps_theory_exact", "first")).reset_index()
    fig, ax = figure()
    err = np.vstack([g.lb - g.lo, g.hi - g.lb])
    ax.errorbar(g.exact, g.lb, yerr=err, fmt="o-", color=COLORS["empirical"], capsize=2,
                label=r"$\hat\varepsilon$ (App. D) vs. exact GDP conversion (tight)")
    ax.errorbar(g.bs, g.lb, yerr=err, fmt="s--", color=COLORS["analytic"], capsize=2,
                mfc="none", label=r"$\hat\varepsilon$ (App. D) vs. Bun-Steinke $\rho+2\sqrt{\rho\ln(1/\delta)}$")
    # Nearly equal to the App. D bound: hollow, larger and on top, so both stay visible.
    ax.plot(g.exact, g.fdp, "D-.", color="#ff7f0e", ms=7, mfc="none", mew=1.3, lw=1.2,
            zorder=4, label=r"f-DP $(\varepsilon,\delta)$ bound, mean of per-run 95% bounds "
                            r"(Mahloujifar et al.) vs. exact")
    ax.plot(g.exact, g.nominal, "^:", color=COLORS["empirical"], alpha=0.6,
            label=r"pure $\varepsilon$, max over every $k$ at 95% each, mean over runs "
                  r"(an estimate) vs. exact")
    top = float(max(g.bs.max(), g.exact.max()))
    ax.plot([0, top], [0, top], color=COLORS["theory"], lw=1, label="$y = x$")
    # rho of each audit on a top axis at its exact eps, clear of the data (those crowded
    # near the origin left out)
    shown = [(x, rho) for rho, x in zip(g.rho, g.exact) if x >= 0.1 * top]
    rhos = ax.secondary_xaxis("top")
    rhos.set_xticks([x for x, _ in shown], [f"{rho:g}" for _, rho in shown], fontsize=7)
    rhos.set_xlabel(r"zCDP $\rho$ of the audited mechanism (at its exact $\varepsilon$)",
                    fontsize=8)
    first = df.iloc[0]
    ax.set_xlabel(r"theoretical $\varepsilon$ at $\delta$ = " + f"{first.delta:g}")
    ax.set_ylabel(r"$\hat\varepsilon$: mean of per-run 95% lower bounds")
    ax.set_title(f"Ridge output perturbation: one-run audit\n(m={int(first.m)}, "
                 f"d={int(first.d)}, n={int(first.n)}, {df.repeat.nunique()} repeats)")
    ax.set_ylim(bottom=0)
    note_hidden([ax])
    # below the axes: inside, it would cover the y = x line
    legend_below(fig, [ax], *ax.get_legend_handles_labels(), ncol=1)
    save(fig, out)
