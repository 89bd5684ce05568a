"""dpaudit.bounds: references (scipy, quadrature, dp_accounting, worked examples) and soundness.

Soundness is checked by simulating audits of mechanisms whose epsilon is known and for
which the audited event is *tight* (the likelihood ratio at the event equals the claimed
bound), so an unsound bound would exceed the truth often: generalized randomized response
(exactly (eps, delta)-DP), the Laplace mechanism (pure eps, tight at every threshold above
the shift) and the Gaussian mechanism (mu-GDP, tight at every threshold).  Each bound must
exceed the truth in at most alpha of the audits plus 3 binomial standard errors.
"""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
from scipy import integrate, special, stats

from dpaudit import bounds
from dpaudit.bounds import (clopper_pearson, eps_from_mu, eps_lb_clopper_pearson,
                            eps_lb_one_run, mu_lb_gdp, threshold_scan_audit,
                            threshold_split_audit)
from dpaudit.bounds.one_run import _one_run_pvalue

AUDITS = 2000


def slack(alpha: float, n: int = AUDITS) -> float:
    return alpha + 3 * np.sqrt(alpha * (1 - alpha) / n)


# ---- references --------------------------------------------------------------------

@pytest.mark.parametrize("ct,n,alpha", [(0, 10, 0.05), (3, 10, 0.05), (10, 10, 0.01),
                                        (4922, 100000, 1e-10), (1, 1, 0.5)])
def test_clopper_pearson_matches_scipy_binomtest(ct, n, alpha):
    lo, hi = clopper_pearson(ct, n, alpha)
    ref = stats.binomtest(ct, n).proportion_ci(1 - alpha, method="exact")
    assert lo == pytest.approx(ref.low, rel=1e-9, abs=1e-15)
    assert hi == pytest.approx(ref.high, rel=1e-9)


def test_eps_lb_is_log_ratio_of_interval_ends():
    lo, _ = clopper_pearson(400, 500, 0.01)
    _, hi = clopper_pearson(20, 500, 0.01)
    assert eps_lb_clopper_pearson(400, 500, 20, 500, alpha=0.01) == pytest.approx(np.log(lo / hi))
    assert eps_lb_clopper_pearson(400, 500, 20, 500, alpha=0.01, k=4) == pytest.approx(
        np.log(lo / hi) / 4)
    assert eps_lb_clopper_pearson(400, 500, 20, 500, alpha=0.01, delta=0.1) == pytest.approx(
        np.log((lo - 0.1) / hi))


def test_complementary_event_is_used():
    # "in" fires on every negative run but on few positive ones: the complement ("out")
    # separates them, as in the reference code's swap.
    lo_out, _ = clopper_pearson(500 - 20, 500, 0.01)   # P[out | D0] >= lo_out
    _, hi_out = clopper_pearson(500 - 400, 500, 0.01)  # P[out | D1] <= hi_out
    eps = eps_lb_clopper_pearson(500 - 400, 500, 500 - 20, 500, alpha=0.01)
    assert eps == 0.0  # "in" is evidence *against* membership here: nothing certified
    eps = eps_lb_clopper_pearson(480, 500, 100, 500, alpha=0.01)
    lo1, _ = clopper_pearson(480, 500, 0.01)
    _, hi0 = clopper_pearson(100, 500, 0.01)
    assert eps == pytest.approx(max(np.log(lo1 / hi0), np.log((1 - hi0) / (1 - lo1))))
    assert np.log((1 - hi0) / (1 - lo1)) > np.log(lo1 / hi0)
    assert lo_out > hi_out


def test_group_privacy_root_satisfies_lemma_1():
    delta, k = 1e-3, 4
    eps = eps_lb_clopper_pearson(450, 500, 10, 500, alpha=0.05, delta=delta, k=k)
    lo, _ = clopper_pearson(450, 500, 0.05)
    _, hi = clopper_pearson(10, 500, 0.05)
    # Jagielski et al. 2020 Lemma 1: p1 <= e^{k eps} p0 + delta (e^{k eps} - 1) / (e^eps - 1),
    # tight here
    rhs = np.exp(k * eps) * hi + delta * np.expm1(k * eps) / np.expm1(eps)
    assert rhs == pytest.approx(lo, rel=1e-9)
    assert 0 < eps < np.log(lo / hi) / k


