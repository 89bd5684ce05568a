"""dpaudit.bounds refuses every bad argument by name, and still takes every valid edge value.

A fuzzer over the public functions (``bounds.__all__``): each function is called once per
(argument, bad value) with every other argument valid, and each such call must raise a
ValueError whose message names that argument before its first ": " and says what is allowed
("must" or "need"); returning a value, or any other exception (numpy's, brentq's, a
TypeError, a warning turned into an error), is a failure.  The bad values of an argument
come from its kind (a level, a delta, a count array, a score array, ...), which the
parameter's name selects in ``KIND`` (``KIND_OF`` where one function gives a name another
meaning: ``scores_pos`` as a mapping ``{k: scores}``); a function whose parameters all have
known names is covered without a word here (``DEFAULT`` gives each a valid value, ``VALID``
overrides them per function where they must agree), and one with a new name fails until it
is given a kind.  ``EXTRA`` adds values bad only beside the others (``ct > n``),
``ALLOWED`` exempts values one function accepts.  About 2,500 calls, 2 s.  ``EDGES``: valid
extremes (tiny levels, 2**53 trials, infinite scores, numpy scalar types, whole-float keys
and orders) must still give the right result.
"""

from __future__ import annotations

import importlib
import inspect
import math
import pkgutil
import re
import warnings
from fractions import Fraction

import numpy as np
import pytest
from scipy import special, stats

from dpaudit import bounds

NAN, INF = math.nan, math.inf


def _nan_bound(ct_pos, n_pos, ct_neg, n_neg, alpha):
    return np.full(np.shape(ct_pos), np.nan)


def _text_bound(ct_pos, n_pos, ct_neg, n_neg, alpha):
    return "eps"


def _none_bound(ct_pos, n_pos, ct_neg, n_neg, alpha):
    return None


def _shape_bound(ct_pos, n_pos, ct_neg, n_neg, alpha):
    return np.zeros(np.size(ct_pos) + 1)


def _arity_bound(ct_pos, n_pos, ct_neg, n_neg):
    return np.zeros(np.shape(ct_pos))


# ---- bad values by kind ----------------------------------------------------------------

#: Not a number at all, or a number of the wrong type (bool, complex, text).
NOT_NUMBERS = [None, "x", "1", b"1", 1 + 0j, 0.5j, True, np.bool_(False), {}, object]
#: A scalar argument given as an array.
NOT_SCALARS = [[0.5, 0.5], np.array([0.5]), np.full((1, 1), 0.5)]
LEVEL = [*NOT_NUMBERS, *NOT_SCALARS, NAN, INF, -INF, 0, 0.0, 1, 1.0, -0.1, 1.5, 1e300, -1e300]
DELTA = [*NOT_NUMBERS, *NOT_SCALARS, NAN, INF, -INF, -1e-9, -1, 1, 1.0, 2, 1e300]
NONNEG = [*NOT_NUMBERS, *NOT_SCALARS, NAN, -INF, -1e-300, -1.0]
#: Whole numbers in arrays (counts): anything but finite whole reals of a shape that broadcasts.
WHOLE_ARRAY = [*NOT_NUMBERS, NAN, INF, -INF, 1.5, 1e30, 2**80, -(2**80), [], [1.5, 2],
               [NAN, 1], np.array([1 + 0j, 2]), ["1", "2"], [True, False], [None, 1],
               np.array([1, "a"], dtype=object), np.zeros(3, int), [[1, 2, 3], [4, 5, 6]]]
COUNT = [*WHOLE_ARRAY, -1]
TOTAL = [*WHOLE_ARRAY, -1, 0]
#: One whole number >= 1.
POSITIVE_INT = [*NOT_NUMBERS, *NOT_SCALARS, NAN, INF, -INF, 0, -1, 1.5, 1e30, 2**80,
                np.int64(0)]
SCORES = [None, "x", "12", b"1", 1 + 0j, True, {}, object, [], 5.0, [NAN, 1.0, 2.0],
          [1.0, "a", 2.0], ["1", "2", "3"], [1 + 0j, 2 + 0j, 3 + 0j], np.array([1 + 1j, 2, 3]),
          [True, False, True], np.array([True, False, True]), [[1.0, 2.0], [3.0, 4.0]],
          [None, 1.0, 2.0], np.array(["a", "b", "c"])]

