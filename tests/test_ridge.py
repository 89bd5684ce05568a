"""Private ridge regression (section 1 of the HW3 homework of DA 5001/6400, IIT Madras, 2024):
closed form, sensitivity, zCDP, audit.  Derivations: docs/ridge.md."""

import json

import dp_accounting
import numpy as np
import pytest
from scipy import linalg, optimize, stats

from dpaudit.experiments import ridge as rg
from dpaudit.cli import main
from dpaudit.io import read_table

R, B = 1.0, 1.0


def _domain_data(rng, n, d):
    """Data in the domain of `release`, half of it on the boundary (||x|| = R, |y| = B)."""
    X = rg.clip_rows(rng.normal(size=(n, d)) * rng.uniform(0.1, 2.0, size=(n, 1)), R)
    y = np.clip(rng.normal(scale=1.5, size=n), -B, B)
    return X, y


def test_ridge_fit_matches_lstsq_on_augmented_system():
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(30, 5)), rng.normal(size=30)
    lam = 2.5
    aug_X = np.vstack([X, np.sqrt(lam) * np.eye(5)])
    aug_y = np.concatenate([y, np.zeros(5)])
    ref = np.linalg.lstsq(aug_X, aug_y, rcond=None)[0]
    np.testing.assert_allclose(rg.ridge_fit(X, y, lam), ref, rtol=1e-10, atol=1e-12)


def _hessian(X, lam):
    return X.T @ X + lam * np.eye(X.shape[1])


def test_q12_added_point_minimiser_is_augmented_normal_equations():
    # Q1.2: argmin F(theta) + (x~^T theta - y~)^2 = (H + x~ x~^T)^-1 (b + y~ x~)
    rng = np.random.default_rng(10)
    for n, d, lam in [(20, 4, 0.3), (3, 9, 2.0)]:
        X, y = rng.normal(size=(n, d)), rng.normal(size=n)
        x, yt = rng.normal(size=d), rng.normal()
        closed = np.linalg.solve(_hessian(X, lam) + np.outer(x, x), X.T @ y + yt * x)
        fit = rg.ridge_fit(np.vstack([X, x]), np.append(y, yt), lam)
        np.testing.assert_allclose(fit, closed, rtol=1e-10, atol=1e-12)
        # first-order condition of F~: 2 X^T (X theta - y) + 2 x~ (x~^T theta - y~) + 2 lam theta
        grad = X.T @ (X @ fit - y) + x * (x @ fit - yt) + lam * fit
        np.testing.assert_allclose(grad, 0.0, atol=1e-10)


def test_q14_inverse_hessian_norm_at_most_R_over_lam():
    rng = np.random.default_rng(11)
    worst = 0.0
    for _ in range(200):
        n, d = int(rng.integers(1, 30)), int(rng.integers(1, 10))
        lam = float(10 ** rng.uniform(-2, 2))
        X = rng.normal(size=(n, d)) * rng.uniform(0.01, 3.0)
        H = _hessian(X, lam)
        assert np.linalg.eigvalsh(H).min() >= lam * (1 - 1e-12)  # H >= lam I
        x = rg.clip_rows(rng.normal(size=(1, d)) * rng.uniform(0.1, 3.0), R)[0]  # ||x|| <= R
        ratio = np.linalg.norm(linalg.solve(H, x, assume_a="pos")) / (R / lam)
        assert ratio <= 1 + 1e-12
        worst = max(worst, ratio)
    assert worst > 0.5  # the bound is not loose by orders of magnitude on this data
    # attained: x of norm R orthogonal to the rows of X (here d > n) has H^-1 x = x / lam
    X = rng.normal(size=(3, 6))
    x = linalg.null_space(X)[:, 0] * R
    assert np.linalg.norm(linalg.solve(_hessian(X, 0.7), x)) == pytest.approx(R / 0.7, rel=1e-12)


