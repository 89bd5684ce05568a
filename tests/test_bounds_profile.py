"""The certified test of a claimed privacy profile (dpaudit.bounds.profile) and the profile it
is tested against (dpaudit.accounting.privacy_profile): against closed forms, a direct
computation, and by simulation on mechanisms whose profile is known, where it must fire at
most alpha of the time at the claim and far sooner than the eps test at twice the claim."""

import logging
import math
from functools import partial

import numpy as np
import pytest
from scipy import stats

from dpaudit import accounting, bounds

logging.getLogger("absl").setLevel(logging.ERROR)


def gaussian_profile(mu: float, eps: np.ndarray) -> np.ndarray:
    """The mu-GDP mechanism's profile (Dong, Roth and Su 2022, Corollary 2.13)."""
    return stats.norm.cdf(-eps / mu + mu / 2) - np.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)


def test_privacy_profile_is_the_gaussian_closed_form_at_sample_rate_1():
    """T full-batch steps of noise multiplier sigma are sqrt(T) / sigma-GDP: PLD is an upper
    bound on the closed form, and within 1e-6 of it."""
    eps = np.linspace(0, 8, 81)
    got = accounting.privacy_profile(2.0, 1.0, 10, eps)
    want = gaussian_profile(math.sqrt(10) / 2.0, eps)
    assert np.all(got >= want) and np.max(got - want) < 1e-6
    assert got[0] == pytest.approx(2 * stats.norm.cdf(math.sqrt(10) / 4) - 1, abs=1e-6)


def test_privacy_profile_bounds_both_directions_of_a_subsampled_step():
    """One Poisson-subsampled Gaussian step: removing the row compares the mixture
    P = (1 - q) N(0, s^2) + q N(1, s^2) with Q = N(0, s^2), adding it Q with P; each
    hockey-stick divergence in closed form at the likelihood ratio's level set. The
    add/remove profile is the larger of the two."""
    s, q = 1.0, 0.2
    eps = np.linspace(0, 3, 31)
    x = s ** 2 * np.log((np.exp(eps) - 1 + q) / q) + 0.5  # P/Q = e^eps
    remove = (1 - q) * stats.norm.sf(x / s) + q * stats.norm.sf((x - 1) / s) \
        - np.exp(eps) * stats.norm.sf(x / s)
    c = np.exp(-eps) - 1 + q  # Q/P = e^eps exists only where e^-eps > 1 - q
    x = s ** 2 * np.log(np.where(c > 0, c, 1.0) / q) + 0.5
    add = np.where(c > 0, stats.norm.cdf(x / s) - np.exp(eps) * (
        (1 - q) * stats.norm.cdf(x / s) + q * stats.norm.cdf((x - 1) / s)), 0.0)
    got = accounting.privacy_profile(s, q, 1, eps)
    assert np.all(got >= np.maximum(remove, add))
    assert np.max(got - np.maximum(remove, add)) < 1e-6
    assert add[0] == pytest.approx(remove[0], rel=1e-9) and add[1] > 0  # both directions live
    with pytest.raises(ValueError, match="sigma=0.0, steps=1: need sigma > 0"):
        accounting.privacy_profile(0.0, q, 1, eps)


def _direct_violation(ct_pos, n, ct_neg, alpha, eps, deltas):
    """V by scipy's exact two-sided interval (alpha/2 per side) and a loop over e."""
    tpr_lo = stats.binomtest(ct_pos, n).proportion_ci(1 - alpha, "exact").low
    fpr_hi = stats.binomtest(ct_neg, n).proportion_ci(1 - alpha, "exact").high
    best = -math.inf
    for e, d in zip(eps, deltas):
        lb = max(tpr_lo - math.exp(e) * fpr_hi, (1 - fpr_hi) - math.exp(e) * (1 - tpr_lo))
        best = max(best, lb - d)
    return best


@pytest.mark.parametrize("ct_pos,ct_neg", [(900, 100), (600, 400), (520, 480), (1000, 0),
                                           (30, 700)])
def test_violation_is_the_direct_computation(ct_pos, ct_neg):
    eps = np.linspace(0, 6, 61)
    deltas = gaussian_profile(1.0, eps)
    got = bounds.profile_violation(ct_pos, 1000, ct_neg, 1000, 0.05, eps, deltas)
    assert got == pytest.approx(_direct_violation(ct_pos, 1000, ct_neg, 0.05, eps, deltas),
                                abs=1e-9)
    many = bounds.profile_violation([ct_pos, 500], 1000, [ct_neg, 500], 1000, 0.05, eps,
                                    deltas)
    assert many[0] == got and many[1] < 0


