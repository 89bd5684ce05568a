"""The reference code's Table 2 procedure (bounds.eps_lb_paper_rule) and the re-split
diagnostic (bounds.eps_lb_resplits), against independent re-implementations."""

import math

import numpy as np
import pytest
from scipy import stats

from dpaudit import bounds


# ---- an independent re-implementation of the reference's numpy code ([JUO20],
# bkd_parser.py: bkd_find_thresh with use_dkw=True, bkd_get_eps with Clopper-Pearson at .01),
# a loop over thresholds as written there.

def _ref_cp(count, trials, conf):
    q = count / trials
    lo = stats.beta.ppf(conf / 2.0, count, trials - count + 1)
    hi = stats.beta.isf(conf / 2.0, count + 1, trials - count)
    return (lo if q != 0 else 0), (hi if q != 1 else 1)


def _ref_find_thresh(nobkd, bkd):
    all_threshs = np.unique(np.concatenate((nobkd, bkd)).ravel())
    best = -np.inf, all_threshs[0]
    for thresh in all_threshs:
        nobkd_p = (nobkd >= thresh).sum() / nobkd.shape[0]
        bkd_p = (bkd >= thresh).sum() / bkd.shape[0]
        nobkd_ub = nobkd_p + np.sqrt(np.log(2 / .05) / nobkd.shape[0])
        bkd_lb = bkd_p - np.sqrt(np.log(2 / .05) / bkd.shape[0])
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = (1 - nobkd_ub) / (1 - bkd_lb) if nobkd_ub + bkd_lb > 1 else bkd_lb / nobkd_ub
            eps = np.log(ratio)
        if best[0] < eps:
            best = eps, thresh
    return best[1]


def _ref_get_eps(nobkd, bkd, thresh, k):
    bkd_ct, nobkd_ct = (bkd >= thresh).sum(), (nobkd >= thresh).sum()
    _, nobkd_ub = _ref_cp(nobkd_ct, nobkd.shape[0], .01)
    bkd_lb, _ = _ref_cp(bkd_ct, bkd.shape[0], .01)
    with np.errstate(divide="ignore"):
        ratio = (1 - nobkd_ub) / (1 - bkd_lb) if nobkd_ub + bkd_lb > 1 else bkd_lb / nobkd_ub
        return np.log(ratio) / k


def _synthetic(rng, n, shifts, decimals=None):
    neg = rng.normal(size=n)
    pos = {k: rng.normal(size=n) + s for k, s in shifts.items()}
    if decimals is not None:  # ties within and across sides
        neg, pos = neg.round(decimals), {k: v.round(decimals) for k, v in pos.items()}
    return pos, neg


@pytest.mark.parametrize("seed,n,shifts,decimals", [
    (0, 400, {1: 0.3, 2: 1.0, 4: 2.5, 8: 6.0}, None),
    (1, 120, {1: 0.0, 4: -1.0}, 1),          # nothing to find: values floored at 0
    (2, 200, {2: 2.0, 8: 3.0}, 0),           # heavy ties
    (3, 1000, {1: 0.5, 2: 0.8, 4: 1.5, 8: 2.0}, 2),
])
def test_paper_rule_is_the_reference_code(seed, n, shifts, decimals):
    pos, neg = _synthetic(np.random.default_rng(seed), n, shifts, decimals)
    got = bounds.eps_lb_paper_rule(pos, neg)
    h = n // 2
    want = {}
    for k, p in pos.items():
        t = _ref_find_thresh(neg[:h], p[:h])
        assert got.thresholds[k] == t
        want[k] = max(_ref_get_eps(neg[h:], p[h:], t, k), 0.0)
        assert got.per_k[k] == pytest.approx(want[k], rel=1e-9, abs=1e-12)
        ct_pos, n_pos, ct_neg, n_neg = got.counts[k]
        assert (ct_pos, ct_neg) == ((p[h:] >= t).sum(), (neg[h:] >= t).sum())
        assert n_pos == n_neg == n - h
    assert got.value == pytest.approx(max(want.values()), rel=1e-9, abs=1e-12)
    assert got.per_k[got.best_k] == got.value


