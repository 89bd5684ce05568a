"""Choosing the decision threshold: held out, on a split, or scanned with a union bound.

Each procedure evaluates a count bound (:data:`Bound`, e.g. a partial of
:func:`~dpaudit.bounds.eps_lb_clopper_pearson`) at a threshold the evaluated trials did
not choose, or at every threshold at a level that covers them all at once.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ._checks import _as_scores, _check_level, scores_array


#: bound(ct_pos, n_pos, ct_neg, n_neg, alpha) -> value (vectorized), e.g. a partial of
#: eps_lb_clopper_pearson or mu_lb_gdp.
Bound = Callable[..., "np.ndarray | float"]


@dataclass(frozen=True)
class ThresholdAudit:
    """A bound evaluated at one threshold: the attack says "in" when ``score > threshold``."""

    value: float
    threshold: float
    ct_pos: int
    n_pos: int
    ct_neg: int
    n_neg: int


def _counts_above(scores_pos, scores_neg, thresholds):
    sp, sn = np.sort(scores_pos), np.sort(scores_neg)
    ct_pos = len(sp) - np.searchsorted(sp, thresholds, side="right")
    ct_neg = len(sn) - np.searchsorted(sn, thresholds, side="right")
    return ct_pos, ct_neg


def _candidates(scores_pos, scores_neg) -> np.ndarray:
    """Every distinct decision "score > t": t at each distinct score, plus below all."""
    allv = np.unique(np.concatenate([scores_pos, scores_neg]))
    return np.concatenate([[-np.inf], allv[:-1]]) if allv.size else np.array([-np.inf])


#: How :func:`threshold_holdout_audit` breaks ties between equally good thresholds.
TIES = ("first", "youden")


def _scan(scores_pos, scores_neg, bound: Bound, alpha: float, thresholds,
          centre: bool = True, ties: str = "first") -> ThresholdAudit:
    """The best of ``thresholds`` (ascending distinct scores, ``-inf`` first). Every
    threshold up to the next score makes the same decisions on these scores; with
    ``centre`` the middle of that gap is returned, which keeps a margin on fresh trials
    (the score itself would sit on, e.g., the largest negative score when the sides
    separate). Ties: the lowest threshold (``"first"``) or the largest TPR - FPR."""
    ct_pos, ct_neg = _counts_above(scores_pos, scores_neg, thresholds)
    n_pos, n_neg = len(scores_pos), len(scores_neg)
    raw = bound(ct_pos, n_pos, ct_neg, n_neg, alpha)
    values = np.atleast_1d(raw)
    if values.dtype.kind not in "iuf" or values.shape not in ((1,), ct_pos.shape) or np.any(
            np.isnan(values)):
        raise ValueError(f"bound={bound!r} returned {raw!r}: must return a real number (not "
                         f"NaN) for each of the {ct_pos.size} thresholds")
    if ties == "youden":
        youden = np.broadcast_to(ct_pos / n_pos - ct_neg / n_neg, values.shape)
        i = int(np.lexsort((-np.arange(values.size), youden, values))[-1])
    else:
        i = int(np.argmax(values))
    threshold = float(thresholds[i])
    above = np.concatenate([scores_pos, scores_neg])
    above = above[above > threshold]
    if centre and np.isfinite(threshold) and above.size and np.isfinite(above.min()):
        threshold = 0.5 * (threshold + float(above.min()))
    return ThresholdAudit(float(values[i]), threshold, int(ct_pos[i]), n_pos,
                          int(ct_neg[i]), n_neg)


def _check_bound(bound: Bound, alpha: float) -> float:
    """A valid ``alpha``, and a ``bound`` callable as ``bound(ct_pos, n_pos, ct_neg, n_neg,
    alpha)`` (the threshold procedures)."""
    alpha = _check_level("alpha", alpha)
    allowed = "be callable as bound(ct_pos, n_pos, ct_neg, n_neg, alpha), e.g. eps_lb_katz"
    if not callable(bound):
        raise ValueError(f"bound={bound!r}: must {allowed}")
    try:
        inspect.signature(bound).bind(0, 1, 0, 1, alpha)
    except TypeError:
        raise ValueError(f"bound={bound!r}: must {allowed}") from None
    except ValueError:  # no signature to check (some builtins): calling it will tell
        pass
    return alpha


def threshold_split_audit(scores_pos, scores_neg, bound: Bound, alpha: float,
                          select_frac: float = 0.5) -> ThresholdAudit:
    """Pick the threshold on the first trials, evaluate the bound on the rest.

    The first ``select_frac`` of each side's trials choose the threshold maximizing
    ``bound`` (at the same alpha); the bound is then computed at that threshold on the
    remaining, independent trials only, so the confidence level needs no correction.  This
    is the reference code's procedure ([JUO20], ``audit.py``: 500 trials choose, 500
    evaluate).  Trials must be exchangeable (independent runs), so their order is the split.
    """
    return threshold_holdout_audit(*split_trials(scores_pos, scores_neg, select_frac), bound,
                                   alpha)


def split_trials(scores_pos, scores_neg, select_frac: float = 0.5):
    """``(select_pos, select_neg, eval_pos, eval_neg)``: the first ``select_frac`` of each
    side's trials, and the rest (the split of :func:`threshold_split_audit`)."""
    sp, sn = _as_scores(scores_pos, scores_neg)
    select_frac = _check_level("select_frac", select_frac)
    cut_p, cut_n = int(len(sp) * select_frac), int(len(sn) * select_frac)
    if min(cut_p, cut_n, len(sp) - cut_p, len(sn) - cut_n) < 1:
        raise ValueError(f"select_frac={select_frac!r} of {len(sp)} positive and {len(sn)} "
                         f"negative trials: must leave at least one trial of each side to "
                         f"select and one to evaluate (too few trials to split)")
    return sp[:cut_p], sn[:cut_n], sp[cut_p:], sn[cut_n:]


