"""The audit of one cell of Jagielski et al. 2020: the bounds of its scores, its eps_th."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ... import bounds
from .grid import STATISTICS, score_columns, side_names

if TYPE_CHECKING:
    from ... import dpsgd


def audit_scores(scores: pd.DataFrame, attack: str, alpha: float, delta: float,
                 select_frac: float = 0.5, statistic: str | None = None,
                 split_only: bool = False) -> pd.DataFrame:
    """Bounds of one cell's scores, one row per k (D1 side against the D0 side), each at
    ``1 - alpha`` for that k alone.

    Columns: ``eps_lb`` (Clopper-Pearson, [JUO20] Alg. 2, threshold chosen on the first
    ``select_frac`` of the trials and evaluated on the rest; per row of a group of k
    rows by [JUO20] Lemma 1 with ``delta``), its threshold and counts (``tpr``, ``fpr`` on
    the evaluation trials, and the counts ``ct_eval_pos`` of ``n_eval_pos``, ``ct_eval_neg``
    of ``n_eval_neg``); ``eps_lb_scan`` (every threshold on all trials, union bound over
    count values); ``mu_lb_group`` (Gaussian DP of the whole group, same split) and
    ``mu_lb = mu_lb_group / k``, per row (k rows of a mu-GDP mechanism compose to at most
    k mu); ``eps_lb_gdp`` = ``eps_from_mu(mu_lb, delta)``, which holds only if the models
    are exactly mu-GDP (Nasr et al. 2023's assumption), which subsampled DP-SGD is not: an
    estimate, never a certified bound; ``eps_lb_katz`` (approximate: Katz log intervals)
    and ``eps_lb_bayes`` (lower end of a Bayesian credible interval) from the evaluation
    counts of ``eps_lb``'s threshold, at the same alpha, delta and k.  The attack's ROC
    measures on the evaluation trials (Carlini et al. 2022): ``tpr_at_fpr_0_1pct``,
    ``tpr_at_fpr_1pct`` and ``auc``.  ``split_only``: the split columns alone.
    """
    stat = statistic or STATISTICS[attack][0]
    if stat not in scores:
        raise ValueError(f"scores lack the statistic column {stat!r}")
    neg = bounds.scores_array(f"scores[{stat!r}] of D0", scores.loc[scores.label == 0]
                              .sort_values("trial")[stat], 2)
    out = []
    for k, grp in scores.loc[scores.label == 1].groupby("k"):
        pos = bounds.scores_array(f"scores[{stat!r}] of D1 (k={k})",
                                  grp.sort_values("trial")[stat], 2)
        cp = partial(_cp, delta=delta, k=int(k))
        halves = bounds.split_trials(pos, neg, select_frac)  # select, select, eval, eval
        split = bounds.threshold_holdout_audit(*halves, cp, alpha)
        row = {"statistic": stat, "k": int(k), "eps_lb": split.value,
               "threshold": split.threshold, "tpr": split.ct_pos / split.n_pos,
               "fpr": split.ct_neg / split.n_neg, "ct_eval_pos": split.ct_pos,
               "n_eval_pos": split.n_pos, "ct_eval_neg": split.ct_neg,
               "n_eval_neg": split.n_neg}
        if not split_only:
            counts = (split.ct_pos, split.n_pos, split.ct_neg, split.n_neg, alpha, delta, int(k))
            eval_pos, eval_neg = halves[2:]
            scan = bounds.threshold_scan_audit(pos, neg, cp, alpha)
            gdp = bounds.threshold_holdout_audit(*halves, bounds.mu_lb_gdp, alpha)
            row.update({name: bounds.tpr_at_fpr(eval_pos, eval_neg, level)
                        for name, level in ROC_LEVELS.items()},
                       auc=bounds.auc(eval_pos, eval_neg),
                       eps_lb_katz=bounds.eps_lb_katz(*counts),
                       eps_lb_bayes=bounds.eps_lb_bayes(*counts),
                       eps_lb_scan=scan.value, mu_lb_group=gdp.value, mu_lb=gdp.value / k,
                       eps_lb_gdp=bounds.eps_gdp_estimate(gdp.value / k, delta))
        out.append(row)
    if not out:
        raise ValueError("scores have no D1 trials (label 1)")
    return pd.DataFrame(out)


#: The ROC columns of :func:`audit_scores`: the TPR at each FPR limit (Carlini et al. 2022).
ROC_LEVELS = {"tpr_at_fpr_0_1pct": 0.001, "tpr_at_fpr_1pct": 0.01}


def _cp(ct_pos, n_pos, ct_neg, n_neg, alpha, *, delta, k):
    return bounds.eps_lb_clopper_pearson(ct_pos, n_pos, ct_neg, n_neg, alpha, delta, k)


#: What each bound column of :func:`summarize_cell` is (figures, tables and docs say the same).
COLUMNS = {
    "eps_lb_paper_rule": "the reference code's Table 2 procedure (bounds.eps_lb_paper_rule): "
                         "raw-logit statistic for ClipBKD (the attack's own for MI and "
                         "backdoor), threshold by a DKW-style margin, Clopper-Pearson at 99%, "
                         "delta = 0, largest over k; reproduces the paper's numbers; a maximum "
                         "of several 99% bounds, not itself a 99% bound",
    "eps_lb_paper_rule_sd": "diagnostic, not a bound: standard deviation of eps_lb_paper_rule "
                            "over bootstrap resamples of both sides' trials, its sampling "
                            "spread (an independent run of the same procedure, such as the "
                            "paper's, differs from ours by about sqrt(2) times it)",
    "eps_lb_best_k": "the largest over k of the per-k bounds, each at 1 - alpha, at eps_lb's "
                     "thresholds; a maximum of several, not itself a 1 - alpha bound",
    "eps_lb": "certified: every k at alpha / len(ks), largest over k (union bound)",
    "eps_lb_split_lo": "diagnostic, not a bound: 5th percentile of eps_lb over random re-splits "
                       "of the same trials into selection and evaluation halves",
    "eps_lb_split_hi": "diagnostic, not a bound: 95th percentile of eps_lb over the same "
                       "re-splits",
    "eps_lb_scan": "certified: every threshold on all trials (union bound over count values) "
                   "and every k (Bonferroni)",
    "mu_lb": "certified per-row mu-GDP lower bound: group mu / k, every k at alpha / len(ks)",
    "eps_lb_gdp": "estimate: eps at delta of mu_lb, assuming the models are exactly mu-GDP",
    "eps_lb_katz": "approximate (asymptotic Katz log intervals for the two rate ratios): "
                   "eps_lb's threshold and evaluation counts, every k at alpha / len(ks), "
                   "largest over k; not certified",
    "eps_lb_bayes": "Bayesian credible interval, lower end (Zanella-Beguelin et al. 2023, "
                    "Jeffreys priors): same counts, level and k as eps_lb_katz; a posterior "
                    "quantile, not a confidence bound",
    "eps_lb_clipbkd_logit": "certified: the reference's raw-logit statistic, as eps_lb",
    "mi_yeom": "estimate: Yeom et al.'s population MI eps (1000 train, 1000 test points), "
               "averaged over models; the paper's MI measure, not a bound",
}

#: The statistic of each attack that the paper's procedure (``eps_lb_paper_rule``) reads:
#: the reference scores ClipBKD by the raw logit ``f(x_p)_{y_p}`` (``make_nps.py`` never
#: subtracts ``f(0)``); MI and the backdoor by their own statistic.
PAPER_STATISTIC = {"mi": "mi", "backdoor": "backdoor", "clipbkd": "clipbkd_logit"}
#: Random re-splits behind ``eps_lb_split_lo`` and ``eps_lb_split_hi``.
RESPLITS = 200
#: Their percentiles.
SPLIT_PERCENTILES = (5.0, 95.0)
#: Bootstrap resamples behind ``eps_lb_paper_rule_sd``.
BOOTSTRAPS = bounds.PAPER_BOOTSTRAPS


def _sides(scores: pd.DataFrame, stat: str) -> tuple[dict[int, np.ndarray], np.ndarray]:
    """``({k: D1 scores}, D0 scores)`` of column ``stat``, each in trial order."""
    if stat not in scores:
        raise ValueError(f"scores lack the statistic column {stat!r}")
    neg = bounds.scores_array(f"scores[{stat!r}] of D0", scores.loc[scores.label == 0]
                              .sort_values("trial")[stat], 2)
    pos = {int(k): bounds.scores_array(f"scores[{stat!r}] of D1 (k={k})",
                                       g.sort_values("trial")[stat], 2)
           for k, g in scores.loc[scores.label == 1].groupby("k")}
    return pos, neg


def summarize_cell(scores: pd.DataFrame, attack: str, alpha: float, delta: float,
                   select_frac: float = 0.5, resplits: int = 0, seed=0,
                   boots: int = 0, boot_seed=0) -> dict:
    """One cell's result row (:data:`COLUMNS` says what each bound is).

    Each k's threshold is chosen once, on the first ``select_frac`` of the trials, by the
    primary statistic's Clopper-Pearson bound at ``alpha / len(ks)``, and its evaluation
    counts give both ``eps_lb`` (every k at ``alpha / len(ks)``, the largest over k: valid
    at ``1 - alpha`` by the union bound) and ``eps_lb_best_k`` (every k at ``alpha``, the
    largest over k: not itself a bound), so ``eps_lb <= eps_lb_best_k`` always;
    ``best_k``, ``tpr``, ``fpr``, ``threshold`` and the ROC measures (:data:`ROC_LEVELS`,
    ``auc``, evaluation trials) belong to ``best_k``. ``eps_lb_scan``, ``mu_lb`` (per row),
    the other ClipBKD statistic's ``eps_lb_<stat>``, ``eps_lb_katz`` (approximate) and
    ``eps_lb_bayes`` (credible interval): at ``alpha / len(ks)``, largest over k;
    ``eps_lb_gdp``: the eps of ``mu_lb``, an estimate. ``eps_lb_paper_rule``: the paper's
    own procedure on :data:`PAPER_STATISTIC` (:func:`dpaudit.bounds.eps_lb_paper_rule`,
    the reference's levels; ``select_frac`` as here). With ``resplits`` > 0,
    ``eps_lb_split_lo`` and ``eps_lb_split_hi``: :data:`SPLIT_PERCENTILES` of ``eps_lb``
    over that many random re-splits drawn from ``seed``
    (:func:`dpaudit.bounds.eps_lb_resplits`), a diagnostic of the split, not a bound.
    With ``boots`` > 0, ``eps_lb_paper_rule_sd``: the standard deviation of
    ``eps_lb_paper_rule`` over that many bootstrap resamples of both sides' trials drawn
    from ``boot_seed`` (:func:`dpaudit.bounds.paper_rule_bootstrap`), its sampling spread.
    Also the number of trials per side and the mean test accuracy."""
    n_k = int(scores.loc[scores.label == 1, "k"].nunique())
    level = alpha / max(n_k, 1)
    per_k = audit_scores(scores, attack, level, delta, select_frac)
    at_alpha = np.array([bounds.eps_lb_clopper_pearson(r.ct_eval_pos, r.n_eval_pos,
                                                       r.ct_eval_neg, r.n_eval_neg, alpha,
                                                       delta, int(r.k))
                         for r in per_k.itertuples()])
    i = int(at_alpha.argmax())
    best = per_k.iloc[i]
    mu_lb = float(per_k.mu_lb.max())
    pos, neg = _sides(scores, PAPER_STATISTIC[attack])
    row = {"eps_lb_paper_rule": bounds.eps_lb_paper_rule(pos, neg, select_frac).value,
           **({"eps_lb_paper_rule_sd": float(np.std(bounds.paper_rule_bootstrap(
               pos, neg, select_frac, boots, boot_seed), ddof=1))} if boots else {}),
           "eps_lb_best_k": float(at_alpha[i]), "best_k": int(best.k),
           "tpr": float(best.tpr), "fpr": float(best.fpr), "threshold": float(best.threshold),
           **{name: float(best[name]) for name in [*ROC_LEVELS, "auc"]},
           "eps_lb": float(per_k.eps_lb.max())}
    if resplits:
        pos, neg = _sides(scores, STATISTICS[attack][0])
        spread = bounds.eps_lb_resplits(pos, neg, alpha, delta, select_frac, resplits, seed)
        row["eps_lb_split_lo"], row["eps_lb_split_hi"] = (
            float(v) for v in np.percentile(spread, SPLIT_PERCENTILES))
    row.update({"eps_lb_scan": float(per_k.eps_lb_scan.max()),
                "mu_lb": mu_lb, "eps_lb_gdp": bounds.eps_gdp_estimate(mu_lb, delta),
                "eps_lb_katz": float(per_k.eps_lb_katz.max()),
                "eps_lb_bayes": float(per_k.eps_lb_bayes.max())})
    for stat in STATISTICS[attack][1:]:
        row[f"eps_lb_{stat}"] = float(audit_scores(scores, attack, level, delta, select_frac,
                                                   statistic=stat, split_only=True).eps_lb.max())
    row["trials"] = int((scores.label == 0).sum())
    row["test_acc"] = float(scores.test_acc.mean())
    if "mi_yeom" in scores:  # the paper averages it over 10 models; here over every model
        row["mi_yeom"] = float(scores.mi_yeom.mean())
    return row


def theoretical_eps(noise: float, n: int, cfg: dpsgd.DPSGDConfig, delta: float) -> dict:
    """The cell's theoretical eps (:func:`dpaudit.accounting.dpsgd_epsilons`): sample rate
    ``B / n`` over the trained steps (Poisson subsampling, as the accountants assume)."""
    from ... import accounting  # dp_accounting takes ~1 s to import: only where needed

    return accounting.dpsgd_epsilons(noise, cfg.batch_size / n, cfg.steps(n), delta)


def read_scores(path) -> tuple[pd.DataFrame, dict]:
    """A cell's score table (``jagielski-train``) and its provenance, checked before any
    bound reads it: the content hash (:func:`dpaudit.io.read_table`), and for every side
    of its attack and ``ks``, the ``trials`` its provenance records, trials 0 to T - 1,
    each with a finite score and test accuracy. BadInputFile naming the file otherwise,
    and where it was damaged, the command that trains its group again: the workflow's
    output is the table's folder (``jagielski-train --out-dir``), whose job restores the
    blocks kept intact."""
    from ...io import BadInputFile, forcerun, read_table, require_columns

    redo = forcerun(Path(path).parent)
    try:  # the columns of every attack first; its own scores once its provenance names it
        scores, prov = read_table(path, columns=("side", "trial", "test_acc"),
                                  what="jagielski-train")
    except BadInputFile as exc:
        raise BadInputFile(exc.path, exc.reason, exc.redo and redo) from None
    cell, spec = prov.get("cell"), prov.get("spec")
    if not (isinstance(cell, dict) and isinstance(spec, dict)
            and {"trials", "ks"} <= set(spec) and cell.get("attack") in STATISTICS):
        raise BadInputFile(path, "not a score table of jagielski-train (no cell and spec "
                                 "in its provenance)")
    want, trials = side_names(cell["attack"], spec["ks"]), int(spec["trials"])
    columns = ["side", "trial", *score_columns(cell["attack"])]
    require_columns(scores, prov, path, columns, "jagielski-train")
    for side in want:
        got = scores.trial[scores.side == side]
        if sorted(got) != list(range(trials)):
            raise BadInputFile(path, f"side {side}: {len(got)} rows, but its provenance "
                                     f"records {trials} trials per side (0 to {trials - 1})",
                               redo)
    if len(scores) != len(want) * trials:
        raise BadInputFile(path, f"rows of sides {sorted(set(scores.side) - set(want))}, "
                                 f"which its provenance does not record", redo)
    values = scores[columns[2:]]
    if not all(pd.api.types.is_numeric_dtype(d) for d in values.dtypes) \
            or not np.isfinite(values.to_numpy(np.float64)).all():
        raise BadInputFile(path, "a score or test accuracy is not a finite number", redo)
    return scores, prov


def read_result_table(path, columns=(), what: str = "jagielski-audit") -> pd.DataFrame:
    """A Figure 2 or Table 2 table (``jagielski-audit``), checked before it is shown: the
    content hash where one is recorded and the ``columns`` the caller reads (``what``: the
    kind of table; :func:`dpaudit.io.read_table`), and the trials of every row as its
    provenance's spec records them. BadInputFile naming the file otherwise."""
    from ...io import BadInputFile, read_table

    table, prov = read_table(path, columns=columns, what=what)
    spec = prov.get("spec")
    trials = spec.get("trials") if isinstance(spec, dict) else None
    if trials is not None and "trials" in table and not (table.trials == trials).all():
        raise BadInputFile(path, f"rows of trials {sorted(set(table.trials))}, but its "
                                 f"provenance records {trials}")
    return table
