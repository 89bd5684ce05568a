"""Figures of the HW3 Gaussian sum audits (Q2.1-Q2.3 of the HW3 homework of DA 5001/6400,
IIT Madras, 2024), from hw3-audit tables."""

from __future__ import annotations

import os

from ..io import read_table
from .style import COLORS, figure, legend_below, save

_XLABEL = {"eps": r"target $\varepsilon$ of the calibration", "m": "number of canaries $m$",
           "d": "dimension $d$"}
_QUESTION = {"eps": "Q2.1", "m": "Q2.2", "d": "Q2.3"}
_TITLE = {"classical": r"classical $\sigma=\sqrt{2\ln(1.25/\delta)}/\varepsilon$",
          "analytic": r"analytic $\sigma$ (Balle-Wang, exact)"}
#: Legend labels, one per line: what each line is and whether it is a 95% bound.  Every
#: line is a mean over repeats: of per-run 95% bounds, which is no 95% bound itself.
LABELS = {
    "true": r"true $\varepsilon(\delta)$ of the calibrated $\sigma$",
    "eps_lb": r"$(\varepsilon,\delta)$ lower bound, mean of per-run 95% bounds (Steinke et "
              r"al. App. D, Bonferroni over the $m_1$ grid)",
    "eps_lb_fdp": r"$(\varepsilon,\delta)$ lower bound, mean of per-run 95% bounds (f-DP "
                  r"analysis of Mahloujifar et al.)",
    "eps_hat_max": r"homework's $\hat\varepsilon$: max over every $m_1$, mean over runs (an "
                   r"estimate, not a 95% bound)",
    "eps_lb_pure": r"pure-$\varepsilon$ lower bound, mean of per-run 95% bounds (not "
                   r"comparable with $\varepsilon(\delta)$)",
    "eps_lb_pure_hoeffding": r"pure-$\varepsilon$ Hoeffding closed form, mean of per-run 95% "
                             r"bounds (Bonferroni over the $m_1$ grid)",
}
#: Largest difference of the means at which a line is said to coincide with ``eps_lb``.
SAME = 0.01
#: The columns of the hw3-audit table that :func:`plot_grid` reads.
COLUMNS = ("calibration", "eps", "m", "d", "repeat", "delta", "beta", "true_eps", "eps_lb",
           "eps_lb_fdp", "eps_lb_pure", "eps_lb_pure_hoeffding", "eps_hat_max")


def plot_grid(table: str | os.PathLike, grid: str, out: str | os.PathLike) -> None:
    """One panel per calibration, against the swept value (``eps``, ``m`` or ``d``); every
    line is the mean over repeats (columns: :data:`dpaudit.bounds.SWEEP_COLUMNS`):

    - solid, thick, blue in every panel, min-max band over repeats: ``eps_lb``, the (eps, delta) lower bound of
      Steinke, Nasr & Jagielski (2023) App. D (each run's valid at 95%; their mean is no
      95% bound); the primary line, comparable with the true eps(delta);
    - dash-dot, diamonds: ``eps_lb_fdp``, the (eps, delta) bound of the f-DP analysis of
      Mahloujifar, Melis & Chaudhuri (2025), same guesses and level (valid 95%);
    - dotted black: the true eps at the table's delta of the calibrated sigma;
    - dashed, open squares: ``eps_hat_max``, the homework's largest eps-hat over every m1,
      each at 95% (an estimate: the maximum is no 95% bound);
    - thin grey, crosses, drawn on top: ``eps_lb_pure``, the pure-eps bound with
      Bonferroni over the m1 grid (:func:`dpaudit.bounds.guess_grid`; valid 95% for pure
      eps-DP, which the Gaussian mechanism is not: not comparable with eps(delta));
    - thin dash-dot: ``eps_lb_pure_hoeffding``, the closed-form Hoeffding pure-eps bound
      (valid 95%, looser than ``eps_lb_pure``).

    A line whose means stay within :data:`SAME` of ``eps_lb``'s says so in its label.
    """
    if grid not in _XLABEL:
        raise ValueError(f"grid={grid!r}: must be one of {sorted(_XLABEL)}")
    df, _ = read_table(table, columns=COLUMNS, what="hw3-audit")
    cals = list(dict.fromkeys(df.calibration))
    means = {cal: df[df.calibration == cal].groupby(grid).agg(
        lb=("eps_lb", "mean"), lo=("eps_lb", "min"), hi=("eps_lb", "max"),
        fdp=("eps_lb_fdp", "mean"), pure=("eps_lb_pure", "mean"),
        hoeff=("eps_lb_pure_hoeffding", "mean"), hw=("eps_hat_max", "mean"),
        true=("true_eps", "first")).reset_index() for cal in cals}
    # A line within SAME of the primary one everywhere hides under it: its label says so.
    same = {col: f" [here within {SAME:g} of the thick line everywhere]"
            if all((g[col] - g.lb).abs().max() < SAME for g in means.values()) else ""
            for col in ("fdp", "pure")}
    fig, axes = figure(1, len(cals), sharey=True, squeeze=False)
    for ax, cal in zip(axes[0], cals):
        g = means[cal]
        c = COLORS["empirical"]  # one colour in every panel, as in the shared legend
        x = g[grid]
        ax.plot(x, g.true, ":", color=COLORS["theory"], lw=1.8, label=LABELS["true"], zorder=5)
        ax.fill_between(x, g.lo, g.hi, color=c, alpha=0.2, lw=0, zorder=1)
        ax.plot(x, g.lb, "o-", color=c, lw=2.4, ms=5, label=LABELS["eps_lb"], zorder=3)
        ax.plot(x, g.fdp, "D-.", color="#ff7f0e", lw=1.4, ms=3.5,
                label=LABELS["eps_lb_fdp"] + same["fdp"], zorder=4)
        ax.plot(x, g.hw, "s--", color="#9467bd", mfc="white", mew=1.3, lw=1.6,
                label=LABELS["eps_hat_max"], zorder=4)
        # on top, small crosses: visible where it coincides with the lines below it
        ax.plot(x, g.pure, "x-", color="#7f7f7f", lw=0.9, ms=5, mew=1.2,
                label=LABELS["eps_lb_pure"] + same["pure"], zorder=6)
        ax.plot(x, g.hoeff, "-.", color="#2ca02c", lw=1.0, label=LABELS["eps_lb_pure_hoeffding"],
                zorder=4)
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
                 rf"$\delta$={df.delta.iloc[0]:g}, $\beta$={df.beta.iloc[0]:g})"
                 f"\nmean of {df.repeat.nunique()} repeats, band = min-max of the "
                 r"$(\varepsilon,\delta)$ bound", fontsize=10, y=1.08)
    axes[0, 0].set_ylabel(r"$\varepsilon$: mean of per-run 95% bounds; true "
                          r"$\varepsilon(\delta)$")
    legend_below(fig, axes, *axes[0, 0].get_legend_handles_labels())
    save(fig, out)