def test_tramer_worked_check():
    # Tramer et al. 2022, as worked in the CSCI 699 Week 4 lecture: claimed (0.21, 1e-5);
    # TPR 4.922 %, FPR 0.174 % over 1e5 runs per side;
    # Clopper-Pearson at p = 1e-10 gives alpha+ <= 0.95509, beta <= 0.00274: a violation.
    lo, _ = clopper_pearson(4922, 100_000, 1e-10)
    _, hi = clopper_pearson(174, 100_000, 1e-10)
    assert 1 - lo == pytest.approx(0.95509, abs=1e-5)
    assert hi == pytest.approx(0.00274, abs=1e-5)
    eps = eps_lb_clopper_pearson(4922, 100_000, 174, 100_000, alpha=1e-10, delta=1e-5)
    assert eps == pytest.approx(np.log((lo - 1e-5) / hi))
    assert eps > 0.21  # inconsistent with the claim
    mu_claim = 0.21 / np.sqrt(2 * np.log(1.25 / 1e-5))  # generous: eps of mu-GDP is larger
    assert mu_lb_gdp(4922, 100_000, 174, 100_000, alpha=1e-10) > 10 * mu_claim


@pytest.mark.parametrize("mu,delta", [(0.5, 1e-5), (1.0, 1e-5), (3.0, 1e-6), (0.2, 1e-2)])
def test_eps_from_mu_matches_numerical_integral(mu, delta):
    eps = eps_from_mu(mu, delta)
    # delta(eps) = int max(0, p1(x) - e^eps p0(x)) dx, p1 = N(mu, 1), p0 = N(0, 1):
    # the integrand is positive for x > eps/mu + mu/2.
    x0 = eps / mu + mu / 2
    direct, _ = integrate.quad(lambda x: stats.norm.pdf(x, mu) - np.exp(eps) * stats.norm.pdf(x),
                               x0, np.inf, epsabs=1e-14, epsrel=1e-10)
    assert direct == pytest.approx(delta, rel=1e-6)


def test_eps_from_mu_matches_dp_accounting_gaussian():
    from dp_accounting.pld import privacy_loss_distribution as pld

    for mu in (0.5, 1.0, 2.0):
        ref = pld.from_gaussian_mechanism(1 / mu, value_discretization_interval=1e-4)
        assert eps_from_mu(mu, 1e-5) == pytest.approx(ref.get_epsilon_for_delta(1e-5), rel=2e-3)


def test_eps_from_mu_edges():
    assert eps_from_mu(0.0, 1e-5) == 0.0
    assert eps_from_mu(1e-6, 0.5) == 0.0
    assert eps_from_mu(np.inf, 1e-5) == np.inf
    assert eps_from_mu(30.0, 1e-10) > 400  # large eps: no overflow
    with pytest.raises(ValueError, match="delta"):
        eps_from_mu(1.0, 0.0)
    with pytest.raises(ValueError, match="mu"):
        eps_from_mu(-1.0, 1e-5)


def _gdp_delta_mpmath(mu: float, eps: float) -> float:
    """delta(eps) of mu-GDP straight from [DRS19] Corollary 2.13 in mpmath, carrying enough
    digits for the cancellation of its two terms (they agree to about mu / 40 relative)."""
    mp = pytest.importorskip("mpmath")
    with mp.workdps(60 + 2 * int(max(0.0, -math.log10(mu)))):
        m, e = mp.mpf(mu), mp.mpf(eps)
        return float(mp.ncdf(-e / m + m / 2) - mp.exp(e) * mp.ncdf(-e / m - m / 2))


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("mu", [1e-300, 1e-100, 1e-20, 1e-8, 1e-3, 0.06, 0.5, 1.0, 2.0, 2.5,
                                10.0, 1e3, 1e5])
def test_delta_from_mu_is_accurate_from_tiny_to_huge_mu(mu):
    """Small mu made the two terms cancel (NaN at mu = 1e-300, 0 at 1e-20 where delta(0) is
    mu / sqrt(2 pi)) and large eps or mu made the logs huge: every value, also where it is
    far below delta's usual range, to 1e-12 of mpmath's, and no floating-point warning."""
    for eps in [0.0, 1e-300, 1e-20, 1e-5, 0.01, 0.3, 1.0, 5.0, 30.0, 1e3, 1e6, 1e300]:
        if -eps / mu + mu / 2 < -40:  # delta < Phi(-40) < 1e-349: 0 in floating point
            assert bounds.delta_from_mu(mu, eps) == 0.0
            continue
        ref = _gdp_delta_mpmath(mu, eps)
        assert bounds.delta_from_mu(mu, eps) == pytest.approx(ref, rel=1e-12, abs=1e-320), eps
    # at eps = 0 a closed form, the total variation erf(mu / (2 sqrt 2))
    assert bounds.delta_from_mu(mu, 0.0) == pytest.approx(special.erf(mu / 2 / math.sqrt(2)),
                                                          rel=1e-14)


