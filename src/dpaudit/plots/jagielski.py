"""Figures of Jagielski et al. 2020: Figure 2 (eps_LB of MI, backdoor and ClipBKD against
eps_th) and a heatmap of Table 2 (ClipBKD eps_LB over clip x init x eps_th)."""

from __future__ import annotations

import math
import os

import numpy as np

from ..experiments.jagielski import eps_label, init_order
from ..io import read_table
from .style import COLORS, figure, save

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


def plot_fig2(table: str | os.PathLike, out: str | os.PathLike) -> None:
    """One panel per (data set, model), against the theoretical eps of the cell
    (rdp_classic, delta 1e-5, add/remove neighbours: the paper's x-axis):

    - solid: each attack's certified 99% bound ``eps_lb`` (every k at 1% / len(ks));
    - dashed, hollow: the paper's statistic ``eps_lb_best_k``, the largest over k of 99%
      bounds (not itself a 99% bound; equal to the solid line for MI, which has one k);
    - dashed, thin, triangles and squares: ``eps_lb_katz`` (approximate: asymptotic Katz
      intervals) and ``eps_lb_bayes`` (lower end of a 99% Bayesian credible interval), from
      the certified bound's counts, at its level;
    - MI, dotted crosses: ``mi_yeom``, the paper's population MI estimate (a point
      estimate, not a bound);
    - grey: eps = eps_th (add/remove; MI removes a row) and ``eps_pld_replace``, the
      cell's eps at the same delta for neighbours that differ by replacing one row, as
      backdoor and ClipBKD's are (PLD, dp_accounting's REPLACE_ONE; not 2 eps_th, which
      group privacy gives only at the larger delta (1 + e^eps) delta).

    The y axis is linear below 0.01 (symlog), so cells that certify nothing sit on 0."""
    df, _ = read_table(table)
    panels = [(d, a) for d in DATASET_NAMES for a in ARCH_NAMES
              if ((df.dataset == d) & (df.arch == a)).any()]
    fig, axes = figure(1, len(panels), squeeze=False)
    for ax, (dataset, arch) in zip(axes[0], panels):
        sub = df[(df.dataset == dataset) & (df.arch == arch)]
        x_all, x_inf = _x_positions(sub.eps_th.to_numpy(float))
        line = np.geomspace(max(min(x_all.min(), 0.5), 1e-3), x_inf, 50)
        ax.plot(line, line, color=COLORS["theory"], lw=1, ls=":",
                label="eps = eps_th (add/remove: MI)")
        rep = sub[sub.attack.isin(REPLACING)].drop_duplicates("eps_th").sort_values("eps_th")
        if not rep.empty:
            xr = _x_positions(rep.eps_th.to_numpy(float))[0]
            ax.plot(xr, np.where(np.isfinite(rep.eps_pld_replace), rep.eps_pld_replace,
                                 np.nan), color=COLORS["theory"], lw=1, ls="-.", marker="_",
                    ms=10, alpha=0.6,
                    label="eps (PLD) for replacing one row: backdoor, ClipBKD")
        for i, (attack, name) in enumerate(ATTACK_NAMES.items()):
            a = sub[sub.attack == attack].sort_values("eps_th")
            if a.empty:
                continue
            x = _x_positions(a.eps_th.to_numpy(float))[0] * 1.06 ** (i - 1)  # no overlap
            ax.plot(x, a.eps_lb, marker="o", color=COLORS[attack],
                    label=f"{name}: 99% lower bound" + (" (Bonferroni over k)"
                                                       if attack in REPLACING else ""))
            for column, marker, label in (
                    ("eps_lb_katz", "v", "Katz, approximate 99% (not certified)"),
                    ("eps_lb_bayes", "s", "Bayesian 99% credible interval, lower end")):
                if column in a:
                    ax.plot(x, a[column], ls=(0, (4, 2)), lw=0.8, marker=marker, ms=3,
                            color=COLORS[attack], alpha=0.6, label=f"{name}: {label}")
            if attack in REPLACING:
                ax.plot(x, a.eps_lb_best_k, ls="--", lw=1, marker="o", mfc="none",
                        color=COLORS[attack], alpha=0.7,
                        label=f"{name}: best over k (paper's statistic; not a 99% bound)")
            elif "mi_yeom" in a and a.mi_yeom.notna().any():
                ax.plot(x, a.mi_yeom, ls=":", marker="x", color=COLORS[attack], alpha=0.8,
                        label=f"{name}: Yeom et al. population estimate (paper's; not a bound)")
        ax.set_xscale("log")
        ax.set_yscale("symlog", linthresh=0.01)
        ax.set_ylim(bottom=0)
        ticks = sorted(set(np.round(x_all, 2)))
        ax.set_xticks(ticks, [("inf" if math.isclose(t, x_inf, rel_tol=1e-2) else f"{t:g}")
                              for t in ticks])
        ax.minorticks_off()
        title = f"{DATASET_NAMES[dataset]} {ARCH_NAMES[arch]}"
        if sub["jpeg_reencoded"].astype(bool).any():
            title += "\n(JPEG re-encoded CIFAR-10)"
        ax.set(title=title, xlabel="eps_th (rdp_classic, delta = 1e-5, add/remove)",
               ylabel="empirical eps (see legend)")
    handles = {}
    for ax in axes[0]:  # every entry once, whichever panel drew it
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(list(handles.values()), list(handles), loc="upper center", ncol=2,
               bbox_to_anchor=(0.5, 0.0),
               title=f"{int(df.trials.max())} trials per side, half choose the threshold, "
                     "half evaluate it")
    save(fig, out)


