"""An audit table recomputed from its per-run losses, and re-trained runs compared with the
audited ones."""

from __future__ import annotations

import pandas as pd

from .profile import claimed_profile
from .statistics import OWN_RUNS, accuracy_columns, audit_loss_table


#: The columns of the audit table that :func:`reaudit` reads (the rest it keeps).
REAUDIT_COLUMNS = ("implementation", "claimed_eps", "delta", "alpha", "runs", "val_runs")


#: The columns that name one run in a losses table: re-trained runs are matched on them.
RUN_KEY = ("implementation", "split", "canary_in", "run", "seed")


def reaudit(table: pd.DataFrame, losses: pd.DataFrame, accuracy: pd.DataFrame | None = None,
            source: str = OWN_RUNS) -> pd.DataFrame:
    """The audit ``table`` (one row per implementation, as written by ``dpaudit
    tramer-audit``) recomputed from its per-run ``losses``, with the test-accuracy columns
    (:func:`accuracy_columns`) from the ``test_acc`` of ``accuracy`` (labelled ``source``)
    or, without it, of ``losses``.

    ``accuracy`` may hold fewer runs than ``losses`` (e.g. some of them re-trained), but
    each of its runs must be one of ``losses`` (same implementation, split, side, run
    number and seed); a ValueError says which is not.  Columns of ``table`` that the
    losses do not determine (claim, canary, label, seed) are kept; the profile test is
    recomputed where the table has it (its ``profile_sigma``, ``profile_q``,
    ``profile_steps``).
    """
    if "looks" in table:  # fixed-n Clopper-Pearson does not hold after optional stopping
        raise ValueError("table: a sequential audit's (audit-impl --sequential); its bounds "
                         "are anytime-valid and a fixed audit's recomputed from its losses "
                         "would not hold, so it is not re-audited")
    acc = losses if accuracy is None else accuracy
    if "test_acc" not in acc:
        raise ValueError("no test accuracy: neither the losses nor an accuracy table has a "
                         "test_acc column (audits before test accuracy was recorded: pass "
                         "the losses table of a re-training of some of the same runs)")
    key = list(RUN_KEY)
    if accuracy is not None:
        found = accuracy[key].merge(losses[key], how="left", indicator=True)
        stray = found[found._merge != "both"]
        if len(stray):
            raise ValueError(f"accuracy: {len(stray)} runs are not runs of the losses table "
                             f"(first: {stray.iloc[0][key].to_dict()}); re-train the same "
                             "runs (same seed and config)")
    rows = []
    for row in table.to_dict("records"):
        impl = row["implementation"]
        mine = losses[losses.implementation == impl]
        counts = mine.groupby(["split", "canary_in"]).size().to_dict()
        want = {("validation", s): row["val_runs"] for s in (False, True)}
        want.update({("evaluation", s): row["runs"] for s in (False, True)})
        if counts != want:
            raise ValueError(f"losses of {impl!r}: runs per (split, canary_in) {counts}, but "
                             f"the table says {row['runs']} evaluation and {row['val_runs']} "
                             "validation runs per side")
        # A table with the profile test names the claimed DP-SGD it was tested against.
        profile = (claimed_profile(row["profile_sigma"], row["profile_q"], row["profile_steps"])
                   if pd.notna(row.get("profile_sigma")) else None)
        row.update(audit_loss_table(mine, row["claimed_eps"], row["delta"], row["alpha"],
                                    profile))
        row.update(accuracy_columns(acc.test_acc[acc.implementation == impl], source))
        rows.append(row)
    return pd.DataFrame(rows)


def compare_retrained(losses: pd.DataFrame, retrained: pd.DataFrame) -> pd.DataFrame:
    """How the canary losses of re-trained runs compare with those of the same runs (same
    implementation, split, side, run and seed) in ``losses``: per group, the number of runs,
    and the two-sample Kolmogorov-Smirnov statistic and p-value (scipy.stats.ks_2samp).
    Where the products round differently (e.g. a CPU re-training of a GPU run: the same
    draws, other kernels), or the draws differ (runs trained before the counter-based
    generator), the pairs differ but the distributions should not."""
    from scipy import stats

    key = list(RUN_KEY)
    both = retrained[key + ["loss"]].merge(losses[key + ["loss"]], on=key,
                                           suffixes=("_retrained", ""))
    rows = []
    for (impl, split, canary_in), grp in both.groupby(key[:3], sort=False):
        ks = stats.ks_2samp(grp.loss_retrained, grp.loss)
        rows.append({"implementation": impl, "split": split, "canary_in": canary_in,
                     "runs": len(grp), "ks": float(ks.statistic), "p": float(ks.pvalue)})
    return pd.DataFrame(rows)