def test_eps_from_mu_at_tiny_and_huge_mu_against_mpmath():
    mp = pytest.importorskip("mpmath")
    for mu, delta in ((1e-8, 1e-12), (1e-3, 1e-6), (1e3, 1e-5), (1e6, 1e-10)):
        eps = eps_from_mu(mu, delta)
        with mp.workdps(80):
            m = mp.mpf(mu)

            def gap(e):
                return mp.ncdf(-e / m + m / 2) - mp.exp(e) * mp.ncdf(-e / m - m / 2) - delta

            ref = mp.findroot(gap, (mp.mpf(eps) * (1 - 1e-6), mp.mpf(eps) * (1 + 1e-6)),
                              solver="anderson")
        assert eps == pytest.approx(float(ref), rel=1e-10), (mu, delta)
    assert eps_from_mu(1e300, 1e-5) == math.inf  # eps ~ mu^2 / 2 is beyond floating point
    assert math.isfinite(eps_from_mu(1e150, 1e-5))


def test_one_run_pure_is_steinke_thm1_and_matches_bisection():
    m, beta = 1000, 0.05
    assert eps_lb_one_run(m, 1000, 520, beta=beta) == 0.0  # P[Bin(1000, 1/2) >= 520] > beta
    for r, v in [(10, 10), (100, 90), (500, 300), (1000, 560)]:
        eps = eps_lb_one_run(m, r, v, beta=beta)
        # eq. (1): the tail at eps_hat equals beta, and it is increasing in eps
        assert stats.binom.sf(v - 1, r, special.expit(eps)) == pytest.approx(beta, rel=1e-6)
        # second method: the Appendix D p-value bisection with delta -> 0
        lo, hi = 0.0, 20.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if _one_run_pvalue(m, r, v, mid, 0.0) < beta else (lo, mid)
        assert eps == pytest.approx(lo, abs=1e-9)
    np.testing.assert_allclose(eps_lb_one_run(m, [100, 500], [90, 300]),
                               [eps_lb_one_run(m, 100, 90), eps_lb_one_run(m, 500, 300)])


def test_one_run_delta_version():
    pure = eps_lb_one_run(1000, 200, 180)
    assert eps_lb_one_run(1000, 200, 180, delta=1e-12) == pytest.approx(pure, abs=1e-6)
    weaker = eps_lb_one_run(1000, 200, 180, delta=1e-4)
    assert 0 < weaker < pure
    # at the returned eps the Appendix D p-value is at beta
    assert _one_run_pvalue(1000, 200, 180, weaker, 1e-4) == pytest.approx(0.05, rel=1e-3)
    assert eps_lb_one_run(1000, 200, 180, delta=0.01) == 0.0  # 2 m delta swamps everything


# ---- edge cases ------------------------------------------------------------------

def test_edges_all_none_and_tiny():
    assert eps_lb_clopper_pearson(0, 100, 0, 100) == 0.0
    assert eps_lb_clopper_pearson(100, 100, 100, 100) == 0.0
    # n=1: the one-sided bounds are alpha/2 and 1 - alpha/2, so nothing is ever certified
    assert eps_lb_clopper_pearson(1, 1, 0, 1, alpha=0.05) == 0.0
    assert eps_lb_clopper_pearson(1, 1, 0, 1, alpha=0.999) == 0.0
    perfect = eps_lb_clopper_pearson(1000, 1000, 0, 1000, alpha=0.05)
    assert perfect == pytest.approx(np.log((0.025 ** (1 / 1000)) / (1 - 0.025 ** (1 / 1000))))
    assert eps_lb_clopper_pearson(1000, 1000, 0, 1000, alpha=1e-300) >= 0
    assert eps_lb_clopper_pearson(1000, 1000, 0, 1000, alpha=1 - 1e-12) > perfect
    assert mu_lb_gdp(0, 10, 10, 10) == 0.0 and mu_lb_gdp(10, 10, 0, 10) > 0
    assert eps_lb_one_run(10, 0, 0) == 0.0 and eps_lb_one_run(10, 10, 0) == 0.0
    assert eps_lb_one_run(10, 10, 10) == pytest.approx(special.logit(0.05 ** 0.1))
    for f in (eps_lb_clopper_pearson, mu_lb_gdp):
        values = f(np.arange(11), 10, 10 - np.arange(11), 10)
        assert np.all(np.isfinite(values)) and np.all(values >= 0)


