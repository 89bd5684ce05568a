"""Figure: canary-loss histograms with and without the canary, one panel per implementation
(white-box audits: histograms of the runs' scores)."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

from ..io import read_table
from .style import COLORS, figure, save

#: Losses below this are drawn in the first bin (log axis; a memorized canary has loss ~0).
FLOOR = 1e-4
#: Bins of the histograms, geometric from FLOOR to the largest finite loss.
BINS = 59
SIDES = ((True, "with canary", COLORS["backdoor"]), (False, "without canary", COLORS["theory"]))
#: The columns of the audit table (tramer-audit) that :func:`plot_canary_losses` reads.
AUDIT_COLUMNS = ("implementation", "claimed_eps", "delta", "alpha", "runs", "tpr", "fpr",
                 "threshold", "eps_lb", "mu_lb", "verdict")
#: The columns of the per-run losses (tramer-audit --losses) that :func:`loss_histogram` reads.
LOSS_COLUMNS = ("implementation", "split", "canary_in", "loss")
#: The per-run columns of a white-box audit (audit-impl --mode white-box): a score per run.
SCORE_COLUMNS = ("implementation", "split", "canary_in", "score")
#: The columns of a :func:`loss_histogram` table (tramer-reaudit --hist).
HIST_COLUMNS = ("implementation", "canary_in", "lo", "hi", "count")


def loss_histogram(losses: pd.DataFrame) -> pd.DataFrame:
    """Counts of the evaluation runs' canary losses per implementation and side, in
    :data:`BINS` geometric bins from :data:`FLOOR` to the largest finite loss of all
    implementations (one set of bins, so the panels compare): columns ``implementation``,
    ``canary_in``, ``lo``, ``hi``, ``count``.  Losses below FLOOR count in the first bin,
    losses above the last edge (infinite: diverged runs) in the last."""
    runs = losses[losses.split == "evaluation"]
    clipped = np.maximum(runs.loss.to_numpy(dtype=float), FLOOR)
    finite = clipped[np.isfinite(clipped)]
    edges = np.geomspace(FLOOR, max(finite.max(initial=0), 10 * FLOOR), BINS + 1)
    parts = []
    for (impl, canary_in), grp in runs.groupby(["implementation", "canary_in"], sort=False):
        loss = np.clip(grp.loss.to_numpy(float), FLOOR, edges[-1])
        count, _ = np.histogram(loss, bins=edges)
        parts.append(pd.DataFrame({"implementation": impl, "canary_in": canary_in,
                                   "lo": edges[:-1], "hi": edges[1:], "count": count}))
    return pd.concat(parts, ignore_index=True)


def score_histogram(scores: pd.DataFrame) -> pd.DataFrame:
    """:func:`loss_histogram` of a white-box audit's per-run ``score`` (higher: "in"), in
    :data:`BINS` equal bins over the evaluation runs' finite scores; infinite scores count
    in the end bins."""
    runs = scores[scores.split == "evaluation"]
    finite = runs.score.to_numpy(float)
    finite = finite[np.isfinite(finite)]
    lo, hi = (finite.min(), finite.max()) if finite.size else (0.0, 1.0)
    edges = np.linspace(lo, hi if hi > lo else lo + 1.0, BINS + 1)
    parts = []
    for (impl, canary_in), grp in runs.groupby(["implementation", "canary_in"], sort=False):
        count, _ = np.histogram(np.clip(grp.score.to_numpy(float), edges[0], edges[-1]),
                                bins=edges)
        parts.append(pd.DataFrame({"implementation": impl, "canary_in": canary_in,
                                   "lo": edges[:-1], "hi": edges[1:], "count": count}))
    return pd.concat(parts, ignore_index=True)


def accuracy_line(row) -> str:
    """The title line of the models' test accuracy (empty for tables without it)."""
    if not hasattr(row, "test_acc_mean") or pd.isna(row.test_acc_mean):
        return ""
    return (f"\ntest accuracy {row.test_acc_mean:.2f} ({row.test_acc_min:.2f}-"
            f"{row.test_acc_max:.2f}) of {int(row.test_acc_models):,} models,\n"
            f"{row.test_acc_source}")