def test_paper_rule_complementary_branch_low_scores_and_a_perfect_attack():
    """Every D1 score high, half the D0 scores as high: the reference's branch
    ub + lb > 1, ratio (1 - p0_hi) / (1 - p1_lo) (TNR over FNR). D1 scores below D0's: the
    reference's value is negative, here 0. A perfect attack at k = 1 with 500 evaluation
    trials per side gives the reference's ceiling ln(p1_lo / p0_hi) = 4.54, Table 2's value
    without noise."""
    rng = np.random.default_rng(5)
    pos = {1: rng.normal(3, 0.1, size=1000)}
    neg = np.where(rng.random(1000) < 0.5, rng.normal(3, 0.1, size=1000), rng.normal(size=1000))
    got = bounds.eps_lb_paper_rule(pos, neg)
    ct_pos, n_pos, ct_neg, n_neg = got.counts[1]
    assert ct_pos / n_pos + ct_neg / n_neg > 1
    t = _ref_find_thresh(neg[:500], pos[1][:500])
    assert got.value == pytest.approx(_ref_get_eps(neg[500:], pos[1][500:], t, 1), rel=1e-9)
    assert got.value > 2
    low = {1: rng.normal(size=1000)}, rng.normal(size=1000) + 3
    t = _ref_find_thresh(low[1][:500], low[0][1][:500])
    assert _ref_get_eps(low[1][500:], low[0][1][500:], t, 1) < 0
    assert bounds.eps_lb_paper_rule(*low).value == 0.0
    perfect = bounds.eps_lb_paper_rule({1: np.full(1000, 5.0)}, np.zeros(1000))
    lo = stats.binomtest(500, 500).proportion_ci(0.99, "exact").low
    assert perfect.value == pytest.approx(math.log(lo / (1 - lo)), rel=1e-9)
    assert round(perfect.value, 2) == 4.54


def test_each_paper_rule_value_is_sound_on_randomized_response():
    """Randomized response with the bit as the score is exactly eps-DP (pure): each per-k
    value at k = 1 must exceed eps in at most about alpha of the audits."""
    eps, T, sims = 1.0, 200, 300
    p = math.exp(eps) / (1 + math.exp(eps))
    rng = np.random.default_rng(6)
    values = np.array([bounds.eps_lb_paper_rule({1: (rng.random(T) < p).astype(float)},
                                                (rng.random(T) < 1 - p).astype(float)).value
                       for _ in range(sims)])
    assert (values > eps).sum() <= stats.binom.ppf(0.999, sims, bounds.PAPER_ALPHA)
    assert np.median(values) > 0.3 * eps  # not vacuous


def test_paper_rule_refuses_bad_arguments():
    neg = np.arange(10.0)
    with pytest.raises(ValueError, match="scores_pos"):
        bounds.eps_lb_paper_rule({}, neg)
    with pytest.raises(ValueError, match="scores_pos"):
        bounds.eps_lb_paper_rule([neg], neg)
    with pytest.raises(ValueError, match="k=0"):
        bounds.eps_lb_paper_rule({0: neg}, neg)
    with pytest.raises(ValueError, match="NaN"):
        bounds.eps_lb_paper_rule({1: neg}, np.r_[neg[:-1], np.nan])
    with pytest.raises(ValueError, match="select_alpha"):
        bounds.eps_lb_paper_rule({1: neg}, neg, select_alpha=1.5)
    with pytest.raises(ValueError, match="select_frac"):
        bounds.eps_lb_paper_rule({1: neg}, neg, select_frac=1.0)


# ---- re-splits ------------------------------------------------------------------------

def _direct(pos, neg, alpha, delta, order_neg, order_pos):
    """The certified bound of one split, by the audit's own path: each k's threshold by
    threshold_holdout_audit at alpha / len(ks) on the reordered trials, largest over k."""
    level = alpha / len(pos)
    out = 0.0
    for k, p in pos.items():
        cp = lambda *a, k=k: bounds.eps_lb_clopper_pearson(*a, delta, k)  # noqa: E731
        out = max(out, bounds.threshold_split_audit(p[order_pos[k]], neg[order_neg], cp,
                                                    level).value)
    return out