def threshold_holdout_audit(val_pos, val_neg, eval_pos, eval_neg, bound: Bound, alpha: float,
                            ties: str = "first") -> ThresholdAudit:
    """Choose the threshold on validation trials, evaluate the bound on independent ones.

    Over every distinct decision "score > t" on the validation scores, the threshold
    maximizing ``bound`` at ``alpha`` (ties: ``"first"``, the lowest threshold, or
    ``"youden"``, the largest validation TPR - FPR); ``bound`` is then evaluated at that
    threshold on the evaluation trials alone, which the choice never saw, so it holds at
    ``1 - alpha`` with no correction.  The returned counts are the evaluation counts.
    """
    ep, en = scores_array("eval_pos", eval_pos), scores_array("eval_neg", eval_neg)
    chosen = choose_threshold(val_pos, val_neg, bound, alpha, ties)
    return _scan(ep, en, bound, alpha, np.array([chosen.threshold]), centre=False)


def choose_threshold(val_pos, val_neg, bound: Bound, alpha: float,
                     ties: str = "first") -> ThresholdAudit:
    """The choice of :func:`threshold_holdout_audit` on the validation scores alone: the
    threshold maximizing ``bound`` at ``alpha`` over every distinct decision (ties as
    there), midway in its score gap; the value and counts are the validation ones."""
    vp, vn = scores_array("val_pos", val_pos), scores_array("val_neg", val_neg)
    _check_bound(bound, alpha)
    if not isinstance(ties, str) or ties not in TIES:
        raise ValueError(f"ties={ties!r}: must be one of {TIES}")
    return _scan(vp, vn, bound, alpha, _candidates(vp, vn), ties=ties)


def threshold_scan_audit(scores_pos, scores_neg, bound: Bound, alpha: float) -> ThresholdAudit:
    """Scan every threshold on all trials with a union bound over count values.

    Every threshold is evaluated at the fixed level ``a = 2 alpha / (n_pos + n_neg)``, each
    side's one-sided bound at ``a / 2``.  Why that holds for all thresholds at once: as the
    threshold moves, the true TPR and the count of positives above it both only fall, so
    "the TPR bound fails at some threshold with count c" is the event "count >= c at the
    one threshold where the TPR first drops below the bound for c", of probability at most
    ``a / 2``; there are at most n_pos such c (and n_neg for the FPR), so everything holds
    with probability ``1 - alpha``.  (A level of alpha over the number of distinct scores
    would be a union over a data-chosen set; with ties it can be larger than this one.)
    Uses every trial, at the price of the factor ``(n_pos + n_neg) / 2`` in the level.
    """
    sp, sn = _as_scores(scores_pos, scores_neg)
    alpha = _check_bound(bound, alpha)
    return _scan(sp, sn, bound, 2 * alpha / (len(sp) + len(sn)), _candidates(sp, sn))