def test_q16_removal_uses_the_residual_under_the_larger_model():
    # With D_large = D_small + {(x, y)} (theta_s, H_s and theta_l, H_l):
    #   theta_s - theta_l = H_s^-1 x (x^T theta_s - y) / (1 + x^T H_s^-1 x)    (Q1.3)
    #                     = H_l^-1 x (x^T theta_s - y)                          (a)
    #                     = H_s^-1 x (x^T theta_l - y)                          (b)
    rng = np.random.default_rng(12)
    for n, d, lam in [(15, 4, 0.5), (4, 10, 3.0), (40, 40, 20.0)]:
        X, y = rng.normal(size=(n, d)), rng.normal(size=n)
        x, yt = rng.normal(size=d), 2 * rng.normal()
        t_s = rg.ridge_fit(X, y, lam)
        t_l = rg.ridge_fit(np.vstack([X, x]), np.append(y, yt), lam)
        H_s, H_l = _hessian(X, lam), _hessian(X, lam) + np.outer(x, x)
        c = x @ np.linalg.solve(H_s, x)
        np.testing.assert_allclose(x @ t_l - yt, (x @ t_s - yt) / (1 + c), rtol=1e-9)
        for shift in (np.linalg.solve(H_l, x) * (x @ t_s - yt),
                      np.linalg.solve(H_s, x) * (x @ t_l - yt)):
            np.testing.assert_allclose(t_s - t_l, shift, rtol=1e-9, atol=1e-12)


def test_theta_norm_bound_behind_residual_bound():
    # ||theta*|| <= ||y|| / (2 sqrt(lam)) (singular values s / (s^2 + lam) <= 1 / (2 sqrt(lam)))
    rng = np.random.default_rng(13)
    for _ in range(200):
        n, d = int(rng.integers(1, 30)), int(rng.integers(1, 10))
        lam = float(10 ** rng.uniform(-2, 2))
        X, y = rng.normal(size=(n, d)) * rng.uniform(0.01, 5.0), rng.normal(size=n)
        assert np.linalg.norm(rg.ridge_fit(X, y, lam)) <= (
            np.linalg.norm(y) / (2 * np.sqrt(lam)) * (1 + 1e-10))
    # attained by n rows sqrt(lam / n) e1 with labels B: ||theta*|| = B sqrt(n) / (2 sqrt(lam))
    lam, n = 9.0, 50
    X = np.zeros((n, 3))
    X[:, 0] = np.sqrt(lam / n)
    theta = rg.ridge_fit(X, np.full(n, B), lam)
    assert np.linalg.norm(theta) == pytest.approx(B * np.sqrt(n) / (2 * np.sqrt(lam)), rel=1e-12)
    # M = R max ||theta*|| + B with ||y|| <= B sqrt(n_max): residual_bound's formula
    assert rg.residual_bound(R, B, lam, n) == pytest.approx(
        R * B * np.sqrt(n) / (2 * np.sqrt(lam)) + B, rel=1e-14)


def test_sherman_morrison_equals_direct_difference():
    rng = np.random.default_rng(1)
    for n, d, lam in [(20, 4, 0.3), (5, 12, 2.0), (50, 50, 10.0)]:
        X, y = rng.normal(size=(n, d)), rng.normal(size=n)
        x, yt = rng.normal(size=d), 3 * rng.normal()
        direct = rg.ridge_fit(X, y, lam) - rg.ridge_fit(np.vstack([X, x]), np.append(y, yt), lam)
        np.testing.assert_allclose(rg.sherman_morrison_shift(X, y, lam, x, yt), direct,
                                   rtol=1e-9, atol=1e-12)


def test_sensitivity_bound_holds_for_add_and_remove_neighbours():
    rng = np.random.default_rng(2)
    worst = 0.0
    for trial in range(300):
        n, d = int(rng.integers(1, 40)), int(rng.integers(1, 8))
        lam = float(10 ** rng.uniform(-1, 2))
        X, y = _domain_data(rng, n + 1, d)
        if trial % 3 == 0:  # adversarial: all rows along one axis, aligned labels
            X[:, 1:] = 0.0
            X[:, 0] = rng.uniform(0, R) * R
            y[:-1], y[-1] = B, -B
        # D_small = first n rows; D_large adds the last (addition); reversed = removal.
        t_small, t_large = rg.ridge_fit(X[:-1], y[:-1], lam), rg.ridge_fit(X, y, lam)
        change = np.linalg.norm(t_small - t_large)
        M = rg.residual_bound(R, B, lam, n + 1)
        bound = rg.sensitivity(M, R, lam)
        # residuals of the differing point under both models obey the domain bound M ...
        e_small, e_large = X[-1] @ t_small - y[-1], X[-1] @ t_large - y[-1]
        assert max(abs(e_small), abs(e_large)) <= M * (1 + 1e-12)
        # ... and either one gives the MR/lam bound (Q1.5 addition, Q1.6 removal)
        assert change <= R * abs(e_small) / lam * (1 + 1e-9) + 1e-15
        assert change <= R * abs(e_large) / lam * (1 + 1e-9) + 1e-15
        worst = max(worst, change / bound)
    assert worst <= 1.0