#: A mapping {k: scores} of the D1 sides (valid: ``BY_K``): not a mapping, empty, a key that
#: is no whole number >= 1, or bad scores under a key.
BY_K = {1: [1.0, 2.0, 3.0, 4.0], 2: [2.0, 3.0, 4.0, 5.0]}
SCORES_BY_K = [*SCORES, [BY_K[1], BY_K[2]], list(BY_K.items()), np.array([BY_K[1]]),
               *({key: BY_K[1]} for key in (0, -1, np.int64(0), 1.5, NAN, INF, 2**80, "1",
                                             b"1", None, True, np.bool_(True), 1 + 0j, (1,))),
               *({1: bad} for bad in [*SCORES, [1.0]]), {1: BY_K[1], 2: [NAN, 1.0, 2.0]}]
#: How many re-splits to draw: a whole number >= 1, and not so many they cannot be held.
SPLITS = [*POSITIVE_INT, -5, 10**12, 2**53]
#: A seed that draws the same every time: an int >= 0 or a SeedSequence (default_rng takes
#: None, booleans and Generators too, but those are not reproducible or not a seed).
SEED = [*NOT_NUMBERS, *NOT_SCALARS, NAN, INF, -INF, 1.5, 2.0, -1, np.int64(-1), -(2**80),
        [1, 2], [-1], np.array([1, 2]), np.array(3), np.random.default_rng(0),
        np.random.PCG64(0)]
#: Re-split orders (order_neg, {k: order_pos}) for BY_K and 4 negative trials: each an
#: integer array (splits, 4) whose rows permute range(4), the same splits and ks throughout.
_I, _BY_K_ORDERS = np.arange(4)[None], {1: np.arange(4)[None], 2: np.arange(4)[None]}
ORDERS = ["x", 1, NAN, True, [], (), (_I,), (_I, _BY_K_ORDERS, _I), {0: _I, 1: _BY_K_ORDERS},
          (_I, [_I, _I]), (_I, None), (_I, {1: _I}), (_I, {1: _I, 2: _I, 4: _I}),
          (_I, {"1": _I, "2": _I}), (_I, {0: _I, 1: _I}),
          *((bad, _BY_K_ORDERS) for bad in [
              None, "x", [], np.arange(4), _I[None], np.arange(5)[None], _I[:, :3],
              np.zeros((0, 4), int), np.zeros((1, 4), int), _I + 1, [[0, 1, 2, -1]], _I + 0.5,
              [[0.0, 1.0, 2.0, NAN]], _I.astype(str), _I.astype(bool), _I + 0j,
              [[0, 1, 2, 3], [0, 1, 2]], [[0, 1, 2, 3 + 2**80]]]),
          *((_I, {1: _I, 2: bad}) for bad in [
              None, "x", np.arange(4), np.zeros((1, 4), int), np.tile(_I, (2, 1)),
              [[3, 2, 1, 1]], _I + 0.5])]

