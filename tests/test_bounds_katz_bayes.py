"""dpaudit.bounds: the approximate Katz bound, the Bayesian credible bound and the ROC
measures, against independent computations (closed forms written out here, Monte-Carlo of
the same posterior, brute force) and by simulation on randomized response."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from dpaudit import bounds
from dpaudit.bounds import auc, eps_lb_bayes, eps_lb_clopper_pearson, eps_lb_katz, tpr_at_fpr


def katz_log_ratio_lo(x1, n1, x0, n0, alpha):
    """ln of the lower end of Katz et al.'s interval for (x1/n1) / (x0/n0), written out."""
    z = stats.norm.isf(alpha / 2)
    return np.log((x1 / n1) / (x0 / n0)) - z * np.sqrt(1 / x1 - 1 / n1 + 1 / x0 - 1 / n0)


# ---- Katz ---------------------------------------------------------------------------

def test_katz_is_the_log_of_the_katz_interval_end():
    alpha = 0.01
    assert eps_lb_katz(400, 500, 20, 500, alpha) == pytest.approx(
        katz_log_ratio_lo(400, 500, 20, 500, alpha), rel=1e-12)
    # k rows at delta = 0: the group's bound over k
    assert eps_lb_katz(400, 500, 20, 500, alpha, k=4) == pytest.approx(
        katz_log_ratio_lo(400, 500, 20, 500, alpha) / 4, rel=1e-12)
    # delta at k = 1 through the FPR estimate: ln(R_lo - delta / FPR_hat)
    r_lo = np.exp(katz_log_ratio_lo(400, 500, 20, 500, alpha))
    assert eps_lb_katz(400, 500, 20, 500, alpha, delta=0.01) == pytest.approx(
        np.log(r_lo - 0.01 / (20 / 500)), rel=1e-12)
    # the complementary event: TNR / FNR (0.8 / 0.04) beats TPR / FPR (0.96 / 0.2)
    assert eps_lb_katz(480, 500, 100, 500, alpha) == pytest.approx(
        katz_log_ratio_lo(500 - 100, 500, 500 - 480, 500, alpha), rel=1e-12)


def test_katz_zero_counts_add_one_half():
    # ct_neg = 0: counts and totals + 0.5 (statsmodels' log-adjusted), as written out here
    alpha = 0.01
    ref = katz_log_ratio_lo(20.5, 20.5, 0.5, 20.5, alpha)
    assert eps_lb_katz(20, 20, 0, 20, alpha) == pytest.approx(max(ref, 0.0), rel=1e-12)
    assert eps_lb_katz(0, 20, 0, 20, alpha) == 0.0
    assert np.isfinite(eps_lb_katz([20, 0, 7], 20, [0, 20, 0], 20)).all()


def test_katz_group_privacy_root_with_delta():
    # k = 4, delta > 0: R_lo q = e^{4 eps} q + delta (e^{4 eps} - 1) / (e^eps - 1) at the root
    alpha, delta, k = 0.01, 1e-3, 4
    eps = eps_lb_katz(400, 500, 20, 500, alpha, delta=delta, k=k)
    r_lo, q = np.exp(katz_log_ratio_lo(400, 500, 20, 500, alpha)), 20 / 500
    assert r_lo * q == pytest.approx(np.exp(k * eps) * q + delta * np.expm1(k * eps)
                                     / np.expm1(eps), rel=1e-9)


def _grr_counts(rng, eps, n, audits):
    """Randomized response at eps (pure eps-DP, tight): counts of "1" with and without."""
    fpr = 1 / (1 + np.exp(eps))
    return rng.binomial(n, np.exp(eps) * fpr, audits), rng.binomial(n, fpr, audits)


def test_katz_coverage_with_many_trials():
    """Asymptotic: with 1000 trials per side and counts far from 0, it exceeds the truth
    about as often as alpha allows (benchmarks/bound_coverage.py measures small counts too)."""
    rng = np.random.default_rng(0)
    audits, alpha = 4000, 0.05
    for eps in (1.0, 2.0):
        ct_pos, ct_neg = _grr_counts(rng, eps, 1000, audits)
        over = np.mean(eps_lb_katz(ct_pos, 1000, ct_neg, 1000, alpha) > eps)
        assert over <= alpha + 3 * np.sqrt(alpha * (1 - alpha) / audits)
        assert over > 0.0  # and it is not trivially conservative


# ---- Bayes --------------------------------------------------------------------------

def posterior_mc(ct_pos, n_pos, ct_neg, n_neg, alpha, delta=0.0, size=1_000_000, seed=0):
    """alpha-quantile of eps(FPR, FNR) under the Jeffreys posteriors, by sampling, and the
    standard error of that quantile (order-statistic binomial interval)."""
    rng = np.random.default_rng(seed)
    x = rng.beta(ct_neg + 0.5, n_neg - ct_neg + 0.5, size)
    y = rng.beta(n_pos - ct_pos + 0.5, ct_pos + 0.5, size)
    eps = np.sort(np.maximum(0.0, np.maximum(np.log((1 - delta - x) / y),
                                             np.log((1 - delta - y) / x))))
    spread = int(4 * np.sqrt(size * alpha * (1 - alpha)))
    i = int(alpha * size)
    return eps[i], eps[max(i - spread, 0)], eps[min(i + spread, size - 1)]


