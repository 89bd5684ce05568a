"""Figure: one-run audits of DP-SGD against eps_th, beside the many-model ClipBKD audit."""

from __future__ import annotations

import math
import os

import numpy as np

from ..io import read_table
from ..experiments.jagielski import eps_label
from .jagielski import ARCH_NAMES
from .style import broken_plot, figure, legend_below, note_hidden, save

#: (canary, threat model) -> (legend name, colour).
LINES = {("input", "black-box"): ("black-box input canaries", "#2ca02c"),
         ("dirac", "last-iterate"): ("white-box Dirac canaries, last iterate", "#1f77b4"),
         ("dirac", "all-iterates"): ("white-box Dirac canaries, all iterates", "#d62728")}
#: The columns of the onerun-audit table that :func:`plot_onerun` reads.
COLUMNS = ("arch", "eps_label", "canary", "threat_model", "m", "repeat", "delta", "eps_pld",
           "eps_lb", "eps_lb_fdp")
#: The columns of the many-model (jagielski-audit) table that it reads.
MANY_MODEL_COLUMNS = ("dataset", "arch", "attack", "eps_label", "trials", "eps_lb",
                      "eps_lb_best_k")


def _order(labels) -> list[str]:
    return sorted(set(labels), key=lambda e: math.inf if e == "inf" else float(e))


def plot_onerun(table: str | os.PathLike, out: str | os.PathLike,
                many_model: str | os.PathLike | None = None) -> None:
    """One panel per model, the eps_th labels on the x axis (ticks give eps_th by PLD):

    - per canary type and threat model (colour): solid with min-max band over repeats,
      ``eps_lb_fdp``, the certified (eps, delta) bound of the f-DP analysis (Mahloujifar et
      al. 2025); dashed, hollow: ``eps_lb``, Steinke et al.'s Appendix D bound on the same
      guesses; each run's bound holds at 95% (one training run each), the line is their
      mean (input-canary repeats share one canary draw);
    - black squares: the 1000-model audit's certified ClipBKD bound ``eps_lb`` (99%,
      Bonferroni over k; its neighbours replace a row) of the same cells,
      hollow grey: its best over k (the paper's statistic, not a 99% bound);
    - grey diamonds on a dotted line (filled: Dirac, hollow: input canaries, which add
      rows), each labelled with its value (Dirac to the right, input to the left): eps at
      the table's delta by PLD of each canary type's training; without noise there is none.

    Lines join the finite labels only; the points at eps_th = inf stand apart. A series
    hidden under another of equal values says so in the legend (:func:`note_hidden`).
    """
    df, _ = read_table(table, columns=COLUMNS, what="onerun-audit")
    df["eps_label"] = df.eps_label.map(eps_label)
    mm = None
    if many_model is not None:
        mm, _ = read_table(many_model, columns=MANY_MODEL_COLUMNS, what="jagielski-audit")
        mm = mm[(mm.dataset == "fmnist") & (mm.attack == "clipbkd")].copy()
        mm["eps_label"] = mm.eps_label.map(eps_label)
    archs = [a for a in ARCH_NAMES if (df.arch == a).any()]
    fig, axes = figure(1, len(archs), squeeze=False)
    for ax, arch in zip(axes[0], archs):
        sub = df[df.arch == arch]
        labels = _order(sub.eps_label)
        x = {e: i for i, e in enumerate(labels)}
        th = sub.groupby(["canary", "eps_label"]).eps_pld.first()
        finite = th[np.isfinite(th)]
        top = float(finite.max()) if len(finite) else 1.0
        _pld_diamonds(ax, th, x)
        _one_run_lines(ax, sub, x)
        if mm is not None:
            _many_model_points(ax, mm[(mm.arch == arch) & mm.eps_label.isin(labels)], x)
        ax.set_xticks(range(len(labels)), labels)
        ax.set_ylim(bottom=0, top=max(ax.get_ylim()[1], 1.05 * top))
        first = sub.iloc[0]
        ms = ", ".join(f"{int(g.m.iloc[0])} {c}" for c, g in sub.groupby("canary"))
        ax.set_title(f"FMNIST {ARCH_NAMES[arch]}\nm = {ms} canaries, "
                     f"{sub.repeat.nunique()} runs per cell", fontsize=9)
        ax.set(xlabel=f"eps_th label (delta = {first.delta:g})",
               ylabel="empirical eps lower bound")
    note_hidden(axes[0])
    handles = {}
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    legend_below(fig, axes, list(handles.values()), list(handles),
                 title="each one-run bound comes from one training run"
                       + ("; each many-model bound from (1 + len(ks)) x trials models"
                          if mm is not None else ""))
    save(fig, out)