KIND = {
    "alpha": LEVEL, "beta": LEVEL, "max_fpr": LEVEL, "select_frac": LEVEL,
    "select_alpha": LEVEL, "splits": SPLITS, "boots": SPLITS, "seed": SEED, "orders": ORDERS,
    "delta": DELTA, "mu": NONNEG, "eps": NONNEG,
    "ct": COUNT, "ct_pos": COUNT, "ct_neg": COUNT, "v": COUNT, "r": COUNT,
    "n": TOTAL, "n_pos": TOTAL, "n_neg": TOTAL, "m": TOTAL,
    "k": POSITIVE_INT, "k_max": POSITIVE_INT, "size": POSITIVE_INT, "runs": POSITIVE_INT,
    "min_size": [*NOT_NUMBERS, *NOT_SCALARS, NAN, INF, -1, 1.5, 2**80],
    "scores_pos": SCORES + [[1.0]], "scores_neg": SCORES + [[1.0]], "val_pos": SCORES,
    "val_neg": SCORES, "eval_pos": SCORES, "eval_neg": SCORES,
    "scores": [None, "x", {}, object, 1.0, [1.0], [3.0, 2.0, NAN, 0.0], ["3", "2", "1", "0"],
               [3 + 0j, 2, 1, 0], [True, False, True, False], np.array([3, 2, 1, 0], "S1"),
               [[3.0, 2.0, 1.0, 0.0], [1.0, 2.0]]],
    "included": [None, "x", {}, 1, [1, 0, 1], [[1, 0, 1, 0]], [1, NAN, 1, 0], [1, 2, 1, 0],
                 [-1, 0, 1, 1], ["a", "b", "a", "b"], ["1", "0", "1", "0"],
                 np.array([1 + 0j, 0, 1, 0]), [1.0, 0.0, 1.0, 0.5], [None, 1, 0, 1]],
    "correct": [None, "x", {}, object, 5, [], np.zeros((3, 0)), [2, 4, 5, 7, 11],
                [-1, 4, 5, 7, 9], [2, 4, 5.5, 7, 9], [2, 4, NAN, 7, 9],
                np.array([2, 4, 5, 7, 9]) + 0j, [True] * 5, ["2", "4", "5", "7", "9"],
                [2, 4, 5, 7, 2**80]],
    "ks": ["x", {}, object, 1 + 0j, [], [0], [6], [2, 1], [2, 2], [[1, 2]], [1.5], [NAN],
           np.array([1 + 0j]), [True], 3, [2**80]],
    "bound": [None, "eps_lb_clopper_pearson", 1.0, [bounds.eps_lb_clopper_pearson],
              _nan_bound, _text_bound, _none_bound, _shape_bound, _arity_bound],
    "ties": [None, "last", "", 1, True, ["first"], np.array(["first"]), ("first",)],
    "name": [None, "", 1, b"scores", ["scores"]],
    "epsilons": [*NOT_NUMBERS, 1.0, np.array(1.0), [], [NAN, 1.0], [0.0, INF], [[0.0, 1.0]],
                 ["0", "1"], [1 + 0j, 2]],
    "deltas": [*NOT_NUMBERS, 0.5, [], [0.5], [0.5, 0.1, 0.0], [NAN, 0.1], [-0.1, 0.1],
               [0.5, 1.5], [[0.5, 0.1]], ["0.5", "0.1"]],
    "level": LEVEL,
    "n_opt": [*NOT_NUMBERS, *NOT_SCALARS, NAN, INF, -INF, 0, 0.5, -1],
    "hits": [None, "x", {}, object, [], 1, [0, 2], [0.5, 1], [NAN, 1], [-1, 0], ["1", "0"],
             [1 + 0j, 0], [[1, 0], [1]], np.array([1, "a"], dtype=object)],
    "tpr_lo": [*NOT_NUMBERS, NAN, INF, -0.1, 1.5, [], [0.5, NAN], [0.5, 2.0], ["0.5"]],
    "fpr_hi": [*NOT_NUMBERS, NAN, INF, -0.1, 1.5, [], [0.5, NAN], [0.5, 2.0], ["0.5"],
               np.zeros(3)],
}

#: The kind of a parameter whose name means something else in one function.
KIND_OF = {(f, "scores_pos"): SCORES_BY_K
           for f in ("eps_lb_paper_rule", "eps_lb_resplits", "paper_rule_bootstrap")}