@pytest.mark.parametrize("counts,alpha,delta", [
    ((20, 20, 0, 20), 0.01, 0.0),        # perfect attack, few trials
    ((15, 20, 3, 20), 0.01, 0.0),
    ((400, 500, 20, 500), 0.05, 1e-5),
    ((480, 500, 100, 500), 0.05, 0.0),    # the complementary event decides
    ((4922, 100000, 174, 100000), 0.01, 1e-5),  # Tramer et al.'s counts
])
def test_bayes_matches_monte_carlo_of_the_same_posterior(counts, alpha, delta):
    value = eps_lb_bayes(*counts, alpha, delta)
    _, lo, hi = posterior_mc(*counts, alpha, delta)
    assert lo <= value <= hi


def test_bayes_closed_form_limit_known_fpr():
    """With the FPR known exactly (a huge negative side), the posterior quantile is in
    closed form: the FNR posterior's (1 - alpha)-quantile q, and eps = max(0,
    ln((1 - delta - p0) / q), ln((1 - delta - q) / p0))."""
    alpha, delta, p0 = 0.05, 1e-3, 0.02
    n_neg = 10**11
    q = stats.beta.ppf(1 - alpha, 200 - 150 + 0.5, 150 + 0.5)  # 150 of 200 positives "in"
    ref = max(0.0, np.log((1 - delta - p0) / q), np.log((1 - delta - q) / p0))
    assert eps_lb_bayes(150, 200, round(p0 * n_neg), n_neg, alpha, delta) == pytest.approx(
        ref, rel=1e-4)


def test_bayes_group_and_edges():
    base = eps_lb_bayes(400, 500, 20, 500, 0.01)
    assert eps_lb_bayes(400, 500, 20, 500, 0.01, k=4) == pytest.approx(base / 4, rel=1e-5)
    assert eps_lb_bayes(10, 20, 10, 20, 0.05) == 0.0  # no signal: the quantile is 0
    # more trials at the same rates: the posterior narrows, its lower quantile rises
    assert eps_lb_bayes(4000, 5000, 200, 5000, 0.01) > base
    # the point estimate it approaches (posterior concentrated)
    n = 10**8
    assert eps_lb_bayes(int(0.8 * n), n, int(0.04 * n), n, 0.01) == pytest.approx(
        np.log(0.8 / 0.04), rel=1e-3)
    np.testing.assert_allclose(eps_lb_bayes([400, 20], 500, [20, 0], 500, 0.01),
                               [base, eps_lb_bayes(20, 500, 0, 500, 0.01)])


@pytest.mark.parametrize("fn", [eps_lb_katz, eps_lb_bayes])
@pytest.mark.parametrize("args,kw,match", [
    ((5, 4, 0, 4), {}, "ct_pos"), ((1, 4, 0, 0), {}, "n_neg"), ((1.5, 4, 0, 4), {}, "ct_pos"),
    ((1, 4, 0, 4), {"alpha": 0.0}, "alpha"), ((1, 4, 0, 4), {"delta": 1.0}, "delta"),
    ((1, 4, 0, 4), {"k": 0}, "k"),
])
def test_bad_arguments_are_named(fn, args, kw, match):
    with pytest.raises(ValueError, match=match):
        fn(*args, **kw)


def test_katz_and_bayes_lie_near_clopper_pearson_with_many_trials():
    # Tramer et al.'s counts at alpha = 0.01: three ways to the same eps, within 2 %
    cp = eps_lb_clopper_pearson(4922, 10**5, 174, 10**5, 0.01, 1e-5)
    assert eps_lb_katz(4922, 10**5, 174, 10**5, 0.01, 1e-5) == pytest.approx(cp, rel=0.02)
    assert eps_lb_bayes(4922, 10**5, 174, 10**5, 0.01, 1e-5) == pytest.approx(cp, rel=0.03)


# ---- ROC measures -------------------------------------------------------------------

def test_tpr_at_fpr_and_auc_match_brute_force():
    rng = np.random.default_rng(3)
    pos = np.round(rng.normal(1.0, 1.0, 300), 1)  # rounded: ties across the sides
    neg = np.round(rng.normal(0.0, 1.0, 500), 1)
    for max_fpr in (0.001, 0.01, 0.1, 0.5):
        best = max(np.mean(pos > t) for t in np.r_[-np.inf, pos, neg]
                   if np.mean(neg > t) <= max_fpr)
        assert tpr_at_fpr(pos, neg, max_fpr) == best
    pairs = (pos[:, None] > neg[None]).mean() + 0.5 * (pos[:, None] == neg[None]).mean()
    assert auc(pos, neg) == pytest.approx(pairs, rel=1e-12)
    assert auc(neg, pos) == pytest.approx(1 - pairs, rel=1e-12)
    with pytest.raises(ValueError, match="max_fpr"):
        tpr_at_fpr(pos, neg, 0.0)


def test_split_trials_is_the_split_of_the_threshold_audit():
    pos, neg = np.arange(10.0), np.arange(8.0)
    sel_p, sel_n, ev_p, ev_n = bounds.split_trials(pos, neg, 0.5)
    assert list(sel_p) == list(range(5)) and list(ev_n) == [4, 5, 6, 7]
    assert list(ev_p) == list(range(5, 10)) and list(sel_n) == [0, 1, 2, 3]
