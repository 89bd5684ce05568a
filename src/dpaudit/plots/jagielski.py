"""Figures of Jagielski et al. 2020: Figure 2 (eps_LB of MI, backdoor and ClipBKD against
eps_th) and a heatmap of Table 2 (ClipBKD eps_LB over clip x init x eps_th)."""

from __future__ import annotations

import math
import os

import numpy as np
from matplotlib.lines import Line2D

from ..experiments.jagielski import eps_label, init_order, read_result_table
from .style import COLORS, broken_plot, figure, note_hidden, save

ATTACK_NAMES = {"mi": "MI", "backdoor": "Backdoor", "clipbkd": "ClipBKD"}
DATASET_NAMES = {"fmnist": "FMNIST", "cifar": "CIFAR-10"}
ARCH_NAMES = {"lr": "LR", "fnn": "2-layer FNN"}


def _x_positions(eps_th: np.ndarray) -> tuple[np.ndarray, float]:
    """x of each eps_th on a log axis, inf drawn one octave right of the largest finite."""
    finite = eps_th[np.isfinite(eps_th)]
    x_inf = 2 * finite.max() if finite.size else 1.0
    return np.where(np.isfinite(eps_th), eps_th, x_inf), x_inf


#: Attacks whose neighbouring data sets replace rows (two add/remove steps per row).
REPLACING = ("backdoor", "clipbkd")


#: The columns of the jagielski-audit table that :func:`plot_fig2` reads (others where the
#: table has them).
FIG2_COLUMNS = ("dataset", "arch", "attack", "eps_th", "eps_pld_replace", "eps_lb", "trials",
                "jpeg_reencoded")
#: The columns of the Table 2 table that :func:`plot_table2` reads (the split where it has it).
HEATMAP_COLUMNS = ("dataset", "arch", "init", "clip", "eps_label", "eps_lb",
                   "eps_lb_paper_rule", "paper_eps_lb", "trials")


#: How the re-split whiskers are drawn (Figure 2 and the Table 2 heatmap say the same).
SPLIT_LABEL = ("whiskers: 5th-95th percentile of the 99% bound over 200 re-splits\n"
               "of the same trials (a diagnostic of the split, not a bound)")


def plot_fig2(table: str | os.PathLike, out: str | os.PathLike) -> None:
    """One panel per (data set, model), against the theoretical eps of the cell (the
    moments accountant ``rdp_classic``, delta 1e-5, add/remove neighbours: the paper's
    x-axis):

    - solid: each attack's certified 99% bound ``eps_lb`` (every k at 1% / len(ks)), with
      whiskers from ``eps_lb_split_lo`` to ``eps_lb_split_hi`` where the table has them
      (its 5th-95th percentile over random re-splits of the trials: a diagnostic of the
      split, not a bound);
    - dashed, hollow (backdoor and ClipBKD): ``eps_lb_paper_rule``, the reference code's
      procedure, the largest over k of 99% bounds (not itself a 99% bound);
    - dashed, thin, triangles and squares: ``eps_lb_katz`` (approximate: asymptotic Katz
      intervals) and ``eps_lb_bayes`` (lower end of a 99% Bayesian credible interval), from
      the certified bound's counts, at its level;
    - MI, dotted crosses: ``mi_yeom``, the paper's population MI estimate (a point
      estimate, not a bound; negative values are drawn below 0);
    - black dotted: eps = eps_th (add/remove; MI removes a row), at the finite eps only;
      grey dash-dot: ``eps_pld_replace``, the cell's eps at the same delta for neighbours
      that differ by replacing one row, as backdoor and ClipBKD's are (PLD,
      dp_accounting's REPLACE_ONE; not 2 eps_th, which group privacy gives only at the
      larger delta (1 + e^eps) delta).

    Each line joins the finite eps_th only; the point at eps_th = inf stands apart. The y
    axis is linear within +-0.01 (symlog), so cells that certify nothing sit on 0. Data
    sets in rows, models in columns; the legend sits below the panels, inside the figure."""
    df = read_result_table(table, FIG2_COLUMNS)
    datasets = [d for d in DATASET_NAMES if (df.dataset == d).any()]
    archs = [a for a in ARCH_NAMES if (df.arch == a).any()]
    # data sets in rows, models in columns: a page a report can show at its width
    fig, grid = figure(len(datasets), len(archs), squeeze=False, layout="constrained")
    split = {"eps_lb_split_lo", "eps_lb_split_hi"} <= set(df.columns)
    y_columns = [c for c in ("eps_lb", "eps_lb_paper_rule", "eps_lb_katz", "eps_lb_bayes",
                             "mi_yeom", "eps_lb_split_lo") if c in df]
    lowest = float(np.nanmin(df[y_columns].to_numpy(float))) if y_columns else 0.0
    axes = []
    for row, dataset in zip(grid, datasets):
        for ax, arch in zip(row, archs):
            sub = df[(df.dataset == dataset) & (df.arch == arch)]
            if sub.empty:
                ax.set_visible(False)
                continue
            axes.append(ax)
            _fig2_panel(ax, sub, split, lowest)
    note_hidden(axes)
    handles = {}
    for ax in axes:  # every entry once, whichever panel drew it
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    if split:
        handles[SPLIT_LABEL] = Line2D([], [], color="#7f7f7f", marker="|", ms=8, ls="none")
    ncol = min(2, len(archs))
    fig.set_size_inches(4.6 * len(archs),
                        3.6 * len(datasets) + 0.2 * math.ceil(len(handles) / ncol))
    fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncol=ncol,
               title=f"{int(df.trials.max())} trials per side, half choose the threshold, "
                     "half evaluate it")
    save(fig, out)