#: A valid value of each parameter name (functions whose arguments must agree override it).
DEFAULT = {
    "alpha": 0.05, "beta": 0.05, "max_fpr": 0.25, "select_frac": 0.5, "delta": 1e-5,
    "mu": 1.0, "eps": 1.0, "ct": [3, 0], "n": [10, 10], "ct_pos": [9, 5], "n_pos": 10,
    "ct_neg": [1, 2], "n_neg": 10, "k": 2, "m": 100, "r": [10, 20], "v": [9, 15],
    "k_max": 50, "size": 10, "min_size": 1, "name": "scores", "runs": 10,
    "scores_pos": [1.0, 2.0, 3.0, 4.0], "scores_neg": [0.0, 1.0, 2.0, 0.5],
    "val_pos": [1.0, 2.0, 3.0], "val_neg": [0.0, 1.0, 0.5],
    "eval_pos": [1.5, 2.5, 3.5], "eval_neg": [0.2, 0.7, 2.0],
    "bound": bounds.eps_lb_clopper_pearson, "ties": "first", "scores": [3.0, 2.0, 1.0, 0.0],
    "included": [1, 0, 1, 0], "correct": [2, 4, 5, 7, 9], "ks": None,
    "select_alpha": 0.05, "splits": 3, "boots": 3, "seed": 0, "orders": None,
    "epsilons": [0.0, 1.0], "deltas": [0.5, 0.1],
    "level": 0.05, "n_opt": 100, "hits": [1, 0, 1, 1], "tpr_lo": [0.9, 0.5], "fpr_hi": 0.1,
}
VALID = {
    "mu_lb_one_run_gdp": dict(r=10, v=9), "eps_lb_one_run_fdp": dict(r=10, v=9),
    "guess_counts": dict(k_max=2), "one_run_sweep": dict(m=20),
    "scores_array": dict(scores=[0.5, 1.0]),
    "eps_lb_paper_rule": dict(scores_pos=BY_K), "eps_lb_resplits": dict(scores_pos=BY_K),
    "paper_rule_bootstrap": dict(scores_pos=BY_K),
    "claim_p_value": dict(ct_pos=9, ct_neg=1),
}
#: Bad only in relation to the other (valid) arguments: still the named argument's fault.
EXTRA = {
    ("clopper_pearson", "ct"): [11, [3, 11]], ("clopper_pearson", "n"): [[10, 10, 10]],
    **{(f, "ct_pos"): [[11, 5]] for f in ("eps_lb_clopper_pearson", "eps_lb_katz",
                                          "eps_lb_bayes", "mu_lb_gdp")},
    **{(f, "ct_neg"): [11] for f in ("eps_lb_clopper_pearson", "eps_lb_katz",
                                     "eps_lb_bayes", "mu_lb_gdp")},
    ("eps_lb_one_run", "r"): [101], ("eps_lb_one_run", "v"): [[11, 15]],
    ("mu_lb_one_run_gdp", "r"): [101, [10, 10]], ("mu_lb_one_run_gdp", "v"): [11, [9, 9]],
    ("mu_lb_one_run_gdp", "m"): [[100, 100]],
    ("eps_lb_one_run_fdp", "r"): [101, [10, 10]], ("eps_lb_one_run_fdp", "v"): [11, [9, 9]],
    ("eps_lb_one_run_fdp", "m"): [[100, 100]],
    ("eps_lb_hoeffding", "r"): [0], ("eps_lb_hoeffding", "v"): [[11, 15]],
    ("eps_from_mu", "delta"): [0, 0.0],
    ("one_run_sweep", "m"): [9, [20, 20]],
    ("guess_counts", "k_max"): [3],
    ("guess_grid", "size"): [10**12, 2**53],  # a grid too large to hold in memory
    ("scores_array", "scores"): SCORES,
    ("split_trials", "select_frac"): [0.1],  # no selection trial of 4
    ("threshold_split_audit", "select_frac"): [0.1],
    ("eps_lb_paper_rule", "select_frac"): [0.1], ("eps_lb_resplits", "select_frac"): [0.1],
    ("paper_rule_bootstrap", "select_frac"): [0.1],
}
#: Values of a kind that are valid for this function.
ALLOWED = {
    ("eps_gdp_estimate", "mu"): [-INF, -1e-300, -1.0],  # a lower bound below 0 certifies nothing
    ("scores_array", "scores"): [[1.0]],  # min_size=1
}
#: Separable trials in exchangeable order: 20 of 40 choose a threshold, 20 evaluate it.
_SEP_POS, _SEP_NEG = 100.0 + np.arange(40) % 20, np.arange(40.0) % 20
#: The reference code's value of a perfect split of 20 evaluation trials per side (its
#: two-sided Clopper-Pearson interval at 0.99): ln(lo / (1 - lo)), lo = 0.005^(1/20).
_SEP_PAPER = math.log(0.005 ** (1 / 20) / (1 - 0.005 ** (1 / 20)))