@pytest.mark.parametrize("decimals", [None, 1])
def test_resplits_are_the_audit_of_each_split(decimals):
    rng = np.random.default_rng(7)
    pos, neg = _synthetic(rng, 60, {1: 1.0, 2: 2.0, 4: 3.0}, decimals)
    if decimals is not None:
        neg[:3] = -np.inf  # infinite scores order like any other
    n = len(neg)
    ident = (np.arange(n)[None], {k: np.arange(n)[None] for k in pos})
    got = bounds.eps_lb_resplits(pos, neg, 0.05, 1e-5, orders=ident)
    assert got.shape == (1,)
    assert got[0] == pytest.approx(_direct(pos, neg, 0.05, 1e-5, np.arange(n),
                                           {k: np.arange(n) for k in pos}), rel=1e-9)
    orders = (np.array([rng.permutation(n) for _ in range(6)]),
              {k: np.array([rng.permutation(n) for _ in range(6)]) for k in pos})
    got = bounds.eps_lb_resplits(pos, neg, 0.05, 1e-5, orders=orders)
    want = [_direct(pos, neg, 0.05, 1e-5, orders[0][s], {k: o[s] for k, o in orders[1].items()})
            for s in range(6)]
    np.testing.assert_allclose(got, want, rtol=1e-9)
    assert len(set(np.round(got, 9))) > 1  # the splits differ


def test_resplits_are_seeded_and_validated():
    pos, neg = _synthetic(np.random.default_rng(8), 80, {1: 1.5, 2: 2.5})
    a = bounds.eps_lb_resplits(pos, neg, 0.01, 0.0, splits=50, seed=3)
    assert a.shape == (50,) and (a >= 0).all()
    np.testing.assert_array_equal(a, bounds.eps_lb_resplits(pos, neg, 0.01, 0.0, splits=50,
                                                            seed=np.random.SeedSequence(3)))
    assert not np.array_equal(a, bounds.eps_lb_resplits(pos, neg, 0.01, 0.0, splits=50, seed=4))
    for splits in (0, 2.5, True):
        with pytest.raises(ValueError, match="splits="):
            bounds.eps_lb_resplits(pos, neg, 0.01, splits=splits)
    with pytest.raises(ValueError, match="order_neg"):
        bounds.eps_lb_resplits(pos, neg, 0.01, orders=(np.zeros((2, 80), int),
                                                       {k: np.zeros((2, 80), int) for k in pos}))
    with pytest.raises(ValueError, match="orders: the D1 orders"):
        bounds.eps_lb_resplits(pos, neg, 0.01, orders=(np.arange(80)[None],
                                                       {1: np.arange(80)[None]}))
    with pytest.raises(ValueError, match="alpha"):
        bounds.eps_lb_resplits(pos, neg, 0.0)
    with pytest.raises(ValueError, match="too few trials"):
        bounds.eps_lb_resplits({1: [0.0, 1.0]}, [0.0, 1.0], 0.01, select_frac=0.2)


def test_bootstrap_spread_matches_independent_repetitions():
    """The bootstrap standard deviation of the paper's procedure estimates its spread over
    independent repetitions of the experiment: draw 300 fresh data sets of Gaussian scores
    (shift 1.5, 200 trials per side, k = 1 and 2) and compare their standard deviation with
    the bootstrap's from one of them."""
    rng = np.random.default_rng(1)

    def draw():
        neg = rng.normal(0, 1, 200)
        return {1: rng.normal(1.5, 1, 200), 2: rng.normal(1.5, 1, 200)}, neg

    fresh = np.std([bounds.eps_lb_paper_rule(*draw()).value for _ in range(300)], ddof=1)
    boot = [np.std(bounds.paper_rule_bootstrap(*draw(), boots=200, seed=s), ddof=1)
            for s in range(3)]
    assert 0.1 < fresh < 1.0
    for b in boot:
        assert 0.6 * fresh < b < 1.6 * fresh, (b, fresh)


def test_bootstrap_is_seeded():
    pos, neg = {1: np.arange(20.0) + 3}, np.arange(20.0)
    a = bounds.paper_rule_bootstrap(pos, neg, boots=5, seed=3)
    assert a.tolist() == bounds.paper_rule_bootstrap(pos, neg, boots=5, seed=3).tolist()
    assert a.shape == (5,) and np.all(a >= 0)