@pytest.mark.parametrize("args,kw,match", [
    ((5, 4, 0, 4), {}, "ct_pos"), ((-1, 4, 0, 4), {}, "ct_pos"), ((1, 0, 0, 4), {}, "n_pos"),
    ((1.5, 4, 0, 4), {}, "whole"), ((1, 4, 0, 4), {"alpha": 0.0}, "alpha"),
    ((1, 4, 0, 4), {"alpha": 1.0}, "alpha"), ((1, 4, 0, 4), {"delta": 1.0}, "delta"),
    ((1, 4, 0, 4), {"k": 0}, "k="), ((1, 4, 0, 4), {"k": 1.5}, "k="),
    ((np.nan, 4, 0, 4), {}, "ct_pos=nan"), ((1, 4, 0, np.inf), {}, "n_neg=inf"),
    ((1, 4, 0, 4), {"k": np.nan}, "k=nan"), ((1, 4, 0, 4), {"delta": np.nan}, "delta"),
    ((1, 4, 0, 4), {"alpha": np.nan}, "alpha"), (([], 4, 0, 4), {}, "ct_pos is empty"),
])
def test_invalid_inputs_raise(args, kw, match):
    with pytest.raises(ValueError, match=match):
        eps_lb_clopper_pearson(*args, **kw)


def test_invalid_one_run_and_threshold_inputs():
    with pytest.raises(ValueError, match="r <= m"):
        eps_lb_one_run(10, 11, 1)
    with pytest.raises(ValueError, match="v <= r"):
        eps_lb_one_run(10, 5, 6)
    with pytest.raises(ValueError, match="beta"):
        eps_lb_one_run(10, 5, 5, beta=1.0)
    with pytest.raises(ValueError, match="NaN"):
        threshold_scan_audit([0, np.nan], [0, 1], eps_lb_clopper_pearson, 0.05)
    with pytest.raises(ValueError, match="at least 2"):
        threshold_split_audit([0], [0, 1], eps_lb_clopper_pearson, 0.05)


@pytest.mark.parametrize("call,match", [
    # one-run counts: NaN and non-integers were silently 0.0 and 0.726 before
    (lambda: eps_lb_one_run(100, 100, np.nan), "v=nan"),
    (lambda: eps_lb_one_run(100, 100, 75.5), "v=75.5"),
    (lambda: eps_lb_one_run(100.5, 100, 75), "m=100.5"),
    (lambda: eps_lb_one_run(100, np.inf, 75), "r=inf"),
    (lambda: eps_lb_one_run(100, 100, 75, delta=1e-5), None),
    (lambda: eps_lb_one_run(100, 100, 75, delta=np.nan), "delta"),
    (lambda: clopper_pearson(3, np.nan, 0.05), "n=nan"),
    (lambda: clopper_pearson(11, 10, 0.05), "0 <= ct <= n"),
    (lambda: mu_lb_gdp(1, 4, 0.5, 4), "ct_neg=0.5"),
    (lambda: bounds.delta_from_mu(np.nan, 1.0), "mu=nan"),
    # the last bad inputs: each was accepted, or raised TypeError / ZeroDivisionError
    (lambda: bounds.delta_from_mu(1.0, -1.0), "eps=-1.0"),  # was 0.679
    (lambda: bounds.delta_from_mu(-0.5, 1.0), "mu=-0.5"),
    (lambda: bounds.delta_from_mu("1", 1.0), "mu='1'"),
    (lambda: bounds.delta_from_mu(1.0, "x"), "eps='x'"),
    (lambda: eps_lb_one_run(0, 0, 0), "m=0"),  # was 0.0
    (lambda: bounds.eps_lb_one_run_fdp(0, 0, 0, 1e-5), "m=0"),
    (lambda: bounds.guess_counts([3.0, 2, 1, 0], [1, np.nan, 1, 0], 2), "included"),
    (lambda: bounds.guess_counts([3.0, 2, 1, 0], [1, 2, 1, 0], 2), "included"),
    (lambda: bounds.guess_counts([3.0, 2, 1, 0], [-1, 0, 1, 1], 2), "included"),
    (lambda: bounds.guess_counts([3.0, 2, 1, 0], ["a", "b", "a", "b"], 2), "included"),
    (lambda: bounds.guess_counts([3.0, 2, 1, 0], [1, 0, 1, 0], 1.5), "k_max=1.5"),
    (lambda: bounds.guess_counts([3.0, 2, 1, 0], [1, 0, 1, 0], "2"), "k_max='2'"),
    (lambda: bounds.guess_counts([3.0, 2, 1, 0], [1, 0, 1, 0], 0), "k_max=0"),
    (lambda: bounds.guess_counts([3.0], [1], 1), "scores"),
    (lambda: bounds.one_run_sweep(10, [], 1e-5), "correct"),
    (lambda: bounds.one_run_sweep(10, np.zeros((3, 0)), 1e-5), "correct"),
    (lambda: bounds.one_run_sweep(10, [2, 4], 1e-5, ks=[2, 1]), "ks"),
    (lambda: bounds.one_run_sweep(10, [2, 4], 1e-5, ks=[3]), "ks"),
    (lambda: bounds.guess_grid(2.5), "k_max=2.5"),
    (lambda: eps_from_mu(np.nan, 1e-5), "mu=nan"),
    (lambda: threshold_split_audit([], [0, 1], eps_lb_clopper_pearson, 0.05), "scores_pos"),
    (lambda: threshold_scan_audit([0, 1], [np.nan] * 3, eps_lb_clopper_pearson, 0.05),
     "scores_neg has 3 NaN"),
    (lambda: threshold_scan_audit([0, 1], ["a", "b"], eps_lb_clopper_pearson, 0.05),
     "scores_neg"),
])
def test_every_bound_names_its_bad_argument(call, match):
    if match is None:  # the valid control case
        assert call() >= 0
        return
    with pytest.raises(ValueError, match=match):
        call()


