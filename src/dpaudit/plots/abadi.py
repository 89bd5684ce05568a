"""Abadi et al. 2016, Figures 3 and 6 from ``results/abadi_accuracy.csv``: one panel per
noise level, training and test accuracy against epochs (left axis) as in the paper. The
right axis differs: the paper plots the delta that the moments accountant gives at the
level's fixed eps, we plot the accountant's eps at a fixed delta (``abadi.delta``), with
the same stopping rule (train until the target (eps, delta) would be passed). The paper's
reported test accuracy is starred at the first epoch whose eps reaches
:data:`REACHED` times the level's target; a level that stops short of it gets no star,
only a note (and the legend names the star only where a panel draws one)."""

from __future__ import annotations

import os

import numpy as np
from matplotlib.ticker import MaxNLocator
from ..experiments.abadi import PAPER
from ..io import read_table
from .accounting import ACCOUNTANTS
from .style import COLORS, figure, legend_below, save

DATASET_NAMES = {"mnist": "MNIST", "fmnist": "Fashion-MNIST (in place of MNIST)",
                 "cifar10": "CIFAR-10"}
_TITLES = {"fig3": "Abadi et al. Fig. 3", "fig6": "Abadi et al. Fig. 6"}
_EPS = "#2ca02c"
_PAPER_DATA = {"fig3": "MNIST", "fig6": "CIFAR-10"}
#: A level has reached its eps target (and is comparable with the paper's accuracy there)
#: once its eps is at least this fraction of it: whole epochs stop a little short.
REACHED = 0.98
#: The columns of the abadi-table table that :func:`plot_abadi` reads.
COLUMNS = ("figure", "dataset", "level", "sigma", "sigma_pca", "lot_size", "n_train", "epoch",
           "train_acc", "test_acc", "eps", "delta", "accountant", "eps_target", "pretrained_on",
           "jpeg_reencoded")


def _pretrained(value) -> str:
    """A short phrase for the features' public data (``pretrained_on`` of the table)."""
    text = str(value)
    if text.startswith("cifar100"):
        return "conv features pretrained on CIFAR-100"
    if text.startswith("cifar10-heldout["):
        count = int(text[len("cifar10-heldout["):].split("]")[0])
        return (f"conv features pretrained on {count:,} held-out CIFAR-10 training images "
                "(no CIFAR-100 here)")
    return f"features pretrained on {text}"


def _level_title(figure: str, rows, index: int) -> str:
    first = rows.iloc[0]
    if figure == "fig3":
        what = rf"$\sigma$ = {first.sigma:g}, $\sigma_p$ = {first.sigma_pca:g}"
    else:
        what = rf"lot {first.lot_size:,}, $\sigma$ = {first.sigma:g}"
    return f"({index}) {first.level}: {what}"


def plot_abadi(table: str | os.PathLike, fig_name: str, out: str | os.PathLike) -> None:
    """Draw Figure 3 (``fig_name="fig3"``) or 6 (``"fig6"``) from the accuracy table. Each
    panel's last test accuracy and eps go in its title, clear of the lines and ticks."""
    df, _ = read_table(table, columns=COLUMNS, what="abadi-table")
    df = df[df.figure == fig_name]
    if df.empty:
        raise ValueError(f"{table}: no rows of figure {fig_name!r}")
    levels = list(dict.fromkeys(df.level))
    fig, axes = figure(1, len(levels), squeeze=False, sharey=True)
    axes = axes[0]
    twins = []
    for i, (ax, level) in enumerate(zip(axes, levels), 1):
        rows = df[df.level == level].sort_values("epoch")
        ax.plot(rows.epoch, rows.train_acc, color=COLORS["empirical"], label="training")
        ax.plot(rows.epoch, rows.test_acc, color=COLORS["clipbkd"], label="test")
        last = rows.iloc[-1]
        paper = PAPER.get(fig_name, {}).get(level)
        target = last.eps_target
        if paper is not None and np.isfinite(target):
            reached = rows[rows.eps >= REACHED * target]
            if len(reached):
                ax.plot([reached.epoch.iloc[0]], [paper["test_acc"]], "*",
                        color=COLORS["theory"], markersize=9,
                        label=f"paper's test accuracy ({_PAPER_DATA[fig_name]}) at the "
                              r"target $\varepsilon$")
            else:
                ax.text(0.03, 0.97, rf"$\varepsilon$ target {target:g} not reached:" +
                        f"\nthe paper's {paper['test_acc']:.0%} at it not marked",
                        transform=ax.transAxes, va="top", fontsize=7.5,
                        color=COLORS["theory"])
        eps_text = "inf (not DP)" if np.isinf(last.eps) else f"{last.eps:.2f}"
        ax.set_ylim(0, 1)
        ax.set_xlim(0, max(1, last.epoch))
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # whole epochs only
        ax.set_title(f"{_level_title(fig_name, rows, i)}\nepoch {int(last.epoch)}: test "
                     f"{last.test_acc:.1%}, " + rf"$\varepsilon$ = {eps_text}", fontsize=9)
        twin = ax.twinx()
        twins.append(twin)
        finite = rows.eps.where(np.isfinite(rows.eps))  # inf (a non-private PCA): not drawn
        twin.plot(rows.epoch, finite, "--", color=_EPS,
                  label=r"$\varepsilon$ at fixed $\delta$ (target: thin line)")
        top = float(np.nanmax(finite)) if finite.notna().any() else 0.0
        if np.isfinite(target):
            twin.axhline(target, color=_EPS, lw=0.8, alpha=0.5)
            top = max(top, float(target))
        twin.set_ylim(0, 1.35 * top if top > 0 else 1)  # the target below the corner note
        twin.tick_params(axis="y", colors=_EPS)
        twin.grid(False)
        twin.spines["right"].set_visible(True)
        if i == len(levels):
            name = ACCOUNTANTS.get(last.accountant, last.accountant)
            twin.set_ylabel(rf"$\varepsilon$ at $\delta$ = {last.delta:g}" + f"\n({name})",
                            color=_EPS)
    axes[0].set_ylabel("accuracy")
    first = df.iloc[0]
    data = DATASET_NAMES.get(first.dataset, first.dataset)
    if df.jpeg_reencoded.eq(True).any():  # the ImageFolder copy (docs/data.md)
        data += " (JPEG re-encoded)"
    extra = f"\n{_pretrained(first.pretrained_on)}" if fig_name == "fig6" else ""
    fig.suptitle(f"{_TITLES[fig_name]}: {data}, n = {first.n_train:,}{extra}", fontsize=10)
    fig.tight_layout()
    handles = {}  # every entry once, whichever panel drew it: no entry for an undrawn star
    for ax in [*axes, *twins]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    legend_below(fig, axes, list(handles.values()), list(handles), ncol=len(handles))
    save(fig, out)