def _fig2_panel(ax, sub, split: bool, lowest: float) -> None:
    """One (data set, model) panel of :func:`plot_fig2`."""
    x_all, x_inf = _x_positions(sub.eps_th.to_numpy(float))
    finite = np.unique(x_all[x_all < x_inf])
    drawn = [0.0]  # every y drawn, for the top of the panel
    if finite.size:  # at the finite eps_th only: every point at a labelled tick
        ax.plot(finite, finite, color=COLORS["theory"], lw=1, ls=":", marker="_", ms=10,
                label="eps = eps_th (add/remove: MI)")
        drawn += list(finite)
    rep = sub[sub.attack.isin(REPLACING)].drop_duplicates("eps_th").sort_values("eps_th")
    if np.isfinite(rep.eps_pld_replace).any():  # none without noise
        xr = _x_positions(rep.eps_th.to_numpy(float))[0]
        yr = np.where(np.isfinite(rep.eps_pld_replace), rep.eps_pld_replace, np.nan)
        ax.plot(xr, yr, color=COLORS["theory"], lw=1, ls="-.", marker="_", ms=10, alpha=0.6,
                label="eps (PLD) for replacing one row: backdoor, ClipBKD")
        drawn += list(yr)
    if lowest < 0:
        ax.axhline(0, color=COLORS["theory"], lw=0.5)
    for i, (attack, name) in enumerate(ATTACK_NAMES.items()):
        a = sub[sub.attack == attack].sort_values("eps_th")
        if a.empty:
            continue
        x = _x_positions(a.eps_th.to_numpy(float))[0] * 1.06 ** (i - 1)  # no overlap
        at_inf = ~np.isfinite(a.eps_th.to_numpy(float))
        broken_plot(ax, x, a.eps_lb, at_inf, marker="o", color=COLORS[attack], zorder=3,
                    label=f"{name}: 99% lower bound" + (" (Bonferroni over k)"
                                                         if attack in REPLACING else ""))
        drawn += list(a.eps_lb)
        if split:
            ax.errorbar(x, a.eps_lb, yerr=[np.maximum(a.eps_lb - a.eps_lb_split_lo, 0),
                                           np.maximum(a.eps_lb_split_hi - a.eps_lb, 0)],
                        fmt="none", ecolor=COLORS[attack], elinewidth=0.8, capsize=2,
                        alpha=0.7)
            drawn += list(a.eps_lb_split_hi)
        for column, marker, label in (
                ("eps_lb_katz", "v", "Katz, approximate 99% (not certified)"),
                ("eps_lb_bayes", "s", "Bayesian 99% credible interval, lower end")):
            if column in a:
                broken_plot(ax, x, a[column], at_inf, ls=(0, (4, 2)), lw=0.8, marker=marker,
                            ms=3, color=COLORS[attack], alpha=0.6, label=f"{name}: {label}")
                drawn += list(a[column])
        if attack in REPLACING and "eps_lb_paper_rule" in a:
            broken_plot(ax, x, a.eps_lb_paper_rule, at_inf, ls="--", lw=1, marker="o",
                        mfc="none", color=COLORS[attack], alpha=0.7,
                        label=f"{name}: paper's procedure, best over k (not a 99% bound)")
            drawn += list(a.eps_lb_paper_rule)
        elif "mi_yeom" in a and a.mi_yeom.notna().any():
            broken_plot(ax, x, a.mi_yeom, at_inf, ls=":", marker="x", color=COLORS[attack],
                         alpha=0.8, label=f"{name}: Yeom et al. population estimate (paper's; "
                                          "not a bound)")
            drawn += list(a.mi_yeom)
    ax.set_xscale("log")
    ax.set_yscale("symlog", linthresh=0.01)
    # headroom above the highest marker (symlog: a factor, not an offset)
    ax.set_ylim(bottom=1.3 * lowest if lowest < 0 else 0,
                top=1.6 * max(float(np.nanmax(drawn)), 0.01))
    ticks = sorted(set(np.round(x_all, 2)))
    ax.set_xticks(ticks, [("inf" if math.isclose(t, x_inf, rel_tol=1e-2) else f"{t:g}")
                          for t in ticks])
    ax.minorticks_off()
    title = f"{DATASET_NAMES[sub.dataset.iloc[0]]} {ARCH_NAMES[sub.arch.iloc[0]]}"
    if sub["jpeg_reencoded"].astype(bool).any():
        title += " (JPEG re-encoded)"
    ax.set(title=title, xlabel="eps_th (moments accountant, delta = 1e-5, add/remove)",
           ylabel="empirical eps (see legend)")