def _pld_diamonds(ax, th, x: dict) -> None:
    """eps by PLD of each canary type (``th``: by canary and label) as labelled diamonds on a
    dotted line: a value to read, not a tick."""
    for canary, mfc, side in (("dirac", "#555555", 1), ("input", "none", -1)):
        if canary not in th.index.get_level_values(0):
            continue
        t = th[canary]
        order = np.argsort([x[e] for e in t.index])
        xs = np.array([x[e] for e in t.index])[order]
        ys = t.where(np.isfinite(t)).to_numpy()[order]
        ax.plot(xs, ys, "D:", color="#555555", mfc=mfc, ms=5, lw=1, zorder=1,
                label=f"eps by PLD, {canary} canaries (none without noise)")
        for xi, yi in zip(xs, ys):
            if np.isfinite(yi):
                ax.annotate(f"{yi:.3g}", (xi, yi), xytext=(6 * side, 0),
                            textcoords="offset points", va="center", fontsize=7,
                            ha="left" if side > 0 else "right", color="#555555")


def _one_run_lines(ax, sub, x: dict) -> None:
    """Per canary type and threat model: the f-DP bound (solid, min-max band) and Steinke
    et al.'s bound (dashed, hollow) over the labels at ``x``."""
    for (canary, threat), (name, color) in LINES.items():
        g = sub[(sub.canary == canary) & (sub.threat_model == threat)]
        if g.empty:
            continue
        a = g.groupby("eps_label").agg(fdp=("eps_lb_fdp", "mean"),
                                       lo=("eps_lb_fdp", "min"), hi=("eps_lb_fdp", "max"),
                                       snj=("eps_lb", "mean"))
        xs = [x[e] for e in a.index]
        order = np.argsort(xs)
        xs = np.array(xs)[order]
        at_inf = np.array([e == "inf" for e in a.index])[order]
        for part in (~at_inf, at_inf):  # no band from a finite label to inf
            ax.fill_between(xs[part], a.lo.to_numpy()[order][part],
                            a.hi.to_numpy()[order][part], color=color, alpha=0.15, lw=0)
        # markers on the x axis drawn whole (clip_on): a bound of 0 is common
        broken_plot(ax, xs, a.fdp.to_numpy()[order], at_inf, marker="o", ls="-",
                    color=color, clip_on=False, zorder=4,  # over the dashed ones
                    label=f"{name}: f-DP bound (mean of per-run 95% bounds, min-max band)")
        broken_plot(ax, xs, a.snj.to_numpy()[order], at_inf, marker="o", ls="--",
                    mfc="none", lw=1, color=color, alpha=0.8, clip_on=False, zorder=3,
                    label=f"{name}: Steinke et al. bound (mean of per-run 95%)")


def _many_model_points(ax, m, x: dict) -> None:
    """The many-model audit's certified ClipBKD bound (black squares) and its best over k
    (hollow grey) at the labels of ``m``, the panel's rows."""
    if m.empty:
        return
    xs = [x[e] for e in m.eps_label]
    ax.plot(xs, m.eps_lb, "s", color="black", ms=6,
            label=f"many-model ClipBKD ({int(m.trials.max())} models per side "
                  "and k): 99% bound")
    ax.plot(xs, m.eps_lb_best_k, "s", mfc="none", color="#7f7f7f", ms=7,
            label="many-model ClipBKD: best over k (not a 99% bound)")
