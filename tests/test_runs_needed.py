"""dpaudit.experiments.runs_needed: the ideal DP-SGD canary pair against dp_accounting, and the
power of audit-impl's test on it against independent computations (a perfect attack's closed
form, exact binomial sums for a Gaussian pair)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpaudit import accounting, bounds
from dpaudit.cli import main
from dpaudit.experiments import runs_needed as rn
from dpaudit.experiments.tramer import min_runs


def test_the_pair_has_the_accounted_epsilon_and_calibration_finds_its_noise():
    pld = accounting.epsilon(1.0, 0.1, 10, 1e-5, "pld")
    grid = rn.poisson_pair(1.0, 0.1, 10, 2 ** 18).epsilon(1e-5)
    assert pld - 0.02 <= grid <= pld + 1e-3  # rounded down: never above, barely below
    sigma = rn.calibrate(pld, 0.1, 10, 1e-5)
    assert 0.99 <= sigma <= 1.0 + 1e-3


def test_a_perfect_attack_needs_exactly_min_runs():
    """q = 1, one step, sigma 0.02: N(1) against N(0) 50 standard deviations apart, so every
    replication separates and the answer is the closed form of tramer.min_runs."""
    q = rn.Question(2.0, 1e-5, 1.0, 1.0, 1, 1e-10, val_runs=50, reps=20)
    got = rn.answer(q, grid=rn.poisson_pair(0.02, 1.0, 1, 2 ** 16).coarse(rn.LEVELS))
    assert got["runs"] == got["min_runs"] == min_runs(2.0, 1e-5, 1e-10)
    assert got["tried"][0]["power"] == 1.0


def test_power_of_a_gaussian_pair_matches_exact_binomial_sums():
    """Given the chosen thresholds, the power at n is an exact double sum over the binomial
    counts (continuous normal tails, every count's Clopper-Pearson bound)."""
    sigma, n, eps, delta, alpha = 0.4, 40, 1.5, 1e-5, 0.05
    grid = rn.poisson_pair(sigma, 1.0, 1, 2 ** 16)
    rng = np.random.default_rng(1)
    taus = rn.thresholds(grid, 30, 200, delta, alpha, rng)
    sim = np.mean([rn.eps_lbs(grid, taus, n, delta, alpha, rng) > eps for _ in range(10)])
    counts = np.arange(n + 1)
    refutes = bounds.eps_lb_clopper_pearson(counts[:, None], n, counts[None, :], n, alpha,
                                            delta) > eps
    x = sigma ** 2 * taus + 0.5  # the LLR (2x - 1) / (2 sigma^2) at each threshold
    exact = np.mean([stats.binom.pmf(counts, n, stats.norm.sf((t - 1) / sigma))
                     @ refutes @ stats.binom.pmf(counts, n, stats.norm.sf(t / sigma))
                     for t in x])
    assert 0.2 < exact < 0.8  # a point where the power is not trivially 0 or 1
    assert abs(sim - exact) < 4 * math.sqrt(exact * (1 - exact) / 2000) + 0.01


def test_the_answer_falls_as_the_bug_grows():
    def runs(k: float) -> int:  # the command's path, on a smaller grid (seconds)
        grid = rn.poisson_pair(rn.calibrate(k, 1.0, 1, 1e-5), 1.0, 1, 2 ** 16)
        return rn.answer(rn.Question(1.0, 1e-5, k, 1.0, 1, 0.05, reps=60),
                         grid=grid.coarse(rn.LEVELS))["runs"]

    answers = [runs(k) for k in (4.0, 8.0, 16.0)]
    assert answers[0] > answers[1] >= answers[2] >= min_runs(1.0, 1e-5, 0.05)


def test_claim_p_value_is_where_the_bound_crosses_the_claim():
    p = bounds.claim_p_value(138, 1500, 8, 1500, 2.0, 1e-5)  # the shuffle-once row's counts
    assert p == pytest.approx(0.0484, abs=5e-4)
    assert bounds.eps_lb_clopper_pearson(138, 1500, 8, 1500, p, 1e-5) > 2.0
    assert bounds.eps_lb_clopper_pearson(138, 1500, 8, 1500, p * 0.999, 1e-5) <= 2.0
    assert bounds.claim_p_value(50, 500, 60, 500, 2.0, 1e-5) == 1.0


def test_cli_prints_a_line_per_count_and_the_answer(capsys):
    assert main(["runs-needed", "--eps", "1", "--delta", "1e-5", "--factor", "8", "--q", "1",
                 "--steps", "1", "--alpha", "0.05", "--reps", "30"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("runs per side") and "Answer: about" in out[-1]
    assert len(out) >= 3
