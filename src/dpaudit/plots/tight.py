"""Figure: how tight each audit of DP-SGD is, eps_lb / eps_th against eps_th."""

from __future__ import annotations

import os

import numpy as np

from ..io import read_table
from .jagielski import ARCH_NAMES
from .style import figure, legend_below, save

#: Audit method (without ``-gdp``) -> (legend name, colour).
METHODS = {
    "whitebox-llr": ("white box, all iterates: likelihood-ratio score", "#d62728"),
    "whitebox-dot-sum": ("white box, last iterate: <theta_0 - theta_T, g>", "#1f77b4"),
    "blackbox-worst-case-init": ("black box, worst-case (pre-trained) init", "#2ca02c"),
    "blackbox-glorot-init": ("black box, Glorot init", "#9467bd"),
}
#: Set-up -> panel title.
SETTINGS = {"poisson": "white box: Poisson-sampled DP-SGD",
            "full-batch": "black box: full-batch DP-SGD"}


def plot_tight(table: str | os.PathLike, out: str | os.PathLike) -> None:
    """One panel per set-up and model, side by side, each cell at its ``eps_th`` (PLD,
    add/remove) on the x axis, ``eps_lb / eps_th`` on the y axis:

    - per audit method (colour): solid, filled markers: the certified Clopper-Pearson bound;
      dashed, hollow: the GDP estimate (assumes the Gaussian trade-off curve: no bound);
    - black line at 1: ``eps_th`` itself (PLD); dash-dot grey: the ``rdp_classic`` eps of
      the same training (the accountant of the white box's noise table);
    - grey diamonds on a dotted line: the last-iterate heuristic (Steinke et al. 2025), a
      theory line for the final model with linear losses, not a measurement.

    Cells without noise (``eps_th`` inf) have no ratio and are left out.
    """
    df, _ = read_table(table)
    df = df[np.isfinite(df.eps_th)]
    settings = [s for s in SETTINGS if (df.setting == s).any()]
    archs = [a for a in ARCH_NAMES if (df.arch == a).any()]
    if not settings or not archs:
        raise ValueError(f"{table}: no cell with noise to draw")
    panels = [(s, a) for s in settings for a in archs]
    fig, axes = figure(1, len(panels), squeeze=False)
    for ax, (setting, arch) in zip(axes[0], panels):
        sub = df[(df.setting == setting) & (df.arch == arch)].sort_values("eps_th")
        if sub.empty:
            ax.set_axis_off()
            continue
        cells = sub.drop_duplicates("eps_label")
        ax.axhline(1.0, color="black", lw=1.2, label="eps_th (PLD accountant, add/remove)")
        ax.plot(cells.eps_th, cells.eps_rdp / cells.eps_th, "-.", color="#7f7f7f", lw=1,
                label="eps of the same training by rdp_classic (a looser accountant)")
        li = sub[sub.method == "last-iterate-heuristic"]
        ax.plot(li.eps_th, li.eps_lb_ratio, "D:", color="#555555", ms=5, lw=1,
                label="last-iterate heuristic (theory for linear losses, not a "
                      "measurement)")
        for method, (name, color) in METHODS.items():
            for suffix, style, mfc, what in (
                    ("", "o-", color, "certified bound"),
                    ("-gdp", "o--", "none", "GDP estimate (not a bound)")):
                g = sub[sub.method == method + suffix]
                if g.empty:
                    continue
                ax.plot(g.eps_th, g.eps_lb_ratio, style, color=color, mfc=mfc, lw=1.2,
                        label=f"{name}: {what}")
        runs = sorted(int(r) for r in sub.runs.unique() if r > 0)
        ax.set_title(f"{SETTINGS[setting]}\nFMNIST {ARCH_NAMES[arch]}, "
                     f"{'/'.join(map(str, runs))} runs per side", fontsize=9)
        ax.set(xlabel=f"eps_th (PLD, delta = {sub.delta.iloc[0]:g})",
               ylabel="eps_lb / eps_th")
        ax.set_ylim(bottom=0, top=max(ax.get_ylim()[1], 1.1))
    handles = {}
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    legend_below(fig, axes, list(handles.values()), list(handles),
                 title=f"certified bounds at {100 * (1 - df.alpha.dropna().iloc[0]):g}% "
                       "(Clopper-Pearson, threshold chosen on the other half of the runs)")
    save(fig, out)