def test_infinite_scores_order_like_any_other():
    """A diverged model's score of -inf is a valid "out" decision, never a NaN threshold."""
    pos, neg = np.r_[np.full(50, 5.0), np.inf], np.r_[np.zeros(50), -np.inf]
    res = threshold_scan_audit(pos, neg, eps_lb_clopper_pearson, 0.05)
    assert res.ct_pos == 51 and res.ct_neg == 0 and np.isfinite(res.threshold)
    assert res.value == pytest.approx(eps_lb_clopper_pearson(51, 51, 0, 51, 2 * 0.05 / 102))


# ---- soundness by simulation -----------------------------------------------------

def test_soundness_clopper_pearson_generalized_randomized_response():
    """M(b): with prob. delta reveal b, else randomized response at eps: exactly (eps, delta)-DP.

    The event "output 1" is tight: TPR = e^eps FPR + delta.  Also shows the test has power:
    the plug-in estimate log((TPR-delta)/FPR) exceeds the truth in about half the audits.
    """
    rng = np.random.default_rng(0)
    n, alpha = 1000, 0.05
    for eps, delta in [(1.0, 0.0), (2.0, 0.05), (0.5, 0.2)]:
        fpr = (1 - delta) / (1 + np.exp(eps))
        tpr = np.exp(eps) * fpr + delta
        ct_pos, ct_neg = rng.binomial(n, tpr, AUDITS), rng.binomial(n, fpr, AUDITS)
        lb = eps_lb_clopper_pearson(ct_pos, n, ct_neg, n, alpha=alpha, delta=delta)
        assert np.mean(lb > eps) <= slack(alpha)
        assert np.median(lb) > 0.6 * eps
        with np.errstate(divide="ignore", invalid="ignore"):
            plug_in = np.log((ct_pos / n - delta) / (ct_neg / n))
        assert np.mean(plug_in > eps) > 0.3


def test_soundness_and_tightness_gdp_gaussian():
    rng = np.random.default_rng(1)
    n, alpha = 1000, 0.05
    for mu, t in [(1.0, 0.5), (2.0, 1.0), (0.5, 0.0)]:
        tpr, fpr = stats.norm.sf(t - mu), stats.norm.sf(t)
        ct_pos, ct_neg = rng.binomial(n, tpr, AUDITS), rng.binomial(n, fpr, AUDITS)
        assert np.mean(mu_lb_gdp(ct_pos, n, ct_neg, n, alpha=alpha) > mu) <= slack(alpha)
    # tight on a heavily leaking mechanism with many runs: within 2 % of the truth
    n = 10**7
    assert mu_lb_gdp(round(n * stats.norm.sf(-1.5)), n, round(n * stats.norm.sf(1.5)), n,
                     alpha=0.05) == pytest.approx(3.0, rel=0.02)
    # (eps, delta) of the same Gaussian: eps_from_mu(mu_LB) stays below the true eps(delta)
    lb = [eps_from_mu(m, 1e-5) for m in mu_lb_gdp(ct_pos[:200], 1000, ct_neg[:200], 1000)]
    assert np.mean(np.array(lb) > eps_from_mu(0.5, 1e-5)) <= slack(0.05, 200)


def test_tightness_clopper_pearson_with_many_runs():
    # randomized response at eps = 2 audited with 1e6 runs per side: within 2 % of the truth
    n, eps = 10**6, 2.0
    p = special.expit(eps)
    assert eps_lb_clopper_pearson(round(n * p), n, round(n * (1 - p)), n) == pytest.approx(
        eps, rel=0.02)


