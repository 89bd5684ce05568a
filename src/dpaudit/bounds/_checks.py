"""Argument checks shared by every public function of :mod:`dpaudit.bounds`.

Every public function checks each argument first: a bad one (a NaN, a boolean, text, a
complex number, an out-of-range level, a count that is not whole, a shape that does not
broadcast) raises a ValueError that names it and says what is allowed, never a result
computed from it (``tests/test_bounds_fuzz.py`` calls each with such values).  The
counting functions broadcast over array arguments and return a float for scalar input
(:func:`_scalar_or_array`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Callable

import numpy as np


def _scalar_or_array(x: np.ndarray):
    return float(x) if np.ndim(x) == 0 else x


#: Largest whole number accepted as a count: beyond it floats skip integers and int64 nears
#: its end, so a count of 1e30 would silently become another number.
_MAX_WHOLE = 2**53


def _real(name: str, value, allowed: str = "be real numbers") -> np.ndarray:
    """``value`` as an array of real numbers (integer or float dtype); a ValueError naming
    the argument for anything else: None, text, bytes, booleans, complex numbers (numpy
    would cast text to numbers and complex to its real part), objects, ragged nesting."""
    try:
        a = np.asarray(value)
        if a.dtype == object and all(isinstance(x, (int, float, np.integer, np.floating))
                                     and not isinstance(x, bool) for x in a.ravel()):
            a = a.astype(float)  # Python ints beyond int64 (the size check refuses them)
    except (TypeError, ValueError):
        a = np.asarray(None)
    if a.dtype.kind not in "iuf":
        raise ValueError(f"{name}={value!r}: must {allowed}")
    return a


def _whole(name: str, value) -> np.ndarray:
    """``value`` as int64 if every entry is a finite whole number of at most 2**53 in size;
    else a ValueError naming the argument (NaN, infinities, 75.5, 1e30, booleans, complex
    numbers, strings and empty arrays are refused)."""
    a = _real(name, value, "be a whole number")
    if a.size == 0:
        raise ValueError(f"{name} is empty: must hold at least one whole number")
    if not np.all(np.isfinite(a)) or np.any(a != np.round(a)) or np.any(
            np.abs(a) > _MAX_WHOLE):
        raise ValueError(f"{name}={value!r}: must be a finite whole number (at most 2**53)")
    return a.astype(np.int64)


def _broadcast(**arrays) -> list[np.ndarray]:
    """The arrays broadcast together; a ValueError naming the arguments whose shapes clash."""
    try:
        return np.broadcast_arrays(*arrays.values())
    except ValueError:
        shaped = [f"{name} {np.shape(a)}" for name, a in arrays.items() if np.ndim(a)]
        raise ValueError(f"{' and '.join(shaped)}: must broadcast to one shape") from None


def _check_counts(ct_pos, n_pos, ct_neg, n_neg):
    ct_pos, n_pos, ct_neg, n_neg = (_whole(name, a) for name, a in
                                    zip(("ct_pos", "n_pos", "ct_neg", "n_neg"),
                                        (ct_pos, n_pos, ct_neg, n_neg)))
    _broadcast(ct_pos=ct_pos, n_pos=n_pos, ct_neg=ct_neg, n_neg=n_neg)
    for ct, n, side in ((ct_pos, n_pos, "pos"), (ct_neg, n_neg, "neg")):
        if np.any(n < 1):
            raise ValueError(f"n_{side}={n!r}: must be >= 1")
        if np.any((ct < 0) | (ct > n)):
            raise ValueError(f"ct_{side}={ct!r}: must satisfy 0 <= ct_{side} <= n_{side}")
    return ct_pos, n_pos, ct_neg, n_neg


def _check_rate_bounds(tpr_lo, fpr_hi) -> tuple[np.ndarray, np.ndarray]:
    """A lower bound on the TPR and an upper bound on the FPR as float arrays of one
    broadcast shape, every entry in [0, 1]."""
    out = []
    for name, value in (("tpr_lo", tpr_lo), ("fpr_hi", fpr_hi)):
        a = _real(name, value, "be rates in [0, 1]")
        if a.size == 0 or not np.all((a >= 0) & (a <= 1)):
            raise ValueError(f"{name}={value!r}: must be a non-empty array of rates in [0, 1]")
        out.append(a.astype(float))
    return tuple(_broadcast(tpr_lo=out[0], fpr_hi=out[1]))


def _check_k(k, name: str = "k", low: int = 1) -> int:
    """A single whole number >= ``low`` (``k`` the number of inserted canaries, ``k_max``,
    a grid size, ...)."""
    a = _whole(name, k)
    if a.ndim or a < low:
        raise ValueError(f"{name}={k!r}: must be a single whole number >= {low}")
    return int(a)


def _number(name: str, value, allowed: str = "be a number",
            ok: Callable[[float], bool] = lambda x: not math.isnan(x)) -> float:
    """``value`` as a float if it is one real number (a 0-d array counts) with ``ok(value)``;
    else a ValueError ``"<name>=<value>: must <allowed>"``."""
    x = value[()] if isinstance(value, np.ndarray) and value.ndim == 0 else value
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real):
        raise ValueError(f"{name}={value!r}: must {allowed}")
    try:
        x = float(x)
    except OverflowError:  # a Python int beyond floating point
        x = math.copysign(math.inf, x)
    if not ok(x):
        raise ValueError(f"{name}={value!r}: must {allowed}")
    return x


def _check_delta(delta: float) -> float:
    return _number("delta", delta, "lie in [0, 1)", lambda x: 0.0 <= x < 1.0)


def _check_level(name: str, value: float) -> float:
    return _number(name, value, "lie strictly between 0 and 1", lambda x: 0.0 < x < 1.0)


def scores_array(name: str, scores, min_size: int = 1) -> np.ndarray:
    """``scores``, one-dimensional real numbers, as a float array; a ValueError naming
    ``name`` (the argument's name in messages) if it has fewer than ``min_size`` entries, a
    NaN (infinite scores order like any other), or is not such an array (text, booleans and
    complex numbers are refused, not converted)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name={name!r}: must be a non-empty string (the scores' name in "
                         f"messages)")
    min_size = _check_k(min_size, "min_size", low=0)
    a = _real(name, scores, "be a one-dimensional array of real numbers")
    if a.ndim != 1:
        raise ValueError(f"{name} has shape {a.shape}: must be one-dimensional (one score "
                         f"per trial)")
    a = a.astype(float)
    if a.size < min_size:
        raise ValueError(f"{name} has {a.size} scores: need at least {min_size}")
    if np.isnan(a).any():
        raise ValueError(f"{name} has {int(np.isnan(a).sum())} NaN scores (of {a.size}): "
                         f"need numbers (infinities are fine)")
    return a


def _as_scores(scores_pos, scores_neg):
    return scores_array("scores_pos", scores_pos, 2), scores_array("scores_neg", scores_neg, 2)


def _scores_by_k(scores_pos) -> dict[int, np.ndarray]:
    """``{k: scores}`` of the D1 sides, each k a whole number >= 1 (sorted), scores in trial
    order (at least 2 each); a ValueError names a bad k or score array."""
    if not isinstance(scores_pos, Mapping) or not scores_pos:
        raise ValueError(f"scores_pos={type(scores_pos).__name__}: must be a non-empty "
                         f"mapping {{k: scores of the D1 side with k canaries}}")
    out = {_check_k(k, "scores_pos key k"): scores_array(f"scores_pos[{k!r}]", s, 2)
           for k, s in scores_pos.items()}
    return dict(sorted(out.items()))


def _one_run_counts(m, r, v):
    """m, r, v of a one-run audit as int64 arrays: whole numbers with 0 <= v <= r <= m, m >= 1."""
    given = m, r, v
    m, r, v = _whole("m", m), _whole("r", r), _whole("v", v)
    _broadcast(m=m, r=r, v=v)
    if np.any(m < 1):
        raise ValueError(f"m={given[0]!r}: must be >= 1 (the number of canaries)")
    if np.any(r < 0) or np.any(r > m):
        raise ValueError(f"r={given[1]!r}: must satisfy 0 <= r <= m (m={given[0]!r})")
    if np.any(v < 0) or np.any(v > r):
        raise ValueError(f"v={given[2]!r}: must satisfy 0 <= v <= r (r={given[1]!r})")
    return m, r, v
