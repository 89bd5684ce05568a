"""Figure: canary-loss histograms with and without the canary, one panel per implementation."""

from __future__ import annotations

import os

import numpy as np

from ..io import read_table
from .style import COLORS, figure, save

#: Losses below this are drawn in the first bin (log axis; a memorized canary has loss ~0).
FLOOR = 1e-4
SIDES = ((True, "with canary", COLORS["backdoor"]), (False, "without canary", COLORS["theory"]))


def plot_canary_losses(table: str | os.PathLike, losses: str | os.PathLike,
                       out: str | os.PathLike) -> None:
    """Histograms of the canary loss on the evaluation runs, for models trained with and
    without the canary, side by side per implementation (the audit table's order), with
    the threshold chosen on the validation runs (the attack says "in" at or below it)."""
    audit, _ = read_table(table)
    runs, _ = read_table(losses)
    runs = runs[runs.split == "evaluation"]
    fig, axes = figure(1, len(audit), squeeze=False, sharey=True)
    clipped = np.maximum(runs.loss.to_numpy(dtype=float), FLOOR)
    finite = clipped[np.isfinite(clipped)]
    bins = np.geomspace(FLOOR, max(finite.max(), 10 * FLOOR), 60)
    for ax, row in zip(axes[0], audit.itertuples()):
        mine = runs[runs.implementation == row.implementation]
        for canary_in, label, color in SIDES:
            loss = np.clip(mine.loss[mine.canary_in == canary_in].to_numpy(float), FLOOR, bins[-1])
            rate = row.tpr if canary_in else row.fpr
            ax.hist(loss, bins=bins, histtype="stepfilled", alpha=0.35, color=color)
            ax.hist(loss, bins=bins, histtype="step", color=color,
                    label=f"{label} ({'TPR' if canary_in else 'FPR'} {rate:.3g})")
        if np.isfinite(row.threshold):
            ax.axvline(max(row.threshold, FLOOR), color=COLORS["analytic"], ls="--", lw=1.2,
                       label=rf"threshold $\tau$ = {row.threshold:.3g}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"canary loss (< {FLOOR:g} drawn at {FLOOR:g})")
        ax.set_title(f"{row.implementation}\nclaimed ($\\varepsilon$, $\\delta$) = "
                     f"({row.claimed_eps:g}, {row.delta:g}); at confidence 1 - {row.alpha:g}:\n"
                     f"$\\varepsilon_{{LB}}$ = {row.eps_lb:.3g}, $\\mu_{{LB}}$ = "
                     f"{row.mu_lb:.3g}: {row.verdict}", fontsize=8,
                     color=COLORS.get(row.implementation, COLORS["theory"]))
        ax.legend(loc="upper center", fontsize=7)
    axes[0][0].set_ylim(top=axes[0][0].get_ylim()[1] * 30)  # room for the legends (shared y)
    axes[0][0].set_ylabel(f"evaluation runs ({int(audit.runs.iloc[0])} per side)")
    save(fig, out)