def _laplace_scores(rng, eps, n, audits):
    # Laplace mechanism on a count with sensitivity 1: pure eps-DP, tight for thresholds >= 1.
    return 1 + rng.laplace(0, 1 / eps, (audits, n)), rng.laplace(0, 1 / eps, (audits, n))


@pytest.mark.parametrize("procedure", ["split", "scan"])
def test_soundness_threshold_procedures_laplace(procedure):
    rng = np.random.default_rng(2)
    eps, n, alpha, audits = 1.0, 400, 0.05, 400
    pos, neg = _laplace_scores(rng, eps, n, audits)
    audit = threshold_split_audit if procedure == "split" else threshold_scan_audit
    lb = np.array([audit(p, q, eps_lb_clopper_pearson, alpha).value for p, q in zip(pos, neg)])
    assert np.mean(lb > eps) <= slack(alpha, audits)
    assert np.median(lb) > 0.25 * eps  # still informative


def test_threshold_split_uses_held_out_half():
    pos = np.r_[np.full(50, 10.0), np.zeros(50)]  # selection half separates, evaluation not
    neg = np.zeros(100)
    out = threshold_split_audit(pos, neg, eps_lb_clopper_pearson, 0.05)
    assert out.threshold >= 0 and (out.ct_pos, out.n_pos, out.ct_neg, out.n_neg) == (0, 50, 0, 50)
    assert out.value == 0.0


def test_soundness_one_run_randomized_response():
    """m canaries, each in with prob. 1/2, released by per-canary randomized response.

    eps-DP with respect to each canary and tight: every guess is right with prob.
    e^eps/(1+e^eps).  The attack guesses r random canaries, abstaining on the rest.
    """
    rng = np.random.default_rng(4)
    m, r, beta = 1000, 300, 0.05
    for eps in (0.5, 2.0):
        v = rng.binomial(r, special.expit(eps), AUDITS)
        lb = eps_lb_one_run(m, r, v, beta=beta)
        assert np.mean(lb > eps) <= slack(beta)
        assert np.median(lb) > 0.6 * eps
    # tight with many guesses: within 3 %
    r = 10**6
    assert eps_lb_one_run(r, r, round(r * special.expit(2.0))) == pytest.approx(2.0, rel=0.03)


def test_soundness_one_run_gaussian_top_k_guesses():
    """Gaussian scores (mu-GDP per canary) with the paper's guesses: top and bottom k.

    The mechanism is (eps(delta), delta)-DP for every delta, so the (eps, delta) one-run
    bound must stay below eps_from_mu(mu, delta).
    """
    rng = np.random.default_rng(5)
    m, k, mu, delta, beta, audits = 1000, 50, 2.0, 1e-5, 0.05, 300
    truth = eps_from_mu(mu, delta)
    s = rng.choice([-1, 1], (audits, m))
    scores = mu * (s > 0) + rng.standard_normal((audits, m))
    order = np.argsort(scores, axis=1)
    top, bottom = order[:, -k:], order[:, :k]
    v = (np.take_along_axis(s, top, 1) > 0).sum(1) + (np.take_along_axis(s, bottom, 1) < 0).sum(1)
    lb = eps_lb_one_run(m, 2 * k, v, delta=delta, beta=beta)
    assert np.mean(lb > truth) <= slack(beta, audits)
    assert np.median(lb) > 1.0  # the top/bottom guesses are mostly right


def test_published_maximum_of_jagielski_table_2():
    # Jagielski et al. 2020, Table 2: with T = 500 evaluation trials per side at 99 % confidence a
    # perfect test (k = 1) certifies at most 4.54, the value in every eps_th = inf,
    # fixed-init cell.
    assert eps_lb_clopper_pearson(500, 500, 0, 500, alpha=0.01) == pytest.approx(4.54, abs=5e-3)


def test_threshold_sits_in_the_middle_of_the_gap_it_chose():
    """Separated sides: the chosen decision is "score > max(neg)"; the reported threshold
    is midway to min(pos), so a fresh negative a little above max(neg) is not counted."""
    neg, pos = np.arange(20.0), np.arange(30.0, 50.0)
    out = threshold_scan_audit(pos, neg, eps_lb_clopper_pearson, 0.1)
    assert out.threshold == 24.5 and (out.ct_pos, out.ct_neg) == (20, 0) and out.value > 0
    fresh_neg = np.r_[np.arange(19.0), 20.0]
    split = threshold_split_audit(np.r_[pos, pos], np.r_[neg, fresh_neg], eps_lb_clopper_pearson,
                                  0.1)
    assert split.threshold == 24.5 and (split.ct_pos, split.ct_neg) == (20, 0)