def test_the_audit_reports_the_maximising_epsilon_and_both_deltas_there():
    """Separable scores against the 1-GDP profile: V = delta_lb(e*) - delta_claim(e*) at the
    grid's maximiser, and delta_lb(e*) is the one-sided Clopper-Pearson difference there."""
    eps = np.linspace(0, 6, 61)
    deltas = gaussian_profile(1.0, eps)
    pos, neg = np.arange(100.0) + 1000, np.arange(100.0)
    res = bounds.profile_audit(pos, neg, pos, neg, eps, deltas, 0.05)
    assert res.violated and (res.ct_pos, res.n_pos, res.ct_neg, res.n_neg) == (100, 100, 0, 100)
    assert 99 < res.threshold < 1000
    tpr_lo, fpr_hi = 0.025 ** 0.01, 1 - 0.025 ** 0.01
    lb = np.maximum(tpr_lo - np.exp(eps) * fpr_hi, (1 - fpr_hi) - np.exp(eps) * (1 - tpr_lo))
    j = int(np.argmax(lb - deltas))
    assert (res.eps_star, res.delta_claim) == (eps[j], deltas[j])
    assert res.delta_lb == pytest.approx(lb[j], abs=1e-12)
    assert res.violation == pytest.approx(lb[j] - deltas[j], abs=1e-12)
    with pytest.raises(ValueError, match=r"deltas \(shape \(60,\), .*\): must be numbers in "
                                         r"\[0, 1\], one per entry of epsilons \(shape "
                                         r"\(61,\)\)"):
        bounds.profile_audit(pos, neg, pos, neg, eps, deltas[:-1], 0.05)


def _rate(draw, eps, deltas, alpha, reps, seed):
    """How often the profile test fires over ``reps`` audits of ``draw(rng, n) -> (val_in,
    val_out, eval_in, eval_out)``."""
    rng = np.random.default_rng(seed)
    return np.mean([bounds.profile_audit(*draw(rng), eps, deltas, alpha).violated
                    for _ in range(reps)])


@pytest.mark.parametrize("alpha", [0.05, 0.5])
def test_the_test_holds_its_level_on_the_gaussian_it_claims(alpha):
    """1-GDP scores against their own closed-form profile: fires at most alpha of the time
    (+ 3 Monte-Carlo standard errors). Measured with 300 audits: 0 at alpha = 0.05 and 11%
    at 0.5; choosing the threshold on the evaluation runs themselves fires in 81% at 0.5,
    and plug-in rates (alpha near 1: no confidence bound) in 45%: either mistake fails."""
    eps = np.linspace(0, 8, 161)
    reps, n = 150, 300

    def draw(rng):
        return (rng.normal(1, 1, n), rng.normal(0, 1, n), rng.normal(1, 1, n),
                rng.normal(0, 1, n))

    rate = _rate(draw, eps, gaussian_profile(1.0, eps), alpha, reps, 0)
    assert rate <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / reps)


# DP-SGD claiming eps 2 at delta 1e-5 (RDP), q = 0.2, T = 100: the case-study's setting.
Q, T, SIGMA = 0.2, 100, 4.5018053  # accounting.noise_multiplier(2, 0.2, 100, 1e-5, "rdp")
GRID = np.linspace(0, 8, 161)


@pytest.fixture(scope="module")
def dpsgd_claim():
    assert accounting.noise_multiplier(2, Q, T, 1e-5, "rdp") == pytest.approx(SIGMA, rel=1e-6)
    return accounting.privacy_profile(SIGMA, Q, T, GRID)


def _llr_runs(noise: float, n: int):
    """Runs of T Poisson-subsampled Gaussian steps with the canary's sensitivity 1 and
    ``noise`` std, scored by the claimed mechanism's likelihood ratio (the white-box score)."""
    def scores(rng, inside):
        x = noise * rng.standard_normal((n, T)) + (inside & (rng.random((n, T)) < Q))
        return np.log1p(Q * np.expm1((2 * x - 1) / (2 * SIGMA ** 2))).sum(1)

    return lambda rng: (scores(rng, True), scores(rng, False), scores(rng, True),
                        scores(rng, False))


def test_the_test_holds_its_level_on_dpsgd_at_the_claimed_noise(dpsgd_claim):
    """The exact mechanism of the claimed profile (PLD upper bound) at alpha = 0.5."""
    reps = 100
    rate = _rate(_llr_runs(SIGMA, 300), GRID, dpsgd_claim, 0.5, reps, 1)
    assert rate <= 0.5 + 3 * math.sqrt(0.25 / reps)


def test_half_the_noise_is_flagged_with_runs_at_which_the_eps_test_sees_nothing(dpsgd_claim):
    """Half the claimed noise (true eps 4.3, against the claim 2): with 1000 runs per side
    the profile test fires in almost every audit at alpha = 0.05, while the eps test at the
    same threshold machinery never certifies eps_LB > 2 (even a 2x-GDP mechanism needs
    about 10^4 runs per side for that)."""
    draw, rng = _llr_runs(SIGMA / 2, 1000), np.random.default_rng(2)
    eps_test = partial(bounds.eps_lb_clopper_pearson, delta=1e-5)
    fired = eps_fired = 0
    for _ in range(15):
        runs = draw(rng)
        fired += bounds.profile_audit(*runs, GRID, dpsgd_claim, 0.05).violated
        eps_fired += bounds.threshold_holdout_audit(*runs, eps_test, 0.05).value > 2
    assert fired >= 14 and eps_fired == 0
    assert accounting.epsilon(SIGMA / 2, Q, T, 1e-5, "pld") == pytest.approx(4.29, abs=0.01)
