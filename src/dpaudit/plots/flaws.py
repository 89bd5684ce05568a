"""Figure: the flaws table (docs/flaws.md), each row's claim against what its check found,
for the flawed training and for its fix."""

from __future__ import annotations

import os

import numpy as np

from ..io import read_table
from .style import COLORS, figure, legend_below, save

#: The smallest eps drawn (a certified bound of 0 is drawn there, on the log axis).
FLOOR = 0.05


def plot_flaws(table: str | os.PathLike, out: str | os.PathLike) -> None:
    """One line per row (flaw, code path, check), on a log eps axis:

    - black bar: the claimed eps (the eps the training reports; the fix's hollow);
    - grey diamond: the eps known for the training as it ran (the accountant's at the
      measured parameters, Chua et al.'s lower bound for shuffled batches, or a subject's
      true eps), where there is one;
    - red dot: the certified eps_LB of the flawed training (statistical checks), blue the
      fix's; a bound of 0 drawn at the floor;
    - red square with bar, just above: the robust rows' eps_LB (the fixed audit at the run
      count with 90% power), mean +- standard deviation over the seeds.
    """
    df, _ = read_table(table)
    if df.empty:
        raise ValueError(f"{table}: no rows to draw")
    fig, ax = figure(figsize=(7.0, 0.38 * len(df) + 1.2))
    y = np.arange(len(df))[::-1]
    ax.scatter(df.claimed_eps, y, marker="|", s=160, color=COLORS["theory"],
               label="claimed eps (reported by the training)")
    ax.scatter(df.fix_claimed_eps, y - 0.22, marker="|", s=90, color="#888888",
               label="claimed eps of the fix")
    known = np.isfinite(df.eps_known)
    ax.scatter(df.eps_known[known], y[known], marker="D", s=28, color="#aaaaaa",
               label="eps known for the training as it ran (accountant at the measured "
                     "parameters; Chua et al.'s bound; a subject's true eps)")
    stat = np.isfinite(df.eps_lb)
    ax.scatter(np.maximum(df.eps_lb[stat], FLOOR), y[stat], color=COLORS["buggy"], zorder=3,
               label=f"certified eps_LB, flawed (0 drawn at {FLOOR:g})")
    ax.scatter(np.maximum(df.fix_eps_lb[stat], FLOOR), y[stat] - 0.22, color=COLORS["fixed"],
               zorder=3, label="certified eps_LB, its fix")
    rob = np.isfinite(df.robust_eps_lb_mean)
    if rob.any():
        ax.errorbar(df.robust_eps_lb_mean[rob], y[rob] + 0.22, xerr=df.robust_eps_lb_sd[rob],
                    fmt="s", mfc="none", color=COLORS["buggy"], capsize=2, zorder=3,
                    label="certified eps_LB of the fixed audit at 90% power: mean +- sd "
                          "over seeds")
    labels = [f"{r.flaw}: {r.path} {r.check} ({r.target})" + (" [found]" if r.detected else "")
              for r in df.itertuples()]
    ax.set_yticks(y, labels, fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("epsilon (delta 1e-5)")
    ax.set_title(f"Flaws and their fixes ({df.scale.iloc[0]} scale, alpha {df.alpha.iloc[0]:g})")
    handles, names = ax.get_legend_handles_labels()
    legend_below(fig, [ax], handles, names, ncol=1)
    save(fig, out)


__all__ = ["plot_flaws", "FLOOR"]