# ---- one-run guess sweep -------------------------------------------------------------

DELTA = 1e-6


def test_guess_counts_match_the_homework_definition():
    rng = np.random.default_rng(0)
    m, k_max = 41, 20
    scores = rng.normal(size=m)
    S = rng.choice([-1, 1], size=m)
    counts = bounds.guess_counts(scores, S, k_max)
    order = np.argsort(scores)
    for k in range(1, k_max + 1):
        T = np.zeros(m, int)
        T[order[-k:]], T[order[:k]] = 1, -1  # m1 = m2 = k largest IN, smallest OUT
        assert counts[k - 1] == np.sum(S == T)
    with pytest.raises(ValueError, match="k_max"):
        bounds.guess_counts(scores, S, 21)


def test_guess_grid_is_fixed_in_advance():
    # By hand: k_min = 4 (4^-4 = 0.0039 <= 0.05 / 10 < 4^-3), then round(4 (K/4)^(j/9))
    np.testing.assert_array_equal(bounds.guess_grid(500), [4, 7, 12, 20, 34, 58, 100, 171,
                                                           292, 500])
    np.testing.assert_array_equal(bounds.guess_grid(50), [4, 5, 7, 9, 12, 16, 22, 29, 38, 50])
    np.testing.assert_array_equal(bounds.guess_grid(10), [4, 5, 6, 7, 8, 9, 10])
    np.testing.assert_array_equal(bounds.guess_grid(4), [4])
    np.testing.assert_array_equal(bounds.guess_grid(2), [2])  # too few to certify anything
    for beta, size in ((0.05, 10), (1e-3, 10), (0.05, 3), (1e-10, 5)):
        k_min = int(bounds.guess_grid(10**6, beta, size)[0])
        assert 4.0 ** -k_min <= beta / size < 4.0 ** -(k_min - 1)
    for K in range(1, 3000, 37):
        grid = bounds.guess_grid(K)
        assert 1 <= len(grid) <= bounds.GUESS_GRID_SIZE == 10 and grid[-1] == K
        assert np.all(np.diff(grid) > 0)
    # nothing but (k_max, beta, size) goes in: the signature is the proof it is not data-chosen
    assert list(inspect.signature(bounds.guess_grid).parameters) == ["k_max", "beta", "size"]


def test_one_run_sweep_bonferroni_closed_form():
    # all 2k guesses right: P[Bin(2k, q) >= 2k] = q^(2k) = level -> eps = logit(level^(1/2k)),
    # largest at the largest tested k; level = beta / 10, the 10 counts of guess_grid(50)
    K, m, beta = 50, 1000, 0.05
    correct = 2 * np.arange(1, K + 1)
    res = bounds.one_run_sweep(m, correct, DELTA, beta)
    level = beta / 10
    assert res["eps_lb_pure"] == pytest.approx(special.logit(level ** (1 / (2 * K))), rel=1e-9)
    assert res["eps_lb_pure"] == pytest.approx(2.9112, abs=1e-4)  # 2.6378 at beta / K = 1e-3
    assert res["eps_hat_max"] == pytest.approx(special.logit(beta ** (1 / (2 * K))), rel=1e-9)
    assert res["best_k"] == K and res["correct"] == 2 * K
    assert 0 < res["eps_lb"] <= res["eps_lb_pure"]
    # Hoeffding: q* = 1 - sqrt(ln(10/beta) / (2 * 2k)), also largest at k = K
    q_star = 1 - math.sqrt(math.log(10 / beta) / (4 * K))
    assert res["eps_lb_pure_hoeffding"] == pytest.approx(special.logit(q_star), rel=1e-12)
    assert 0 < res["eps_lb_pure_hoeffding"] < res["eps_lb_pure"]
    # the f-DP columns: [MMC25] at the same k and level, called directly
    assert res["eps_lb_fdp"] == pytest.approx(bounds.eps_lb_one_run_fdp(m, 2 * K, 2 * K, DELTA,
                                                                       level))
    assert res["mu_lb"] == pytest.approx(bounds.mu_lb_one_run_gdp(m, 2 * K, 2 * K, level))
    assert res["eps_gdp"] == pytest.approx(eps_from_mu(res["mu_lb"], DELTA))
    # counts given by the caller: Bonferroni over exactly those (two here: beta / 2)
    two = bounds.one_run_sweep(m, correct, DELTA, beta, ks=[10, 50])
    assert two["eps_lb_pure"] == pytest.approx(special.logit((beta / 2) ** (1 / 100)), rel=1e-9)