def plot_table2(table: str | os.PathLike, out: str | os.PathLike) -> None:
    """Heatmap of ClipBKD ``eps_lb_best_k`` (the paper's statistic, not a 99% bound): rows
    eps_th, columns init x clipping norm, each cell annotated "ours (paper) [certified]",
    the certified one being ``eps_lb`` (99%, Bonferroni over k)."""
    df, _ = read_table(table)
    inits = sorted(df.init.unique(), key=init_order)
    clips = sorted(df["clip"].unique())
    df["eps_label"] = df.eps_label.map(eps_label)
    labels = sorted(df.eps_label.unique(), key=float)  # float("inf") is inf
    grid = np.full((len(labels), len(inits) * len(clips)), np.nan)
    text = np.full(grid.shape, "", dtype=object)
    for r in df.itertuples():
        i = labels.index(r.eps_label)
        j = inits.index(r.init) * len(clips) + clips.index(r.clip)
        grid[i, j] = r.eps_lb_best_k
        paper = "" if math.isnan(r.paper_eps_lb) else f" ({r.paper_eps_lb:.2f})"
        text[i, j] = f"{r.eps_lb_best_k:.2f}{paper}\n[{r.eps_lb:.2f}]"
    fig, ax = figure(figsize=(3.0 + 0.8 * grid.shape[1], 2.0 + 0.55 * len(labels)))
    vmax = max(np.nanmax(grid), 0.1) if np.isfinite(grid).any() else 1.0
    im = ax.imshow(grid, cmap="viridis", aspect="auto", vmin=0, vmax=vmax)
    for (i, j), t in np.ndenumerate(text):
        ax.text(j, i, t, ha="center", va="center", fontsize=7,
                color="white" if grid[i, j] < 0.6 * vmax else "black")
    ax.set_xticks(range(grid.shape[1]),
                  [f"{'fixed' if i == 'fixed' else 'x' + i[1:]}\nC={c:g}" for i in inits
                   for c in clips], fontsize=7)
    ax.set_yticks(range(len(labels)), labels)
    ax.set(xlabel="initialisation: fixed, or Glorot weights x s (variance x s^2, the "
                  "reference's init_mult)\nand clipping norm C",
           ylabel="eps_th label (add/remove neighbours)")
    # Title in short lines over the heatmap only, so it stays clear of the colorbar label.
    ax.set_title(f"ClipBKD {DATASET_NAMES[df.dataset.iloc[0]]} {ARCH_NAMES[df.arch.iloc[0]]}, "
                 f"{int(df.trials.max())} trials/side\n"
                 "each cell: best over k (paper's value)\n"
                 "[99% bound, Bonferroni over k]", fontsize=9)
    ax.grid(False)
    fig.colorbar(im, ax=ax, label="colour: eps_LB best over k\n(paper's statistic, "
                                  "not a 99% bound)")
    save(fig, out)