#: Accepted values whose result the fuzzer checks: valid edges of every kind.
EDGES = [
    (lambda: bounds.clopper_pearson(0, 1, 1e-300), lambda lo_hi: lo_hi == (0.0, 1.0)),
    (lambda: bounds.clopper_pearson(np.int8(3), np.uint16(10), np.float32(0.05)),
     lambda lo_hi: np.allclose(lo_hi, stats.binomtest(3, 10).proportion_ci(0.95, "exact"))),
    (lambda: bounds.clopper_pearson(3.0, 10.0, np.array(0.05)), lambda lo_hi: 0 < lo_hi[0]),
    (lambda: bounds.eps_lb_clopper_pearson(10, 10, 0, 10, 1 - 1e-12, np.nextafter(1, 0), 1),
     lambda e: e == 0.0),
    (lambda: bounds.eps_lb_clopper_pearson(1000, 1000, 0, 1000, 0.05, 0, np.int64(2**53)),
     lambda e: 0 <= e < 1e-14),
    (lambda: bounds.eps_lb_clopper_pearson(np.array([[9], [8]]), 10, [1, 2], 10),
     lambda e: e.shape == (2, 2)),
    (lambda: bounds.eps_lb_katz(0, 1, 0, 1, 1e-300), lambda e: e == 0.0),
    (lambda: bounds.eps_lb_bayes(2**40, 2**40, 0, 2**40, 0.05), lambda e: e > 10),
    (lambda: bounds.mu_lb_gdp(2**52, 2**53, 0, 2**53, 1e-12), lambda mu: mu > 7),
    (lambda: bounds.eps_from_mu(INF, 1e-5), lambda e: e == INF),
    (lambda: bounds.eps_from_mu(1e300, 0.5), lambda e: e == INF),  # beyond floating point
    (lambda: bounds.eps_from_mu(0, 1e-300), lambda e: e == 0.0),
    (lambda: bounds.eps_from_mu(1e-300, 1e-300), lambda e: e == 0.0),
    (lambda: bounds.eps_from_mu(np.float32(1), np.array(1e-5)),
     lambda e: e == pytest.approx(bounds.eps_from_mu(1.0, 1e-5))),
    (lambda: bounds.eps_gdp_estimate(-1.0, 0.5), lambda e: e == 0.0),
    (lambda: bounds.eps_gdp_estimate(0.0, 0.0), lambda e: e == 0.0),
    (lambda: bounds.eps_gdp_estimate(1.0, 0), lambda e: e == INF),
    (lambda: bounds.eps_gdp_estimate(INF, 0.5), lambda e: e == INF),
    (lambda: bounds.delta_from_mu(1e-300, 1.0), lambda d: d == 0.0),
    (lambda: bounds.delta_from_mu(1.0, 1e300), lambda d: d == 0.0),
    (lambda: bounds.delta_from_mu(1.0, INF), lambda d: d == 0.0),
    (lambda: bounds.delta_from_mu(INF, 1.0), lambda d: d == 1.0),
    (lambda: bounds.delta_from_mu(1e300, 1e300), lambda d: d == 1.0),
    (lambda: bounds.delta_from_mu(np.float16(1), np.int64(0)),
     lambda d: d == pytest.approx(special.erf(0.5 / math.sqrt(2)), rel=1e-15)),
    (lambda: bounds.eps_lb_one_run(1, 0, 0, 0.0, 1 - 1e-12), lambda e: e == 0.0),
    (lambda: bounds.eps_lb_one_run(2**40, 2**40, 2**40, 0.0), lambda e: e > 25),
    (lambda: bounds.mu_lb_one_run_gdp(np.int16(10), 10.0, 0), lambda mu: mu == 0.0),
    (lambda: bounds.eps_lb_one_run_fdp(1, 1, 1, 0.0, 0.999), lambda e: e > 0),
    (lambda: bounds.eps_lb_hoeffding(1, [0, 1], 1 - 1e-9), lambda e: e.shape == (2,)),
    (lambda: bounds.scores_array("scores", [], 0), lambda a: a.size == 0),
    (lambda: bounds.scores_array("scores", [INF, -INF, 2]), lambda a: a.size == 3),
    (lambda: bounds.scores_array("scores", np.arange(3, dtype=np.int8)),
     lambda a: a.dtype == float),
    (lambda: bounds.tpr_at_fpr([1, 2], [0, 3], 1 - 1e-12), lambda t: t == 1.0),
    (lambda: bounds.auc([INF, INF], [-INF, 0]), lambda a: a == 1.0),
    (lambda: bounds.threshold_scan_audit([5, 5], [5, 5], bounds.mu_lb_gdp, 0.999),
     lambda res: res.value == 0.0),
    (lambda: bounds.threshold_holdout_audit([1.0], [0.0], [1.0], [0.0],
                                            bounds.eps_lb_clopper_pearson, 0.5, "youden"),
     lambda res: res.value == 0.0),
    (lambda: bounds.split_trials([1, 2], [3, 4], np.nextafter(0.5, 1)),
     lambda parts: [len(p) for p in parts] == [1, 1, 1, 1]),
    (lambda: bounds.threshold_split_audit([1, 2], [3, 4], bounds.eps_lb_clopper_pearson,
                                          0.05, 0.5), lambda res: res.value == 0.0),
    (lambda: bounds.guess_grid(1, 1 - 1e-9, 1), lambda g: list(g) == [1]),
    (lambda: bounds.guess_grid(2**53, 1e-300, 100), lambda g: g[-1] == 2**53),
    (lambda: bounds.guess_grid(50, 0.05, 10**6), lambda g: list(g) == list(range(13, 51))),
    (lambda: bounds.split_trials([1, 2], [3, 4], Fraction(1, 2)),
     lambda parts: [len(p) for p in parts] == [1, 1, 1, 1]),
    (lambda: bounds.guess_counts([[1.0, 0.0], [0.0, 1.0]], [True, False], 1),
     lambda c: c.tolist() == [[2], [0]]),
    (lambda: bounds.guess_counts([INF, -INF, 0, 0], [1, -1, 1, -1], 2),
     lambda c: c.tolist() == [2, 4]),
    (lambda: bounds.one_run_sweep(2, [2], 0.0, 0.05), lambda res: res["eps_lb"] == 0.0),
    (lambda: bounds.one_run_sweep(20, [[2, 4, 5, 7, 9], [0, 0, 0, 0, 0]], 1e-5, ks=[5]),
     lambda res: res["eps_lb"].shape == (2,) and res["eps_lb"][1] == 0.0),
    (lambda: bounds.eps_lb_paper_rule({np.int64(1): _SEP_POS, 2.0: _SEP_POS}, _SEP_NEG),
     lambda res: [type(k) for k in res.per_k] == [int, int]
     and res.per_k == pytest.approx({1: _SEP_PAPER, 2: _SEP_PAPER / 2}, rel=1e-12)),
    (lambda: bounds.eps_lb_resplits({1: [0.0, 1.0]}, [0.0, 1.0], 0.5, splits=1),
     lambda v: v.tolist() == [0.0]),
    (lambda: bounds.eps_lb_resplits({1: _SEP_POS}, _SEP_NEG, 0.05, orders=(
        [np.arange(40.0).tolist()], {1.0: [np.arange(40.0).tolist()]})),
     lambda v: v == pytest.approx([bounds.eps_lb_clopper_pearson(20, 20, 0, 20, 0.05)])),
    (lambda: bounds.eps_lb_resplits({1: _SEP_POS}, _SEP_NEG, 0.05, 1e-5, np.float32(0.5),
                                    np.int64(4), np.uint64(3)),
     lambda v: v.tolist() == bounds.eps_lb_resplits({1: _SEP_POS}, _SEP_NEG, 0.05, 1e-5,
                                                    0.5, 4, 3).tolist()),
]


