"""How much the split moves a bound: the certified bound on seeded re-splits of the trials.

Each value is a ``1 - alpha`` bound; their spread (a quantile, the maximum) is a
diagnostic of the split, not a bound.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache

import numpy as np

from ._checks import _check_delta, _check_k, _check_level, _scores_by_k, _whole, scores_array
from .counts import eps_lb_clopper_pearson
from .thresholds import split_trials


@lru_cache(maxsize=64)
def _cp_table(n_pos: int, n_neg: int, alpha: float, delta: float, k: int) -> np.ndarray:
    """:func:`eps_lb_clopper_pearson` at every count pair: ``table[ct_pos, ct_neg]``."""
    return np.asarray(eps_lb_clopper_pearson(np.arange(n_pos + 1)[:, None], n_pos,
                                             np.arange(n_neg + 1)[None, :], n_neg, alpha,
                                             delta, k))


def _suffix_counts(idx: np.ndarray, n_values: int) -> np.ndarray:
    """``out[s, j]`` = entries of row s of ``idx`` (value indices) that are ``>= j``,
    for ``j = 0..n_values``."""
    S = idx.shape[0]
    flat = (np.arange(S)[:, None] * n_values + idx).ravel()
    hist = np.bincount(flat, minlength=S * n_values).reshape(S, n_values)
    return np.concatenate([np.cumsum(hist[:, ::-1], axis=1)[:, ::-1],
                           np.zeros((S, 1), np.int64)], axis=1)


def _resplit_one_k(pos: np.ndarray, neg: np.ndarray, order_pos: np.ndarray,
                   order_neg: np.ndarray, select_frac: float, level: float, delta: float,
                   k: int) -> np.ndarray:
    """:func:`threshold_holdout_audit` of the Clopper-Pearson bound at ``level`` for each
    split (row) of ``order_pos``/``order_neg`` (trial orders: the first ``select_frac``
    select), all splits at once: the same threshold, its centring and its value."""
    S = order_pos.shape[0]
    cut_p, cut_n = int(len(pos) * select_frac), int(len(neg) * select_frac)
    u = np.unique(np.concatenate([pos, neg]))  # every score of the cell, ascending
    J = len(u)
    ip, ineg = np.searchsorted(u, pos)[order_pos], np.searchsorted(u, neg)[order_neg]
    sel_p, sel_n = _suffix_counts(ip[:, :cut_p], J), _suffix_counts(ineg[:, :cut_n], J)
    ev_p, ev_n = _suffix_counts(ip[:, cut_p:], J), _suffix_counts(ineg[:, cut_n:], J)
    # Candidates: "score > -inf" (column 0), then "score > u_j" (column j + 1). Every
    # distinct decision on the selection trials appears, first at the selection score
    # that thresholds._candidates would give, so the first maximum is the same threshold.
    table = _cp_table(cut_p, cut_n, level, delta, k)
    first = slice(1, 2) if u[0] == -np.inf else slice(0, 1)  # "> -inf" leaves out -inf
    values = table[np.concatenate([sel_p[:, first], sel_p[:, 1:]], axis=1),
                   np.concatenate([sel_n[:, first], sel_n[:, 1:]], axis=1)]
    c = np.argmax(values, axis=1)  # first maximum
    rows = np.arange(S)
    # Centre as thresholds._scan: midway to the next selection score above the chosen one.
    has = (sel_p[:, :-1] - sel_p[:, 1:] + sel_n[:, :-1] - sel_n[:, 1:]) > 0  # (S, J)
    nxt = np.where(has, np.arange(J), J)
    nxt = np.concatenate([np.minimum.accumulate(nxt[:, ::-1], axis=1)[:, ::-1],
                          np.full((S, 1), J)], axis=1)
    theta = np.where(c > 0, u[np.maximum(c - 1, 0)], -np.inf)
    j_next = nxt[rows, c]  # for c > 0: the first selection score index > c - 1
    upper = u[np.minimum(j_next, J - 1)]
    centre = (c > 0) & (j_next < J) & np.isfinite(theta) & np.isfinite(upper)
    theta = np.where(centre, 0.5 * (theta + upper), theta)
    above = np.searchsorted(u, theta, side="right")  # eval scores > theta: index >= above
    return _cp_table(len(pos) - cut_p, len(neg) - cut_n, level, delta, k)[
        ev_p[rows, above], ev_n[rows, above]]


def _resplit_orders(n: int, splits: int, rng: np.random.Generator) -> np.ndarray:
    """``splits`` uniformly random orders of ``n`` trials, one per row."""
    return rng.permuted(np.tile(np.arange(n), (splits, 1)), axis=1)


#: Most ``splits x trials`` :func:`eps_lb_resplits` draws (its arrays take about 40 bytes
#: per entry: 10**8 is about 4 GB).
_MAX_RESPLIT_ENTRIES = 10**8


def _check_seed(seed):
    """An int >= 0 or a ``numpy.random.SeedSequence`` (:mod:`dpaudit.seeds` makes them):
    what makes the same draws on every call (None, a Generator, booleans, floats, text and
    negative numbers are refused)."""
    if isinstance(seed, np.random.SeedSequence) or (
            isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) and seed >= 0):
        return seed
    raise ValueError(f"seed={seed!r}: must be an int >= 0 or a numpy.random.SeedSequence "
                     f"(re-splits must be reproducible)")


def _check_orders(orders, n_neg: int, n_pos: dict[int, int]):
    """``(order_neg, {k: order_pos})`` as int arrays of shape ``(splits, n)``, each row a
    permutation of the ``n`` trials of its side, the ks those of the scores."""
    allowed = "be None or a pair (order_neg, {k: order_pos}) of (splits, n) arrays"
    if not isinstance(orders, (tuple, list)) or len(orders) != 2 or not isinstance(
            orders[1], Mapping):
        raise ValueError(f"orders={type(orders).__name__}: must {allowed}")
    if set(orders[1]) != set(n_pos):
        raise ValueError(f"orders: the D1 orders are for k in {sorted(orders[1], key=repr)}, "
                         f"the scores for k in {sorted(n_pos)}: must be the same ks")
    order_neg = _whole("orders: order_neg", orders[0])
    order_pos = {k: _whole(f"orders: order_pos[{k}]", orders[1][k]) for k in n_pos}
    splits = len(order_neg) if order_neg.ndim == 2 else None
    for name, o, n in [("order_neg", order_neg, n_neg),
                       *((f"order_pos[{k}]", order_pos[k], n_pos[k]) for k in n_pos)]:
        if o.ndim != 2 or o.shape != (splits, n):
            raise ValueError(f"orders: {name} has shape {o.shape}: need "
                             f"({splits or 'splits'}, {n}), one row per split")
        if np.any(np.sort(o, axis=1) != np.arange(n)):
            raise ValueError(f"orders: {name} has a row that is no order of the {n} trials: "
                             f"each row must be a permutation of 0..{n - 1}")
    return order_neg, order_pos


def eps_lb_resplits(scores_pos, scores_neg, alpha: float, delta: float = 0.0,
                    select_frac: float = 0.5, splits: int = 200, seed=0,
                    orders: tuple | None = None) -> np.ndarray:
    """The certified bound of an audit recomputed on ``splits`` random re-splits of the
    same trials: a diagnostic of how much the choice of selection trials moves it.

    The audit is that of the Jagielski audits' ``eps_lb``: for each k
    (``scores_pos = {k: D1 scores}``, ``scores_neg`` the D0 scores shared by every k),
    :func:`threshold_holdout_audit` of :func:`eps_lb_clopper_pearson` at
    ``alpha / len(ks)`` with ``delta`` and k (threshold chosen on ``select_frac`` of each
    side's trials, evaluated on the rest), the largest over k. Each re-split draws a new
    random order of each side's trials (one for D0, shared by every k, one per D1 side)
    from ``seed`` (an int >= 0 or a ``numpy.random.SeedSequence``); ``orders = (order_neg,
    {k: order_pos})``, arrays of shape ``(S, n)`` whose rows permute each side's trials,
    gives ``S`` of them instead (the identity order is the pre-registered split; ``splits``
    and ``seed`` are then unused). All splits are computed at once from tables of the bound
    at every count pair, so ``splits`` times the number of trials is at most 10**8 (about
    4 GB).

    Returns the ``splits`` values. Each one alone is a ``1 - alpha`` lower bound, but
    their spread, or a quantile or maximum over splits, is no bound at all (choosing the
    split after seeing its value voids the level): only a split fixed in advance
    certifies.
    """
    pos = _scores_by_k(scores_pos)
    neg = scores_array("scores_neg", scores_neg, 2)
    alpha, delta = _check_level("alpha", alpha), _check_delta(delta)
    select_frac = _check_level("select_frac", select_frac)
    for sp in pos.values():  # each k's split leaves trials to select and to evaluate
        split_trials(sp, neg, select_frac)
    splits = _check_k(splits, "splits")
    seed = _check_seed(seed)
    trials = len(neg) + sum(len(sp) for sp in pos.values())
    if orders is None:
        if splits * trials > _MAX_RESPLIT_ENTRIES:
            raise ValueError(f"splits={splits}: must be at most "
                             f"{_MAX_RESPLIT_ENTRIES // trials} for {trials} trials (every "
                             f"split's trial order is held in memory: splits x trials <= "
                             f"{_MAX_RESPLIT_ENTRIES:.0e})")
        rng = np.random.default_rng(seed)
        order_neg = _resplit_orders(len(neg), splits, rng)
        order_pos = {k: _resplit_orders(len(s), splits, rng) for k, s in pos.items()}
    else:
        order_neg, order_pos = _check_orders(orders, len(neg),
                                             {k: len(s) for k, s in pos.items()})
    level = alpha / len(pos)
    out = None
    for k, sp in pos.items():
        v = _resplit_one_k(sp, neg, order_pos[k], order_neg, select_frac, level, delta, k)
        out = v if out is None else np.maximum(out, v)
    return out
