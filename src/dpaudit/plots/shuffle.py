"""Figure: the shuffling gap, each subject's audited eps against the Poisson claim and the
theory lines of shuffling (docs/shuffle.md)."""

from __future__ import annotations

import os

import numpy as np

from ..io import read_table
from .style import figure, legend_below, save

#: Subjects in drawing order -> their axis label.
SUBJECTS = {"fixed": "fixed\n(Poisson)", "shuffle": "shuffle\n(dynamic)",
            "shuffle-once": "shuffle-once\n(persistent)"}
#: (method, batch mates) -> (legend name, colour, marker).
SERIES = {
    ("whitebox-llr", -1.0): ("white box, all iterates, crafted batch mates (-C)",
                             "#d62728", "o"),
    ("whitebox-llr", 0.0): ("white box, all iterates, batch mates invisible", "#1f77b4", "o"),
    ("whitebox-dot-sum", -1.0): ("white box, last iterate, crafted batch mates (-C)",
                                 "#ff7f0e", "s"),
    ("whitebox-dot-sum", 0.0): ("white box, last iterate, batch mates invisible",
                                "#17becf", "s"),
}
#: Horizontal spread of a subject's series, in axis units, and of an estimate from its
#: certified bound (so that equal values stay visible).
DODGE, ESTIMATE_SHIFT = 0.17, 0.06


def _runs(df) -> str:
    runs = sorted(int(r) for r in df.runs.unique())
    return f"{'/'.join(f'{r:,}' for r in runs)} runs per side"


def plot_shuffle(table: str | os.PathLike, out: str | os.PathLike) -> None:
    """One panel per setting (model, B, S, E, claim), the subjects along x:

    - black line: the claimed eps (Poisson accounting, PLD), the same for every subject;
    - per shuffled subject, a grey bar from Chua et al.'s lower bound on its epsilon
      (dashed red tick) to the no-amplification eps above it: where its true epsilon lies;
    - per audit (colour and marker; batch mates and method): filled, the certified bound
      at 1 - alpha; hollow, just right of it, the GDP estimate (assumes a Gaussian trade-off
      curve: no bound).
    """
    df, _ = read_table(table)
    keys = ["arch", "batch_size", "steps_per_epoch", "epochs", "claimed_eps"]
    settings = df[keys + ["delta"]].drop_duplicates().sort_values(keys).to_dict("records")
    if not settings:
        raise ValueError(f"{table}: no rows to draw")
    subjects = [s for s in SUBJECTS if (df.subject == s).any()]
    ncols = min(3, len(settings))
    nrows = -(-len(settings) // ncols)
    fig, axes = figure(nrows, ncols, squeeze=False, figsize=(4.6 * max(2, ncols), 3.4 * nrows))
    other = sorted(set(df.mates) - {m for _, m in SERIES})
    if other:
        raise ValueError(f"{table}: batch mates {other} have no series in this figure (it draws "
                         f"mates -1 and 0)")
    series = [s for s in SERIES if ((df.method == s[0]) & (df.mates == s[1])).any()]
    for ax, st in zip(axes.flat, settings):
        sub = df[np.logical_and.reduce([df[k] == st[k] for k in keys])]
        ax.axhline(st["claimed_eps"], color="black", lw=1.2,
                   label="claimed eps: Poisson subsampling, PLD accountant")
        for x, subject in enumerate(subjects):
            rows = sub[sub.subject == subject]
            if rows.empty:
                if subject == "shuffle-once" and st["epochs"] == 1:
                    ax.text(x, st["claimed_eps"] / 2, "= shuffle\nat one epoch", ha="center",
                            va="center", fontsize=8, color="#555555")
                continue
            lb, ub = rows.shuffle_lb.iloc[0], rows.eps_upper.iloc[0]
            if np.isfinite(lb):
                ax.plot([x, x], [lb, ub], color="#bbbbbb", lw=8, solid_capstyle="butt",
                        label="where a shuffled subject's epsilon lies (Chua et al. 2024 "
                              "lower bound to no amplification)")
                ax.plot([x - 0.3, x + 0.3], [lb, lb], "--", color="#d62728", lw=1.2,
                        label="Chua et al. 2024: lower bound on its epsilon (zero-out)")
            for i, key in enumerate(series):
                name, color, marker = SERIES[key]
                row = rows[(rows.method == key[0]) & (rows.mates == key[1])]
                if row.empty:
                    continue
                at = x + DODGE * (i - (len(series) - 1) / 2)
                level = 100 * (1 - row.alpha.iloc[0])
                ax.plot([at], row.eps_lb.iloc[:1], marker, color=color, ms=6,
                        label=f"{name}: certified at {level:g}%")
                ax.plot([at + ESTIMATE_SHIFT], row.eps_lb_gdp.iloc[:1], marker, color=color,
                        mfc="none", ms=6, label=f"{name}: GDP estimate (not a bound)")
        ax.set_xticks(range(len(subjects)), [SUBJECTS[s] for s in subjects])
        ax.set_xlim(-0.6, len(subjects) - 0.4)
        ax.set_ylim(bottom=-0.04 * ax.get_ylim()[1])  # markers at 0 drawn whole
        arch = "logistic regression" if st["arch"] == "lr" else "2-layer net"
        epochs = f"{st['epochs']} epoch{'s' if st['epochs'] > 1 else ''}"
        ax.set_title(f"FMNIST {arch}, B = {st['batch_size']}, {st['steps_per_epoch']} steps "
                     f"x {epochs}\n{_runs(sub)}", fontsize=9)
        ax.set_ylabel(f"eps (delta = {st['delta']:g})")
    for ax in list(axes.flat)[len(settings):]:
        ax.set_visible(False)
    handles = {}
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    legend_below(fig, [a for a in axes.flat if a.get_visible()], list(handles.values()),
                 list(handles))
    save(fig, out)