def test_one_run_sweep_tests_only_the_grid(monkeypatch):
    """All 2k guesses right up to k = 150 (not a grid count), half right beyond: the best
    count overall is off the grid and must not be used; every bound is evaluated at grid
    counts only, whatever the guesses."""
    m, K, beta = 1000, 500, 0.05
    k = np.arange(1, K + 1)
    correct = np.where(k <= 150, 2 * k, 300 + (k - 150))
    grid = [4, 7, 12, 20, 34, 58, 100, 171, 292, 500]
    seen = []
    fdp = bounds.eps_lb_one_run_fdp
    monkeypatch.setattr(bounds.one_run, "eps_lb_one_run_fdp",  # where the sweep looks it up
                        lambda m_, r, v, d, b: seen.append((r, b)) or fdp(m_, r, v, d, b))
    res = bounds.one_run_sweep(m, correct, DELTA, beta)
    at = {g: eps_lb_one_run(m, 2 * g, correct[g - 1], 0.0, beta / 10) for g in grid}
    assert res["eps_lb_pure"] == pytest.approx(max(at.values()), rel=1e-12)
    assert res["eps_lb_pure"] < eps_lb_one_run(m, 300, 300, 0.0, beta / 10)  # k = 150 unused
    assert res["best_k"] == 100 and seen  # all 200 right: 3.62 (171: 321 of 342 right)
    assert all(r // 2 in grid and b == beta / 10 for r, b in seen)


def test_one_run_sweep_is_sound_on_randomized_response():
    """Randomized response at eps = 1 on each canary (eps-DP, so (eps, delta)-DP for every
    delta; the mechanism whose binomial tail the bounds are exact for): every certified
    column exceeds eps in at most beta of the audits (plus 3 binomial standard errors).
    The same simulation flags the max over the grid of bounds each at beta (no
    Bonferroni), so it can tell a missing correction."""
    rng = np.random.default_rng(1)
    m, eps, reps, beta = 200, 1.0, 400, 0.05
    S = rng.random((reps, m)) < 0.5
    told = rng.random((reps, m)) < special.expit(eps)  # the true membership is released
    scores = np.where(told, S, ~S) + 0.5 * rng.random((reps, m))  # random order within ties
    counts = np.stack([bounds.guess_counts(sc, s, m // 2) for sc, s in zip(scores, S)])
    res = bounds.one_run_sweep(m, counts, 1e-5, beta)
    slack = 3 * math.sqrt(beta * (1 - beta) / reps)
    for col in ("eps_lb_pure", "eps_lb", "eps_lb_fdp", "eps_lb_pure_hoeffding"):
        assert np.mean(res[col] > eps) <= beta + slack, col
    assert np.all(res["eps_lb"] <= res["eps_lb_pure"]) and np.all(res["eps_lb_fdp"] <=
                                                                   res["eps_lb_pure"])
    assert 0.4 < res["eps_lb_pure"].mean() < eps  # not vacuous: 0.58 measured
    ks = bounds.guess_grid(m // 2)
    uncorrected = np.asarray(eps_lb_one_run(m, 2 * ks, counts[:, ks - 1], 0.0, beta)).max(-1)
    assert np.mean(uncorrected > eps) > beta + slack  # 0.13 measured
    assert np.mean(res["eps_hat_max"] > eps) > beta + slack  # the homework's max: 0.24


def test_valid_edge_inputs_of_the_one_run_helpers():
    # delta(0) of mu-GDP is the total variation Phi(mu/2) - Phi(-mu/2); 0 at mu = 0 and at
    # eps = inf; 0/1 and -1/+1 memberships and bools count alike
    assert bounds.delta_from_mu(1.0, 0.0) == pytest.approx(2 * stats.norm.cdf(0.5) - 1)
    assert bounds.delta_from_mu(0.0, 1.0) == 0.0 and bounds.delta_from_mu(1.0, math.inf) == 0.0
    scores = [3.0, 2, 1, 0]
    expected = [2, 3]  # k = 1: both right; k = 2: the 2nd highest (out) guessed in
    for inc in ([1, 0, 1, 0], [1, -1, 1, -1], [True, False, True, False]):
        np.testing.assert_array_equal(bounds.guess_counts(scores, inc, 2), [2, 2])
    np.testing.assert_array_equal(bounds.guess_counts(scores, [1, 0, 0, 0], 2), expected)
    np.testing.assert_array_equal(bounds.guess_counts(scores, [1, 1, 0, 0], np.int64(2)), [2, 4])