def plot_canary_losses(table: str | os.PathLike, out: str | os.PathLike, *,
                       losses: str | os.PathLike | None = None,
                       hist: str | os.PathLike | None = None) -> None:
    """Histograms of the canary loss on the evaluation runs, for models trained with and
    without the canary, side by side per implementation (the audit table's order), with
    the threshold chosen on the validation runs (the attack says "in" at or below it) and
    the models' test accuracy in each title.  From the per-run ``losses`` table or from
    its :func:`loss_histogram` table ``hist`` (exactly one). A white-box audit's per-run
    table holds scores (:data:`SCORE_COLUMNS`; "in" above the threshold), drawn on a
    linear axis."""
    if (losses is None) == (hist is None):
        raise ValueError("plot_canary_losses: give exactly one of losses and hist")
    audit, _ = read_table(table, columns=AUDIT_COLUMNS, what="tramer-audit")
    scored = False
    if hist is None:
        runs, _ = read_table(losses, columns=LOSS_COLUMNS[:3], what="tramer-audit --losses")
        scored = "score" in runs and "loss" not in runs
        if not scored:  # a table with neither column is refused naming "loss"
            read_table(losses, columns=LOSS_COLUMNS, what="tramer-audit --losses")
        counts = score_histogram(runs) if scored else loss_histogram(runs)
    else:
        counts = read_table(hist, columns=HIST_COLUMNS, what="tramer-reaudit --hist")[0]
    edges = np.append(np.sort(counts.lo.unique()), counts.hi.max())
    fig, axes = figure(1, len(audit), squeeze=False, sharey=True)
    thresholds = []  # (line, the panel's highest bar): each line ends below the legend
    for ax, row in zip(axes[0], audit.itertuples()):
        mine = counts[counts.implementation == row.implementation]
        for canary_in, label, color in SIDES:
            side = mine[mine.canary_in == canary_in].sort_values("lo")
            rate = row.tpr if canary_in else row.fpr
            ax.hist(side.lo, bins=edges, weights=side["count"], histtype="stepfilled",
                    alpha=0.35, color=color)
            ax.hist(side.lo, bins=edges, weights=side["count"], histtype="step", color=color,
                    label=f"{label} ({'TPR' if canary_in else 'FPR'} {rate:.3g})")
        if np.isfinite(row.threshold):
            line = ax.axvline(row.threshold if scored else max(row.threshold, FLOOR),
                              color=COLORS["analytic"], ls="--", lw=1.2,
                              label=rf"threshold $\tau$ = {row.threshold:.3g}")
            thresholds.append((line, float(mine.groupby(["canary_in", "lo"])["count"]
                                           .sum().max())))
        ax.set_yscale("log")
        if scored:
            ax.set_xlabel("white-box score (log-likelihood ratio; 'in' above the threshold)")
        else:
            ax.set_xscale("log")
            ax.set_xlabel(f"canary loss (< {FLOOR:g} drawn at {FLOOR:g})")
        ax.set_title(f"{row.implementation}\nclaimed ($\\varepsilon$, $\\delta$) = "
                     f"({row.claimed_eps:g}, {row.delta:g}); at confidence 1 - {row.alpha:g}:\n"
                     f"$\\varepsilon_{{LB}}$ = {row.eps_lb:.3g}, $\\mu_{{LB}}$ = "
                     f"{row.mu_lb:.3g}: {row.verdict}{accuracy_line(row)}", fontsize=8,
                     color=COLORS.get(row.implementation, COLORS["theory"]))
        ax.legend(loc="upper center", fontsize=7)
    axes[0][0].set_ylim(top=axes[0][0].get_ylim()[1] * 30)  # room for the legends (shared y)
    low, high = np.log(axes[0][0].get_ylim())
    for line, top in thresholds:  # up to twice the highest bar (log axis), not the legend
        line.set_ydata([0, (np.log(2 * top) - low) / (high - low)])
    axes[0][0].set_ylabel(f"evaluation runs ({int(audit.runs.iloc[0]):,} per side)")
    save(fig, out)
