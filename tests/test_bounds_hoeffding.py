"""Closed-form Hoeffding one-run bound (the optional exercise of HW3 section 2, the HW3
homework of DA 5001/6400, IIT Madras, 2024): ``dpaudit.bounds.eps_lb_hoeffding``."""

import math

import numpy as np
import pytest
from scipy import optimize, stats

from dpaudit.bounds import eps_lb_hoeffding, eps_lb_one_run


def _hoeffding_tail(r: int, v: int, q: float) -> float:
    """exp(-2 r (v/r - q)^2): Hoeffding's bound on P[Bin(r, q) >= v] for v/r > q."""
    return math.exp(-2 * r * (v / r - q) ** 2)


def _logistic(eps: float) -> float:
    return 1.0 / (1.0 + math.exp(-eps))


def test_never_exceeds_exact_binomial_bound_on_a_grid():
    rs = np.array([1, 2, 5, 10, 20, 50, 100, 300, 1000, 5000])
    for beta in (0.5, 0.05, 1e-4):
        for r in rs:
            v = np.arange(0, r + 1, max(1, r // 97))  # ~100 values of v incl. 0 (and r)
            v = np.unique(np.append(v, r))
            hoeff = np.asarray(eps_lb_hoeffding(r, v, beta))
            exact = np.asarray(eps_lb_one_run(r, r, v, 0.0, beta))
            assert hoeff.shape == v.shape
            assert np.all(hoeff >= 0) and np.all(np.isfinite(hoeff))
            assert np.all(hoeff <= exact + 1e-9), (r, beta, v[hoeff > exact + 1e-9])
            # and the bound is not vacuous: all guesses right at large r certifies eps > 0
            if r >= 20:
                assert hoeff[-1] > 0
    # strictly looser where both are positive (Hoeffding ignores the variance q(1-q))
    assert eps_lb_hoeffding(1000, 900) < eps_lb_one_run(1000, 1000, 900, 0.0, 0.05)


def test_hoeffding_tail_equals_beta_at_the_returned_eps():
    for r, v, beta in [(100, 80, 0.05), (1000, 700, 0.05), (1000, 990, 1e-4), (30, 30, 0.01),
                       (4, 4, 0.3)]:
        eps = eps_lb_hoeffding(r, v, beta)
        assert eps > 0
        q = _logistic(eps)
        assert v / r > q  # Hoeffding's condition holds at the boundary
        assert _hoeffding_tail(r, v, q) == pytest.approx(beta, rel=1e-9)
        # an independent root find of tail(q) = beta on (1/2, v/r) gives the same q
        q_root = optimize.brentq(lambda x: _hoeffding_tail(r, v, x) - beta, 0.5, v / r,
                                 xtol=1e-15, rtol=1e-14)
        assert q == pytest.approx(q_root, rel=1e-10)
        # slightly larger eps: the Hoeffding tail exceeds beta (not rejected any more)
        assert _hoeffding_tail(r, v, _logistic(eps + 1e-6)) > beta
        # the exact binomial tail at the returned eps is at most beta (Hoeffding is an
        # upper bound on it), which is why the bound is valid
        assert stats.binom.sf(v - 1, r, q) <= beta * (1 + 1e-12)


def test_zero_when_below_chance_and_closed_form():
    assert eps_lb_hoeffding(100, 50) == 0.0
    assert eps_lb_hoeffding(100, 0) == 0.0
    assert eps_lb_hoeffding(1, 1, 0.05) == 0.0  # q* = 1 - sqrt(ln 20 / 2) < 1/2
    r, v, beta = 400, 300, 0.05
    q = v / r - math.sqrt(math.log(1 / beta) / (2 * r))
    assert eps_lb_hoeffding(r, v, beta) == pytest.approx(math.log(q / (1 - q)), rel=1e-12)
    assert isinstance(eps_lb_hoeffding(r, v, beta), float)


def test_broadcasts_like_eps_lb_one_run():
    r = 2 * np.arange(1, 6)[:, None]          # (5, 1)
    v = np.array([[2, 4, 6, 8, 10]])          # (1, 5); v > r entries are masked below
    v = np.minimum(v, r)
    out = eps_lb_hoeffding(r, v, 0.05)
    assert out.shape == (5, 5)
    for i in range(5):
        for j in range(5):
            assert out[i, j] == eps_lb_hoeffding(int(r[i, 0]), int(v[i, j]), 0.05)


def test_sound_on_randomized_response_of_known_eps():
    # v ~ Bin(r, q(eps)) is exactly the eps-DP worst case (randomized response); a 95%
    # lower bound may exceed eps in at most 5% of the runs.
    rng = np.random.default_rng(0)
    reps, beta = 20_000, 0.05
    for eps, r in [(0.5, 200), (1.0, 1000), (2.0, 50), (4.0, 1000)]:
        v = rng.binomial(r, _logistic(eps), size=reps)
        lb = np.asarray(eps_lb_hoeffding(r, v, beta))
        exceed = np.mean(lb > eps)
        assert exceed <= beta + 3 * math.sqrt(beta * (1 - beta) / reps), (eps, r, exceed)
        # and the exact bound is at least as large in every run
        assert np.all(lb <= np.asarray(eps_lb_one_run(r, r, v, 0.0, beta)) + 1e-9)
        if r >= 1000:
            assert lb.mean() > 0.5 * eps  # informative with many guesses


@pytest.mark.parametrize("r, v, beta, name", [
    (10, 11, 0.05, "v"),
    (10, -1, 0.05, "v"),
    (0, 0, 0.05, "r"),
    (10.5, 3, 0.05, "r"),
    (10, 2.5, 0.05, "v"),
    (np.inf, 3, 0.05, "r"),
    (10, np.nan, 0.05, "v"),
    (10, 3, 0.0, "beta"),
    (10, 3, 1.0, "beta"),
    (10, 3, float("nan"), "beta"),
    (10, 3, [0.05, 0.1], "beta"),
    (np.array([10, 20]), np.array([3, 21]), 0.05, "v"),
])
def test_bad_input_names_the_argument(r, v, beta, name):
    with pytest.raises(ValueError, match=rf"^{name}="):
        eps_lb_hoeffding(r, v, beta)