def _is_function(obj) -> bool:  # functions, also wrapped ones (lru_cache, partial); no classes
    return callable(obj) and not isinstance(obj, type)


FUNCTIONS = [name for name in bounds.__all__ if _is_function(getattr(bounds, name))]


def _kind(name: str, p: str) -> list | None:
    """The bad values of ``bounds.<name>``'s argument ``p`` (None if it has no kind)."""
    return KIND_OF.get((name, p), KIND.get(p))


def _untabled(name: str) -> str | None:
    """Why ``bounds.<name>`` cannot be fuzzed yet (an argument of unknown kind), or None."""
    for p in inspect.signature(getattr(bounds, name)).parameters:
        if _kind(name, p) is None or not (p in DEFAULT or p in VALID.get(name, {})):
            return (f"bounds.{name}'s argument {p!r} has no kind: add its bad values to KIND "
                    f"and a valid value to DEFAULT (or VALID[{name!r}]) in {__file__}")
    return None


def _valid_call(name: str) -> dict:
    params = inspect.signature(getattr(bounds, name)).parameters
    return {p: VALID.get(name, {}).get(p, DEFAULT.get(p)) for p in params}


def _bad_calls(name: str):
    """(argument, bad value, keyword arguments) of every bad call of ``bounds.<name>``."""
    valid = _valid_call(name)
    for p in valid:
        allowed = ALLOWED.get((name, p), [])
        for bad in _kind(name, p) + EXTRA.get((name, p), []):
            if not any(bad is a or (type(bad) is type(a) and bad == a) for a in allowed):
                yield p, bad, {**valid, p: bad}