def test_sensitivity_attained_for_worst_case_point():
    rng = np.random.default_rng(3)
    lam, n, d = 4.0, 10, 20
    X, y = _domain_data(rng, n, d)
    # x orthogonal to the span of D (d > n): H_small^-1 x = x / lam exactly.
    x = rng.normal(size=d)
    x -= X.T @ np.linalg.lstsq(X.T, x, rcond=None)[0]
    x *= R / np.linalg.norm(x)
    t_small = rg.ridge_fit(X, y, lam)
    t_large = rg.ridge_fit(np.vstack([X, x]), np.append(y, B), lam)
    change = np.linalg.norm(t_small - t_large)
    # removal with the residual under the larger model (Q1.6): fraction 1 of M R / lam
    assert change == pytest.approx(R * abs(x @ t_large - B) / lam, rel=1e-10)
    # addition (Q1.5): fraction 1 / (1 + R^2 / lam) = 0.8 of M R / lam
    assert change / (R * abs(x @ t_small - B) / lam) == pytest.approx(lam / (lam + R**2),
                                                                         rel=1e-10)


def test_domain_residual_bound_is_within_factor_two_of_a_construction():
    # n rows sqrt(lam/n) e1 with labels B, point (R e1, -B): closed form of the change
    lam, n = 25.0, 400
    X = np.zeros((n, 2))
    X[:, 0] = np.sqrt(lam / n)
    change = np.linalg.norm(rg.sherman_morrison_shift(X, np.full(n, B), lam, [R, 0.0], -B))
    closed = R * B * (R * np.sqrt(n * lam) / (2 * lam) + 1) / (2 * lam + R**2)
    assert change == pytest.approx(closed, rel=1e-10)
    bound = rg.sensitivity(rg.residual_bound(R, B, lam, n + 1), R, lam)
    assert 0.45 < change / bound <= 1.0


def test_zcdp_sigma_formula_and_released_noise():
    M, lam, rho = 1.7, 3.0, 0.4
    sigma = rg.zcdp_sigma(M, R, lam, rho)
    assert sigma**2 == pytest.approx(M**2 * R**2 / (2 * lam**2 * rho), rel=1e-14)
    # Renyi divergence of Gaussians at the sensitivity: alpha Delta^2 / (2 sigma^2) = alpha rho
    assert rg.sensitivity(M, R, lam) ** 2 / (2 * sigma**2) == pytest.approx(rho, rel=1e-14)
    rng = np.random.default_rng(4)
    X, y = _domain_data(rng, 30, 40)
    theta = rg.ridge_fit(X, y, lam)
    noise = np.concatenate([rg.release(X, y, lam, R, B, 31, rho, rng) - theta
                            for _ in range(100)])
    expected = rg.zcdp_sigma(rg.residual_bound(R, B, lam, 31), R, lam, rho)
    assert stats.kstest(noise / expected, "norm").pvalue > 1e-3


def test_zcdp_to_dp_against_dp_accounting():
    delta = 1e-5
    rhos = np.array([0.05, 0.5, 2.0])
    eps_bs, eps_exact = rg.zcdp_to_dp(rhos, delta)
    np.testing.assert_allclose(eps_bs, rhos + 2 * np.sqrt(rhos * np.log(1 / delta)))
    for rho, bs, exact in zip(rhos, eps_bs, eps_exact):
        event = dp_accounting.GaussianDpEvent(1 / np.sqrt(2 * rho))  # sensitivity 1
        pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
        rdp = dp_accounting.rdp.RdpAccountant()
        pld.compose(event)
        rdp.compose(event)
        assert exact == pytest.approx(pld.get_epsilon(delta), abs=2e-3)  # exact profile
        assert exact < rdp.get_epsilon(delta) < bs  # RDP conversion lies in between


