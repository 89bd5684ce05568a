"""ROC measures of an attack's scores: the TPR at a low FPR ([CCN+22]) and the AUC."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from ._checks import _as_scores, _check_level


def tpr_at_fpr(scores_pos, scores_neg, max_fpr: float) -> float:
    """The largest TPR of a decision "score > t" whose FPR is at most ``max_fpr``, over every
    threshold t ([CCN+22]'s measure; one point of the empirical ROC curve).  With ``n``
    negative scores, an FPR of at most ``max_fpr`` allows ``floor(max_fpr n)`` false
    positives: none when ``n < 1 / max_fpr``."""
    sp, sn = _as_scores(scores_pos, scores_neg)
    _check_level("max_fpr", max_fpr)
    allowed = math.floor(max_fpr * len(sn) + 1e-9)
    t = np.sort(sn)[::-1][allowed] if allowed < len(sn) else -np.inf  # the first not allowed
    return float(np.mean(sp > t))


def auc(scores_pos, scores_neg) -> float:
    """Area under the empirical ROC curve: ``P[score_pos > score_neg] + P[tie] / 2``, the
    Mann-Whitney U statistic over ``n_pos n_neg`` (``scipy.stats.mannwhitneyu``)."""
    sp, sn = _as_scores(scores_pos, scores_neg)
    return float(stats.mannwhitneyu(sp, sn).statistic / (len(sp) * len(sn)))