def _names(message: str, argument: str) -> bool:
    head = message.split(": ", 1)[0]
    return bool(re.search(rf"(?<!\w){re.escape(argument)}(?!\w)", head)
                and re.search(r"\b(must|need)\b", message))


def _outcome(name: str, argument: str, kwargs: dict) -> str | None:
    """None if the call is refused as it should be, else what went wrong."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning means it computed with the bad value
        try:
            result = getattr(bounds, name)(**kwargs)
        except ValueError as exc:
            return None if _names(str(exc), argument) else f"ValueError: {exc}"
        except Exception as exc:  # noqa: BLE001 - every other exception is the failure
            return f"{type(exc).__name__}: {exc}"
    return f"returned {result!r}"


def test_every_public_function_has_an_argument_table():
    """Every public function defined in the package's modules is in ``bounds.__all__`` (so
    fuzzed), and every function there is defined in one of them."""
    modules = [importlib.import_module(f"{bounds.__name__}.{info.name}")
               for info in pkgutil.iter_modules(bounds.__path__)]
    defined = {name for module in modules for name, f in inspect.getmembers(module, _is_function)
               if getattr(f, "__module__", None) == module.__name__ and not name.startswith("_")}
    assert defined == set(FUNCTIONS), (f"not in bounds.__all__: {defined - set(FUNCTIONS)}; "
                                       f"not defined in the package: {set(FUNCTIONS) - defined}")
    missing = [why for name in FUNCTIONS if (why := _untabled(name))]
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("name", FUNCTIONS)
def test_every_bad_argument_is_refused_by_name(name):
    if why := _untabled(name):
        pytest.fail(why)
    try:  # the valid call the bad ones start from must itself work
        getattr(bounds, name)(**_valid_call(name))
    except Exception as exc:  # noqa: BLE001
        pytest.fail(f"the valid call bounds.{name}(**{_valid_call(name)}) raised {exc!r}: "
                    f"give it valid arguments in VALID")
    calls = list(_bad_calls(name))
    failures = [f"  {p}={bad!r}: {why}" for p, bad, kwargs in calls
                if (why := _outcome(name, p, kwargs)) is not None]
    assert not failures, (f"{len(failures)} of {len(calls)} bad calls of bounds.{name} were "
                          f"not refused with a ValueError naming the argument:\n"
                          + "\n".join(failures))


@pytest.mark.parametrize("call,check", EDGES, ids=[str(i) for i in range(len(EDGES))])
def test_valid_edge_values_still_work(call, check):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check(call())