def test_bun_steinke_conversion_is_the_optimised_renyi_tail_bound():
    # rho-zCDP: P[L > eps] <= exp((a - 1)(a rho - eps)) for every a > 1 (Markov on
    # e^{(a-1) L}); at eps_bs = rho + 2 sqrt(rho ln(1/delta)) the best a gives exactly delta.
    for rho, delta in [(0.05, 1e-5), (0.5, 1e-6), (3.0, 1e-3)]:
        eps_bs, eps_exact = rg.zcdp_to_dp(rho, delta)
        best = optimize.minimize_scalar(lambda a: (a - 1) * (a * rho - eps_bs),
                                        bounds=(1.0, 1e4), method="bounded",
                                        options={"xatol": 1e-12})
        assert np.exp(best.fun) == pytest.approx(delta, rel=1e-6)
        assert best.x == pytest.approx((eps_bs + rho) / (2 * rho), rel=1e-5)
        assert eps_exact < eps_bs


def test_release_clips_and_enforces_size_bound():
    rng = np.random.default_rng(5)
    X, y = rng.normal(size=(15, 4)) * 3, rng.normal(size=15) * 3
    a = rg.release(X, y, 2.0, R, B, 15, 1.0, np.random.default_rng(7))
    b = rg.release(rg.clip_rows(X, R), np.clip(y, -B, B), 2.0, R, B, 15, 1.0,
                   np.random.default_rng(7))
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)
    assert np.linalg.norm(rg.clip_rows(X, R), axis=1).max() == pytest.approx(R)
    with pytest.raises(ValueError, match="n_max"):
        rg.release(X, y, 2.0, R, B, 14, 1.0, rng)
    with pytest.raises(ValueError, match="lam"):
        rg.ridge_fit(X, y, 0.0)


def test_audit_is_sound_and_grows_with_rho():
    kw = dict(setup=rg.Setup(n=100, d=100, m=100, lam=800.0, R=R, B=B, label_noise=0.1),
              delta=1e-5)
    df = rg.audit_table(rhos=[0.05, 5.0], repeats=4, seed=11, **kw)
    assert (df.eps_lb <= df.eps_theory_exact).all()
    assert (df.eps_lb_fdp <= df.eps_theory_exact).all()
    assert (df.eps_lb <= df.eps_hat_max).all()
    by_rho = df.groupby("rho").eps_lb.mean()
    assert by_rho[5.0] > by_rho[0.05] + 0.5
    again = rg.audit_table(rhos=[5.0], repeats=1, seed=11, **kw)
    assert again.eps_lb.iloc[0] == df[df.rho == 5.0].eps_lb.iloc[0]  # seeded


SPEC = {"n": 40, "d": 40, "m": 40, "lam": 320.0, "row_norm": 1.0, "label_bound": 1.0,
        "label_noise": 0.1, "rho": [0.1, 2.0], "delta": 1e-5, "repeats": 2}


def test_cli_audit_and_plot(tmp_path):
    table, fig = tmp_path / "ridge.csv", tmp_path / "ridge.pdf"
    assert main(["ridge-audit", "--spec", json.dumps(SPEC), "--seed", "3",
                 "--out", str(table)]) == 0
    df, prov = read_table(table)
    assert prov["seed"] == 3 and prov["spec"] == SPEC
    assert len(df) == 4 and set(df.seed) == {3}
    assert {"rho", "eps_theory_bs", "eps_theory_exact", "repeat", "m", "eps_lb"} <= set(df)
    assert main(["ridge-plot", "--table", str(table), "--out", str(fig)]) == 0
    assert fig.stat().st_size > 0 and fig.with_suffix(".png").stat().st_size > 0


@pytest.mark.parametrize("key,value", [("lam", 0), ("rho", []), ("m", 41), ("repeats", 1.5),
                                       ("delta", 1.0), ("bogus", 1)])
def test_cli_bad_spec_names_key(tmp_path, capsys, key, value):
    spec = {**SPEC, key: value}
    assert main(["ridge-audit", "--spec", json.dumps(spec), "--seed", "0",
                 "--out", str(tmp_path / "x.csv")]) == 2
    assert f"ridge.{key}" in capsys.readouterr().err
    assert not (tmp_path / "x.csv").exists()


def test_cli_missing_key(tmp_path, capsys):
    spec = {k: v for k, v in SPEC.items() if k != "label_bound"}
    assert main(["ridge-audit", "--spec", json.dumps(spec), "--seed", "0",
                 "--out", str(tmp_path / "x.csv")]) == 2
    assert "ridge.label_bound" in capsys.readouterr().err