def plot_table2(table: str | os.PathLike, out: str | os.PathLike) -> None:
    """Heatmap of ClipBKD ``eps_lb_paper_rule`` (the paper's procedure on our models, what
    the paper's Table 2 reports; not a 99% bound): rows eps_th label, columns init x
    clipping norm, each cell annotated "ours (paper)", then "[certified]", the certified
    99% bound ``eps_lb`` (Bonferroni over k), then its 5th-95th percentile over random
    re-splits of the trials (a diagnostic, not a bound) where the table has them."""
    df = read_result_table(table, HEATMAP_COLUMNS, "jagielski-audit --experiment table2")
    inits = sorted(df.init.unique(), key=init_order)
    clips = sorted(df["clip"].unique())
    df["eps_label"] = df.eps_label.map(eps_label)
    labels = sorted(df.eps_label.unique(), key=float)  # float("inf") is inf
    split = {"eps_lb_split_lo", "eps_lb_split_hi"} <= set(df.columns)
    grid = np.full((len(labels), len(inits) * len(clips)), np.nan)
    text = np.full(grid.shape, "", dtype=object)
    for r in df.itertuples():
        i = labels.index(r.eps_label)
        j = inits.index(r.init) * len(clips) + clips.index(r.clip)
        grid[i, j] = r.eps_lb_paper_rule
        paper = "" if math.isnan(r.paper_eps_lb) else f" ({r.paper_eps_lb:.2f})"
        text[i, j] = (f"{r.eps_lb_paper_rule:.2f}{paper}\n[{r.eps_lb:.2f}]"
                      + (f"\n{r.eps_lb_split_lo:.2f}-{r.eps_lb_split_hi:.2f}" if split else ""))
    fig, ax = figure(figsize=(3.0 + 0.8 * grid.shape[1], 2.2 + 0.7 * len(labels)),
                     layout="constrained")
    vmax = max(np.nanmax(grid), 0.1) if np.isfinite(grid).any() else 1.0
    im = ax.imshow(grid, cmap="viridis", aspect="auto", vmin=0, vmax=vmax)
    for (i, j), t in np.ndenumerate(text):
        ax.text(j, i, t, ha="center", va="center", fontsize=6.5,
                color="white" if grid[i, j] < 0.6 * vmax else "black")
    ax.set_xticks(range(grid.shape[1]),
                  [f"{'fixed' if i == 'fixed' else 'x' + i[1:]}\nC={c:g}" for i in inits
                   for c in clips], fontsize=7)
    ax.set_yticks(range(len(labels)), labels)
    ax.set(xlabel="initialisation: fixed, or Glorot weights x s (variance x s^2, the "
                  "reference's init_mult)\nand clipping norm C",
           ylabel="eps_th label (add/remove neighbours)")
    # Above the axes and the colorbar (constrained layout), in short lines.
    fig.suptitle(f"ClipBKD {DATASET_NAMES[df.dataset.iloc[0]]} {ARCH_NAMES[df.arch.iloc[0]]}, "
                 f"{int(df.trials.max())} trials/side\neach cell: the paper's procedure on our "
                 "models (the paper's value)\n[our 99% bound, Bonferroni over k]"
                 + ("\nits 5th-95th percentile over 200 re-splits of the trials\n(a "
                    "diagnostic of the split, not a bound)" if split else ""), fontsize=9)
    ax.grid(False)
    fig.colorbar(im, ax=ax, label="colour: eps_LB by the\npaper's procedure (best\nover k, "
                                  "not a 99% bound)")
    save(fig, out)
