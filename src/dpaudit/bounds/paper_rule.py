"""The reference code's Table 2 procedure of [JUO20] (``bkd_parser.py``), to compare with it.

Each per-k value is a ``1 - alpha`` bound; their maximum over k is not. Its sampling
spread (:func:`paper_rule_bootstrap`) says how far two independent runs of the same
procedure, ours and the paper's, can be expected to differ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._checks import _check_level, _scores_by_k, scores_array
from .counts import clopper_pearson
from .resplits import _check_seed
from .thresholds import split_trials


#: The reference code's levels ([JUO20], ``bkd_parser.py``): the margin of its threshold
#: search, and the Clopper-Pearson level of its evaluation (0.005 in each tail).
PAPER_SELECT_ALPHA = 0.05
PAPER_ALPHA = 0.01


@dataclass(frozen=True)
class PaperRuleAudit:
    """Result of :func:`eps_lb_paper_rule`. ``value``: the largest per-k value (its
    ``best_k``), NOT itself a ``1 - alpha`` bound; ``per_k``: each k's value, a
    ``1 - alpha`` bound on pure eps; ``thresholds``: each k's threshold (the attack says
    "in" when ``score >= t``); ``counts``: each k's evaluation counts
    ``(ct_pos, n_pos, ct_neg, n_neg)``."""

    value: float
    best_k: int
    per_k: dict
    thresholds: dict
    counts: dict


def _paper_threshold(val_pos: np.ndarray, val_neg: np.ndarray, select_alpha: float) -> float:
    """The reference's threshold search (``bkd_find_thresh`` with ``use_dkw=True``), vectorised:
    over every distinct selection score t (ascending), p1 and p0 = shares of the D1 and D0
    scores ``>= t``, ``lb = p1 - m1``, ``ub = p0 + m0`` with ``m = sqrt(ln(2/select_alpha)/n)``
    (no factor 2 under the root, as the reference), ``ratio = (1-ub)/(1-lb)`` if
    ``ub + lb > 1`` else ``lb/ub``; the first t of the largest ``ln(ratio)`` (NaN from a
    negative ratio never wins), the lowest score if none is finite."""
    t = np.unique(np.concatenate([val_pos, val_neg]))
    p1 = (len(val_pos) - np.searchsorted(np.sort(val_pos), t, side="left")) / len(val_pos)
    p0 = (len(val_neg) - np.searchsorted(np.sort(val_neg), t, side="left")) / len(val_neg)
    c = math.log(2 / select_alpha)
    lb, ub = p1 - math.sqrt(c / len(val_pos)), p0 + math.sqrt(c / len(val_neg))
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.log(np.where(ub + lb > 1, (1 - ub) / (1 - lb), lb / ub))
    e = np.where(np.isnan(e), -np.inf, e)
    i = int(np.argmax(e))
    return float(t[i]) if np.isfinite(e[i]) else float(t[0])


def eps_lb_paper_rule(scores_pos, scores_neg, select_frac: float = 0.5,
                      select_alpha: float = PAPER_SELECT_ALPHA,
                      alpha: float = PAPER_ALPHA) -> PaperRuleAudit:
    """The reference code's Table 2 procedure ([JUO20], ``bkd_parser.py``), exactly.

    ``scores_pos``: ``{k: scores of the D1 side with k canaries}``, ``scores_neg``: the D0
    scores (one D0 for every k), each in trial order, higher = "in" (the reference scores
    ClipBKD by the raw logit ``f(x_p)_{y_p}``). For each k: the first ``select_frac`` of each
    side's trials choose a threshold t among their scores (test ``score >= t``) by a
    DKW-style margin at ``select_alpha`` (:func:`_paper_threshold`); on the remaining
    trials, Clopper-Pearson intervals at ``1 - alpha`` (``alpha / 2`` in each tail) give
    ``p1_lo`` (D1 share ``>= t``) and ``p0_hi`` (D0 share), ``ratio = (1 - p0_hi) /
    (1 - p1_lo)`` if ``p0_hi + p1_lo > 1`` else ``p1_lo / p0_hi``, and the value is
    ``ln(ratio) / k`` (delta = 0), floored at 0 (the reference reports negative values).

    What it is: each per-k value is a ``1 - alpha`` lower bound on the eps of pure
    (delta = 0) DP for groups of k rows (the threshold never saw the evaluation trials).
    What it is not: ``value``, the largest over k, is a maximum of several ``1 - alpha``
    bounds and not itself one (``eps_lb`` of the audits tests every k at
    ``alpha / len(ks)``); it ignores delta, so against an (eps, delta > 0) claim it can
    overstate the bound slightly; and it differs from the threshold choice of
    :mod:`.thresholds` (which maximises the bound itself), so it is kept only to compare
    with the paper's numbers, which it reproduces.
    """
    pos = _scores_by_k(scores_pos)
    neg = scores_array("scores_neg", scores_neg, 2)
    select_frac = _check_level("select_frac", select_frac)
    select_alpha = _check_level("select_alpha", select_alpha)
    alpha = _check_level("alpha", alpha)
    per_k, thresholds, counts = {}, {}, {}
    for k, sp in pos.items():
        vp, vn, ep, en = split_trials(sp, neg, select_frac)
        t = _paper_threshold(vp, vn, select_alpha)
        ct_pos, ct_neg = int((ep >= t).sum()), int((en >= t).sum())
        p1_lo = float(clopper_pearson(ct_pos, len(ep), alpha)[0])
        p0_hi = float(clopper_pearson(ct_neg, len(en), alpha)[1])
        ratio = (1 - p0_hi) / (1 - p1_lo) if p0_hi + p1_lo > 1 else p1_lo / p0_hi
        per_k[k] = max(math.log(ratio) / k, 0.0) if ratio > 0 else 0.0
        thresholds[k], counts[k] = t, (ct_pos, len(ep), ct_neg, len(en))
    best = max(per_k, key=lambda k: (per_k[k], -k))  # the first k of the largest value
    return PaperRuleAudit(per_k[best], best, per_k, thresholds, counts)


#: Bootstrap draws behind a Table 2 cell's sampling spread (``eps_lb_paper_rule_sd``).
PAPER_BOOTSTRAPS = 200
_MAX_BOOTSTRAPS = 100_000


def paper_rule_bootstrap(scores_pos, scores_neg, select_frac: float = 0.5,
                         boots: int = PAPER_BOOTSTRAPS, seed=0) -> np.ndarray:
    """:func:`eps_lb_paper_rule` of ``boots`` bootstrap resamples of the trials: each side
    (D0, and D1 for each k) drawn with replacement from its own trials, from ``seed``,
    then split and audited as the original. Their standard deviation estimates how much
    the value moves between independent repetitions of the whole experiment (new training
    runs on both sides), so the difference of two independent runs, ours and the paper's,
    has about ``sqrt(2)`` times it. A diagnostic of sampling noise, not a bound."""
    pos = _scores_by_k(scores_pos)
    neg = scores_array("scores_neg", scores_neg, 2)
    if (isinstance(boots, bool) or not isinstance(boots, (int, np.integer))
            or not 2 <= boots <= _MAX_BOOTSTRAPS):
        raise ValueError(f"boots={boots!r}: must be a whole number from 2 to {_MAX_BOOTSTRAPS}")
    rng = np.random.default_rng(_check_seed(seed))
    out = np.empty(boots)
    for b in range(boots):
        resampled = {k: sp[rng.integers(0, len(sp), len(sp))] for k, sp in pos.items()}
        out[b] = eps_lb_paper_rule(resampled, neg[rng.integers(0, len(neg), len(neg))],
                                   select_frac).value
    return out
