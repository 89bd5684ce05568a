"""Tests of the one-run f-DP audits (Mahloujifar, Melis, Chaudhuri, "Auditing f-Differential
Privacy in One Run", ICML 2025): ``bounds.mu_lb_one_run_gdp`` and ``bounds.eps_lb_one_run_fdp``.

Checks: soundness by simulation (randomized response, Gaussian canaries), the recursion
against an independent linear program over the same constraints, a closed form, comparison
with the Steinke-Nasr-Jagielski bound ``bounds.eps_lb_one_run``, shape properties, input
validation, speed.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from scipy import optimize, special

from dpaudit import bounds

BETA = 0.05


# ---- an independent check of the recursion: the linear program it solves --------------

def _lp_max_tail(m: int, r: int, v: int, pieces) -> float:
    """Largest ``P[T >= v]`` over distributions of T (correct guesses out of r) that satisfy
    the constraints the analysis uses, as a linear program in ``p_t = P[T = t]``.

    With a uniform canary I: ``C_i = sum_{t>=i} p_t t/m`` (I guessed right, T >= i) and
    ``W_i = sum_{t>=i} p_t (r-t)/m`` (I guessed wrong, T >= i); f-DP gives
    ``W_i >= f(1 - C_{i+1})`` for ``i < r``, here with ``f(1 - y) >= a y + b`` for each
    ``(a, b)`` in ``pieces`` (exact for the piecewise-linear (eps, delta) curve; a
    relaxation, i.e. a larger optimum, for a smooth curve given by some of its tangents).
    """
    t = np.arange(r + 1)
    rows, rhs = [], []
    for i in range(r):
        c_next = np.where(t >= i + 1, t / m, 0.0)
        w_i = np.where(t >= i, (r - t) / m, 0.0)
        for a, b in pieces:  # a C_{i+1} + b <= W_i
            rows.append(a * c_next - w_i)
            rhs.append(-b)
    res = optimize.linprog(-(t >= v).astype(float), A_ub=np.array(rows), b_ub=np.array(rhs),
                           A_eq=np.ones((1, r + 1)), b_eq=[1.0], bounds=(0, None),
                           method="highs")
    assert res.status == 0
    return -res.fun


def _eps_delta_pieces(eps: float, delta: float):
    # f(1 - y) = max(0, e^-eps (y - delta), 1 - delta - e^eps (1 - y)); the 0 is implied
    return [(np.exp(-eps), -np.exp(-eps) * delta), (np.exp(eps), 1.0 - delta - np.exp(eps))]


@pytest.mark.parametrize("m, r, v, delta", [(20, 20, 16, 0.0), (20, 10, 9, 0.0),
                                            (30, 30, 25, 0.01), (40, 20, 18, 1e-3),
                                            (25, 12, 12, 0.0)])
def test_eps_recursion_matches_linear_program(m, r, v, delta):
    # The greedy recursion is exactly the optimum of the LP: just below the returned eps the
    # LP's largest P[T >= v] is < beta (rejected), just above it is >= beta.
    eps = bounds.eps_lb_one_run_fdp(m, r, v, delta, BETA)
    assert eps > 0
    assert _lp_max_tail(m, r, v, _eps_delta_pieces(eps * (1 - 1e-4), delta)) < BETA
    assert _lp_max_tail(m, r, v, _eps_delta_pieces(eps * (1 + 1e-4), delta)) >= BETA


@pytest.mark.parametrize("m, r, v", [(20, 20, 17), (30, 15, 14)])
def test_gdp_recursion_below_linear_program_relaxation(m, r, v):
    # mu-GDP is (eps, delta(eps))-DP for every eps (Dong, Roth, Su), so the (eps, delta(eps))
    # lines over a grid of eps are tangents of the GDP curve: the LP with them is a
    # relaxation.  Soundness direction: 1 % below the returned mu even the relaxation must
    # already give P[T >= v] < beta; 1 % above, the exact problem (hence the relaxation) is
    # not rejected.
    mu = bounds.mu_lb_one_run_gdp(m, r, v, BETA)
    assert mu > 0

    def pieces(mu_):
        out = []
        for e in np.linspace(0.0, 12.0, 200):
            out += _eps_delta_pieces(e, bounds.delta_from_mu(mu_, e))
        return out

    assert _lp_max_tail(m, r, v, pieces(mu * 0.99)) < BETA
    assert _lp_max_tail(m, r, v, pieces(mu * 1.01)) >= BETA


# ---- soundness by simulation ---------------------------------------------------------

def _exceed_rate(values, bound_of_v, truth) -> float:
    """Fraction of simulated audits (their correct-guess counts ``values``) whose bound
    exceeds ``truth``; the bound is computed once per distinct count."""
    u, counts = np.unique(values, return_counts=True)
    over = np.array([bound_of_v(int(x)) > truth for x in u])
    return counts[over].sum() / len(values)


def _slack(n: int) -> float:
    return 3 * np.sqrt(BETA * (1 - BETA) / n)  # binomial noise of an estimated rate <= beta


@pytest.mark.parametrize("m, r, eps", [(100, 10, 1.0), (1000, 200, 1.0), (500, 500, 0.5)])
def test_randomized_response_soundness(m, r, eps):
    # Randomized response of known eps: each guessed canary is right with probability
    # e^eps / (1 + e^eps), independently; so v ~ Bin(r, q).  It is (eps, 0)-DP hence
    # (eps, delta)-DP: the certified bound may exceed eps in at most ~beta of the audits.
    n = 4000
    rng = np.random.default_rng(11)
    v = rng.binomial(r, special.expit(eps), size=n)
    rate = _exceed_rate(v, lambda x: bounds.eps_lb_one_run_fdp(m, r, x, 1e-5, BETA), eps)
    assert rate <= BETA + _slack(n)
    if (m, r) == (100, 10):
        # Power: the audit is nearly tight here.  eps_LB(10 of 10) = 1.0511 > 1, so the
        # exceedance rate is P[all 10 right] = expit(1)^10 = 0.0436, just under beta.
        assert bounds.eps_lb_one_run_fdp(m, r, 9, 1e-5, BETA) < eps
        assert rate == pytest.approx(special.expit(eps) ** 10, abs=4 * np.sqrt(0.044 / n))


def _gaussian_audits(m: int, r: int, mu: float, n: int, rng) -> np.ndarray:
    """Correct-guess counts of n one-run audits of the mu-GDP Gaussian mechanism: canary i
    is in (S_i = 1) with probability 1/2, its score is mu S_i + N(0, 1); guess "in" for the
    r/2 highest scores and "out" for the r/2 lowest, abstain on the rest."""
    s = rng.random((n, m)) < 0.5
    order = np.argsort(mu * s + rng.standard_normal((n, m)), axis=1)
    right_in = np.take_along_axis(s, order[:, m - r // 2:], axis=1).sum(axis=1)
    right_out = (~np.take_along_axis(s, order[:, : r // 2], axis=1)).sum(axis=1)
    return right_in + right_out


@pytest.mark.parametrize("m, r, mu", [(1000, 1000, 0.3), (200, 200, 1.0), (1000, 100, 2.0),
                                      (20, 20, 3.0)])
def test_gaussian_canaries_soundness(m, r, mu):
    # Each score is a Gaussian mechanism of sensitivity mu with unit noise, so the audit
    # output is mu-GDP in every canary: mu_LB > mu, and eps_LB(delta) > eps(delta) of mu-GDP,
    # may each happen in at most ~beta of the audits.  (With independent canaries this
    # mechanism is far from the worst case of the analysis: the rates observed are 0.)
    n = 1000
    rng = np.random.default_rng(5)
    v = _gaussian_audits(m, r, mu, n, rng)
    assert v.mean() > 0.55 * r  # the attack works
    rate_mu = _exceed_rate(v, lambda x: bounds.mu_lb_one_run_gdp(m, r, x, BETA), mu)
    assert rate_mu <= BETA + _slack(n)
    delta = 1e-5
    eps_true = bounds.eps_from_mu(mu, delta)
    rate_eps = _exceed_rate(v, lambda x: bounds.eps_lb_one_run_fdp(m, r, x, delta, BETA),
                            eps_true)
    assert rate_eps <= BETA + _slack(n)


# ---- comparison with Steinke, Nasr, Jagielski (2023) -----------------------------------

_GRID = [(m, r, int(round(f * r))) for m in (100, 1000) for r in sorted({m // 10, m // 2, m})
         for f in (0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)]


@pytest.mark.parametrize("delta", [1e-3, 1e-2])
def test_fdp_at_least_steinke_at_larger_delta(delta):
    for m, r, v in _GRID:
        fdp = bounds.eps_lb_one_run_fdp(m, r, v, delta, BETA)
        snj = float(bounds.eps_lb_one_run(m, r, v, delta=delta, beta=BETA))
        assert fdp >= snj - 1e-9, (m, r, v, delta, fdp, snj)


@pytest.mark.parametrize("delta", [1e-6, 1e-5, 1e-4])
def test_fdp_at_least_steinke_for_perfect_attacks(delta):
    for m, r, v in _GRID:
        if v == r:
            fdp = bounds.eps_lb_one_run_fdp(m, r, v, delta, BETA)
            snj = float(bounds.eps_lb_one_run(m, r, v, delta=delta, beta=BETA))
            assert fdp >= snj - 1e-9, (m, r, v, delta, fdp, snj)


def test_fdp_exception_small_delta_is_looser_than_steinke():
    # EXCEPTION to "the f-DP analysis is at least as tight": at delta = 0, and at small
    # m * delta (<= 0.02 on this grid) unless the attack is (nearly) perfect, the f-DP bound
    # is slightly BELOW Steinke et al.'s.  At delta = 0 this is forced: their binomial tail
    # is attained by randomized response, so no valid test can beat it; the f-DP recursion
    # only uses the constraints W_i >= f(1 - C_{i+1}), whose optimum is a larger tail
    # (e.g. m = r = 20, v = 16, eps = 1: 0.444 against P[Bin(20, 0.731) >= 16] = 0.341).
    # Recorded values (beta = 0.05; f-DP vs Steinke):
    #   (m, r, v, delta) = (1000, 1000, 950, 1e-5): 2.6917 vs 2.7008
    #   (1000, 500, 400, 1e-5): 1.1899 vs 1.1980;  (1000, 100, 80, 1e-5): 0.9428 vs 0.9553
    #   (100, 10, 9, 1e-5): 0.4157 vs 0.4273;      (2000, 2000, 1900, 1e-5): 2.7657 vs 2.7724
    #   (1000, 1000, 600, 1e-4): 0.2910 vs 0.2950, while at (1000, 100, v, 1e-4) f-DP is
    #   tighter for every v on the grid (e.g. v = 80: 0.9365 vs 0.9256).
    recorded = [((1000, 1000, 950, 1e-5), 2.6917, 2.7008),
                ((1000, 500, 400, 1e-5), 1.1899, 1.1980),
                ((1000, 100, 80, 1e-5), 0.9428, 0.9553),
                ((100, 10, 9, 1e-5), 0.4157, 0.4273)]
    for (m, r, v, delta), fdp_val, snj_val in recorded:
        fdp = bounds.eps_lb_one_run_fdp(m, r, v, delta, BETA)
        snj = float(bounds.eps_lb_one_run(m, r, v, delta=delta, beta=BETA))
        assert fdp == pytest.approx(fdp_val, abs=1e-4) and snj == pytest.approx(snj_val, abs=1e-4)
        assert fdp < snj
    # at delta = 0 never above Steinke et al., and equal for a perfect attack
    for m, r, v in _GRID:
        fdp = bounds.eps_lb_one_run_fdp(m, r, v, 0.0, BETA)
        snj = float(bounds.eps_lb_one_run(m, r, v, delta=0.0, beta=BETA))
        assert fdp <= snj * (1 + 1e-5) + 1e-12, (m, r, v, fdp, snj)
        if v == r:
            assert fdp == pytest.approx(snj, rel=1e-5)


# ---- closed forms and shape ----------------------------------------------------------

@pytest.mark.parametrize("m, r", [(10, 10), (100, 100), (1000, 1000), (1000, 37), (2000, 500)])
def test_perfect_attack_pure_dp_closed_form(m, r):
    # delta = 0, v = r: the recursion gives P[all r right] <= q^r, q = e^eps / (1 + e^eps)
    # (the W_i >= e^-eps C_{i+1} pieces telescope), which randomized response attains; so
    # eps_LB = logit(beta^(1/r)), whatever the number m - r of abstentions.
    assert bounds.eps_lb_one_run_fdp(m, r, r, 0.0, BETA) == pytest.approx(
        special.logit(BETA ** (1 / r)), rel=1e-5)


def test_perfect_attack_grows_with_r():
    rs = [5, 10, 20, 50, 100, 200, 500, 1000]
    eps = [bounds.eps_lb_one_run_fdp(1000, r, r, 1e-5, BETA) for r in rs]
    mus = [bounds.mu_lb_one_run_gdp(1000, r, r, BETA) for r in rs]
    assert np.all(np.diff(eps) > 0) and np.all(np.diff(mus) > 0)
    assert eps[0] > 0 and mus[0] > 0


@pytest.mark.parametrize("m, r", [(100, 10), (1000, 1000), (1000, 101)])
def test_no_better_than_chance_gives_zero(m, r):
    for v in range(0, r // 2 + 1, max(1, r // 20)):
        assert bounds.eps_lb_one_run_fdp(m, r, v, 1e-5, BETA) == 0.0
        assert bounds.eps_lb_one_run_fdp(m, r, v, 0.0, BETA) == 0.0
        assert bounds.mu_lb_one_run_gdp(m, r, v, BETA) == 0.0
    assert bounds.eps_lb_one_run_fdp(m, 0, 0, 1e-5) == 0.0  # no guesses at all


def test_monotone_in_v_delta_and_beta():
    m, r = 1000, 200
    vs = range(100, 201, 5)
    eps = [bounds.eps_lb_one_run_fdp(m, r, v, 1e-5, BETA) for v in vs]
    mus = [bounds.mu_lb_one_run_gdp(m, r, v, BETA) for v in vs]
    assert np.all(np.diff(eps) >= 0) and np.all(np.diff(mus) >= 0)
    assert eps[-1] > eps[len(eps) // 2] > 0 and mus[-1] > mus[len(mus) // 2] > 0
    by_delta = [bounds.eps_lb_one_run_fdp(m, r, 180, d, BETA) for d in (0.0, 1e-6, 1e-4, 1e-2)]
    assert np.all(np.diff(by_delta) <= 0)
    by_beta = [bounds.mu_lb_one_run_gdp(m, r, 180, b) for b in (0.01, 0.05, 0.2)]
    assert np.all(np.diff(by_beta) > 0)
    # nothing can be rejected once beta <= delta: revealing every canary with probability
    # delta is (0, delta)-DP and makes every guess right with probability delta
    assert bounds.eps_lb_one_run_fdp(m, r, r, 0.05, 0.05) == 0.0


def test_gdp_estimate_versus_certified_bound():
    # eps_from_mu of mu_LB assumes the GDP shape: it is an estimate, typically far above
    # the certified (eps, delta) bound from the same counts.
    mu = bounds.mu_lb_one_run_gdp(1000, 1000, 950, BETA)
    eps_cert = bounds.eps_lb_one_run_fdp(1000, 1000, 950, 1e-5, BETA)
    assert mu == pytest.approx(1.13735, abs=1e-4)
    assert eps_cert == pytest.approx(2.69175, abs=1e-4)
    assert bounds.eps_from_mu(mu, 1e-5) > eps_cert


def test_against_privacyguard_reference():
    # facebookresearch/PrivacyGuard, FDPAnalysisNode (the authors' code): GDP hypotheses
    # mu = 1 / noise on the grid noise = 0.001 + 0.01 i, the same recursion from
    # (tau c / m, tau (c' - c) / m) with tau = 0.05, and eps of the first rejected mu at
    # delta = 1e-6.  Its tests only assert eps > 0; re-deriving its output with this
    # recursion, m = 1000, c = 500 correct of c' = 800: first rejected noise 4.981, i.e.
    # mu = 0.20076 and eps = 0.8375; m = 2000, c = 1000, c' = 1500: noise 3.571, mu = 0.28003,
    # eps = 1.1990.  Our mu must lie in that grid bracket [1/4.981, 1/4.971).
    mu = bounds.mu_lb_one_run_gdp(1000, 800, 500, BETA)
    assert 1 / 4.981 <= mu < 1 / 4.971
    assert bounds.eps_from_mu(1 / 4.981, 1e-6) == pytest.approx(0.8375, abs=1e-3)
    mu2 = bounds.mu_lb_one_run_gdp(2000, 1500, 1000, BETA)
    assert 1 / 3.571 <= mu2 < 1 / 3.561
    assert bounds.eps_from_mu(1 / 3.571, 1e-6) == pytest.approx(1.1990, abs=1e-3)


# ---- input validation and speed ------------------------------------------------------

@pytest.mark.parametrize("kwargs, name", [
    (dict(m=np.nan, r=10, v=5), "m"), (dict(m=100.5, r=10, v=5), "m"),
    (dict(m=0, r=0, v=0), "m"), (dict(m="100", r=10, v=5), "m"),
    (dict(m=100, r=np.inf, v=5), "r"), (dict(m=100, r=10.2, v=5), "r"),
    (dict(m=100, r=-1, v=0), "r"), (dict(m=100, r=101, v=5), "r"),
    (dict(m=100, r=[10, 20], v=5), "r"), (dict(m=100, r=True, v=0), "r"),
    (dict(m=100, r=10, v=-1), "v"), (dict(m=100, r=10, v=11), "v"),
    (dict(m=100, r=10, v=np.nan), "v"), (dict(m=100, r=10, v=4.5), "v"),
])
def test_bad_counts_raise(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name}="):
        bounds.eps_lb_one_run_fdp(**kwargs, delta=1e-5)
    with pytest.raises(ValueError, match=rf"^{name}="):
        bounds.mu_lb_one_run_gdp(**kwargs)


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.1, 1.5, np.nan, np.inf, "0.05"])
def test_bad_beta_raises(bad):
    with pytest.raises(ValueError, match=r"^beta="):
        bounds.eps_lb_one_run_fdp(100, 10, 9, 1e-5, beta=bad)
    with pytest.raises(ValueError, match=r"^beta="):
        bounds.mu_lb_one_run_gdp(100, 10, 9, beta=bad)


@pytest.mark.parametrize("bad", [1.0, -1e-9, 2.0, np.nan, np.inf, None])
def test_bad_delta_raises(bad):
    with pytest.raises(ValueError, match=r"^delta="):
        bounds.eps_lb_one_run_fdp(100, 10, 9, bad)


def test_numpy_and_whole_float_inputs_accepted():
    ref = bounds.eps_lb_one_run_fdp(1000, 100, 90, 1e-5)
    assert bounds.eps_lb_one_run_fdp(np.int64(1000), np.int32(100), np.uint16(90),
                                     np.float64(1e-5)) == ref
    assert bounds.eps_lb_one_run_fdp(1000.0, np.float64(100.0), 90, 1e-5) == ref
    assert bounds.mu_lb_one_run_gdp(np.int64(1000), np.int64(100), np.int64(90)) == \
        bounds.mu_lb_one_run_gdp(1000, 100, 90)
    assert isinstance(ref, float)


def test_fast_enough_for_sweeps_over_r():
    m = 2000
    rs = range(20, m + 1, 80)
    start = time.perf_counter()
    for r in rs:
        bounds.eps_lb_one_run_fdp(m, r, int(0.9 * r), 1e-5)
        bounds.mu_lb_one_run_gdp(m, r, int(0.8 * r))
    per_call = (time.perf_counter() - start) / (2 * len(rs))
    assert per_call < 0.1
