"""Noise calibration (accounting.noise_multiplier) against dp_accounting's warnings: the
bracket's first point, sigma = 1, is where dp_accounting cannot compute the smallest
fractional orders at q = 0.2 (Tramer et al.'s audit); the sigma found does not depend on
them, and is checked against a quadrature of the same RDP order."""

from __future__ import annotations

import logging
import math

import pytest
from scipy import integrate, stats

from dpaudit import accounting

Q, STEPS, DELTA = 0.2, 100, 1e-5  # config tramer: batch 100 of n_train 500, 20 epochs


def _rdp_by_quadrature(sigma: float, alpha: float) -> float:
    """RDP of order alpha of the Poisson-subsampled Gaussian (add/remove), by adaptive
    quadrature of E_{z ~ N(0, sigma^2)}[(1 - q + q exp((2z - 1) / (2 sigma^2)))^alpha]
    (scipy; independent of dp_accounting's series)."""
    f = lambda z: (stats.norm.pdf(z, scale=sigma)
                   * (1 - Q + Q * math.exp((2 * z - 1) / (2 * sigma**2))) ** alpha)
    total, err = integrate.quad(f, -20 * sigma, alpha + 20 * sigma, epsabs=0, epsrel=1e-13,
                                limit=500, points=[0.5, alpha])
    assert err < 1e-12 * total
    return math.log(total) / (alpha - 1)


def test_calibration_prints_no_warning_and_meets_eps(caplog):
    caplog.set_level(logging.WARNING, logger="absl")
    sigma = accounting.noise_multiplier(0.21, Q, STEPS, DELTA, "rdp")
    assert not [r for r in caplog.records if "failed to converge" in r.getMessage()]
    assert sigma == pytest.approx(34.443754796836764, rel=1e-9)
    # The best order there is 63; the same conversion (dp_accounting's) of an independent
    # value of its RDP gives eps = 0.21.
    alpha = 63.0
    rdp = STEPS * _rdp_by_quadrature(sigma, alpha)
    eps = rdp + math.log1p(-1 / alpha) - (math.log(DELTA) + math.log(alpha)) / (alpha - 1)
    assert eps == pytest.approx(0.21, rel=1e-8)
    # The tight PLD accountant calls this sigma about 0.19 (RDP is an upper bound).
    assert 0.18 < accounting.epsilon(sigma, Q, STEPS, DELTA, "pld") < 0.21


def test_the_warning_still_shows_where_it_matters(caplog):
    """A root near sigma = 1: Brent's method evaluates there and dp_accounting's warning
    about the orders it leaves out is printed."""
    caplog.set_level(logging.WARNING, logger="absl")
    sigma = accounting.noise_multiplier(16.0, Q, STEPS, DELTA, "rdp")
    assert 1 < sigma < math.e
    assert [r for r in caplog.records if "failed to converge" in r.getMessage()]
