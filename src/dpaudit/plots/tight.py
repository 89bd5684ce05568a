"""Figure: how tight each audit of DP-SGD is, eps_lb / eps_th against the eps label."""

from __future__ import annotations

import os

import numpy as np

from ..io import read_table
from .jagielski import ARCH_NAMES
from .style import figure, legend_below, save

#: Audit method (without ``-gdp``) -> (legend name, colour, marker). Each row's ratio is to
#: its own ``eps_th`` (its relation and mechanism: docs/tight.md).
METHODS = {
    "whitebox-llr": ("white box, all iterates, likelihood ratio (Nasr et al. 2023)",
                     "#d62728", "o"),
    "whitebox-dot-sum": ("white box, last iterate, <theta_0 - theta_T, g> (Nasr et al. 2023)",
                         "#1f77b4", "o"),
    "blackbox-worst-case-init": ("black box, full batch, worst-case init (Annamalai and De "
                                 "Cristofaro 2024)", "#2ca02c", "s"),
    "blackbox-glorot-init": ("black box, full batch, Glorot init (Annamalai and De "
                             "Cristofaro 2024)", "#9467bd", "s"),
    "blackbox-clipbkd": ("black box, ClipBKD, replace-one (Jagielski et al. 2020)",
                         "#ff7f0e", "^"),
    "onerun-whitebox-llr": ("one run, white box, all iterates (Steinke et al. 2023)",
                            "#8c564b", "v"),
    "onerun-whitebox-dot-sum": ("one run, white box, last iterate (Steinke et al. 2023)",
                                "#17becf", "v"),
}
#: Set-up of the last-iterate heuristic's rows -> its legend name and colour.
HEURISTIC = {
    "poisson": ("last-iterate heuristic, the white box's Poisson training (theory, not a "
                "measurement)", "#555555"),
    "full-batch": ("last-iterate heuristic, full batch (= its eps_th)", "#aaaaaa"),
}
#: Horizontal spread of a label's markers, in octaves, so that equal ratios stay visible.
DODGE = 0.03


def _runs(g) -> str:
    runs = sorted(int(r) for r in g.runs.unique())
    return "1 run" if runs == [1] else f"{'/'.join(map(str, runs))} runs per side"


def plot_tight(table: str | os.PathLike, out: str | os.PathLike) -> None:
    """One panel per model, each audit's rows at their eps label (log axis; markers dodged
    sideways) against ``eps_lb / eps_th``, each row's ratio to the ``eps_th`` of its own
    relation and mechanism:

    - per audit method (colour and marker): solid, filled markers: the certified bound (its
      level and runs in the legend); dashed, hollow: the GDP estimate (assumes the
      Gaussian trade-off curve: no bound);
    - black line at 1: ``eps_th``;
    - diamonds on a dotted line: the last-iterate heuristic (Steinke et al. 2025) of each
      set-up it is computed for, a theory line for the final model with linear losses.

    Cells without noise (``eps_th`` inf) have no ratio and are left out.
    """
    df, _ = read_table(table)
    df = df[np.isfinite(df.eps_th)]
    archs = [a for a in ARCH_NAMES if (df.arch == a).any()]
    if not archs:
        raise ValueError(f"{table}: no cell with noise to draw")
    labels = sorted(df.eps_label.unique())
    drawn = [m for m in METHODS if df.method.isin([m, m + "-gdp"]).any()]
    # at least two panels wide: the legend, one entry per method and kind, needs the room
    fig, axes = figure(1, len(archs), squeeze=False, figsize=(5.0 * max(2, len(archs)), 3.6))
    for ax, arch in zip(axes[0], archs):
        sub = df[df.arch == arch]
        ax.axhline(1.0, color="black", lw=1.2,
                   label="eps_th: the PLD eps of each row's own relation and training")
        for setting, (name, color) in HEURISTIC.items():
            li = sub[(sub.method == "last-iterate-heuristic") & (sub.setting == setting)]
            li = li.sort_values("eps_label")
            if not li.empty:
                ax.plot(li.eps_label, li.eps_lb_ratio, "D:", color=color, ms=5, lw=1,
                        label=name)
        for i, method in enumerate(drawn):
            name, color, marker = METHODS[method]
            shift = 2 ** (DODGE * (i - (len(drawn) - 1) / 2))
            for suffix, style, mfc in (("", "-", color), ("-gdp", "--", "none")):
                g = sub[sub.method == method + suffix].sort_values("eps_label")
                if g.empty:
                    continue
                what = (f"certified at {100 * (1 - g.alpha.iloc[0]):g}%" if not suffix
                        else "GDP estimate (not a bound)")
                ax.plot(g.eps_label * shift, g.eps_lb_ratio, marker + style, color=color,
                        mfc=mfc, lw=1.2, label=f"{name}, {_runs(g)}: {what}")
        ax.set_xscale("log", base=2)
        ax.set_xlim(min(labels) / 2 ** 0.4, max(labels) * 2 ** 0.4)
        ax.set_xticks(labels, [f"{v:g}" for v in labels])
        ax.minorticks_off()
        ax.set_title(f"FMNIST {ARCH_NAMES[arch]}", fontsize=9)
        ax.set(xlabel=f"eps label (delta = {sub.delta.iloc[0]:g})",
               ylabel="eps_lb / eps_th (each row's own eps_th)")
        ax.set_ylim(bottom=0, top=max(ax.get_ylim()[1], 1.1))
    handles = {}
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    legend_below(fig, axes, list(handles.values()), list(handles))
    save(fig, out)
