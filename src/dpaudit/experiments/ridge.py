"""Private ridge regression by output perturbation, and its one-run audit.

Section 1 of the HW3 homework of DA 5001/6400 (IIT Madras, 2024); the derivations of
Q1.1-Q1.7 are in ``docs/ridge.md``.  Ridge regression minimises
``F(theta) = ||X theta - y||^2 + lam ||theta||^2`` with the closed form
``theta* = H^-1 b``, ``H = X^T X + lam I``, ``b = X^T y`` (Q1.1), and output
perturbation releases ``theta* + N(0, sigma^2 I)``.

Sensitivity (Q1.3-Q1.6).  Let ``D_large = D_small + {(x, y)}``.  Sherman-Morrison
gives, with ``theta_s``/``theta_l`` and ``H_s``/``H_l`` of the two data sets,

    theta_s - theta_l = H_s^-1 x (x^T theta_s - y) / (1 + x^T H_s^-1 x)      (Q1.3)
                      = H_l^-1 x (x^T theta_s - y)                             (a)
                      = H_s^-1 x (x^T theta_l - y)                             (b)

((a): ``H_l^-1 x = H_s^-1 x / (1 + x^T H_s^-1 x)``; (b): the residual on an
included point shrinks, ``x^T theta_l - y = (x^T theta_s - y) / (1 + x^T H_s^-1 x)``).
Both Hessians are ``>= lam I``, so ``||H^-1 x|| <= R / lam`` (Q1.4) and the change is
at most ``M R / lam`` if the residual of the differing point is at most ``M`` under
the model trained *without* it (addition, Q1.5) or *with* it (removal, Q1.6): the
bound is the same in both directions.

What is enforced, and why ``M`` holds for every neighbour.  DP quantifies over all
neighbouring data sets, so the residual bound cannot be checked on the data at
hand; it must follow from the data domain.  :func:`release` (i) scales every row to
``||x_i|| <= R`` and clips every label to ``|y_i| <= B`` -- per-record maps, so
neighbours stay neighbours -- and (ii) refuses data sets with more than a public
``n_max`` records.  On that domain, with ``U S V^T`` the SVD of ``X``,
``theta* = V diag(s / (s^2 + lam)) U^T y`` and ``s / (s^2 + lam) <= 1 / (2 sqrt(lam))``,
so ``||theta*|| <= ||y|| / (2 sqrt(lam)) <= B sqrt(n_max) / (2 sqrt(lam))`` and for any
record in the domain

    |x^T theta* - y| <= R ||theta*|| + B <= B (1 + R sqrt(n_max / lam) / 2) =: M,

for the model of either neighbour (:func:`residual_bound`).  The ``sqrt(n_max)``
growth is real: ``n`` rows ``sqrt(lam / n) e`` with labels ``B`` give
``||theta*|| = B sqrt(n) / (2 sqrt(lam))``.  With ``sigma^2 = M^2 R^2 / (2 lam^2 rho)``
the release is rho-zCDP (Q1.7; Bun & Steinke 2016, Prop. 1.6).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import linalg

from .. import seeds
from ..bounds import eps_from_mu, guess_counts, one_run_sweep


def _positive(name: str, value: float) -> float:
    value = float(value)
    if not value > 0 or not np.isfinite(value):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return value


def clip_rows(X: np.ndarray, R: float) -> np.ndarray:
    """Scale each row of ``X`` with ``||x_i||_2 > R`` down to norm ``R`` (others unchanged)."""
    R = _positive("R", R)
    X = np.asarray(X, dtype=float)
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    return X * np.minimum(1.0, R / np.maximum(norms, np.finfo(float).tiny))


def ridge_fit(X: np.ndarray, y: np.ndarray, lam: float) -> np.ndarray:
    """Ridge minimiser ``theta* = (X^T X + lam I)^-1 X^T y`` (HW3 Q1.1), by a solve."""
    lam = _positive("lam", lam)
    X = np.asarray(X, dtype=float)
    H = X.T @ X
    H[np.diag_indices_from(H)] += lam
    return linalg.solve(H, X.T @ np.asarray(y, dtype=float), assume_a="pos")


def sherman_morrison_shift(X, y, lam: float, x_new, y_new: float) -> np.ndarray:
    """``theta*(D) - theta*(D + {(x~, y~)})`` by Sherman-Morrison (HW3 Q1.3).

    ``= H^-1 x~ (x~^T theta* - y~) / (1 + x~^T H^-1 x~)`` with ``H``, ``theta*`` of ``D``.
    """
    lam = _positive("lam", lam)
    X = np.asarray(X, dtype=float)
    x_new = np.asarray(x_new, dtype=float)
    H = X.T @ X
    H[np.diag_indices_from(H)] += lam
    theta = linalg.solve(H, X.T @ np.asarray(y, dtype=float), assume_a="pos")
    h_x = linalg.solve(H, x_new, assume_a="pos")
    return h_x * (x_new @ theta - y_new) / (1.0 + x_new @ h_x)


def residual_bound(R: float, B: float, lam: float, n_max: int) -> float:
    """``M = B (1 + R sqrt(n_max / lam) / 2)``: bounds ``|x^T theta* - y|`` on the domain.

    Valid for every record with ``||x|| <= R``, ``|y| <= B`` and the ridge model of any
    data set of at most ``n_max`` such records (derivation in the module docstring).
    """
    if int(n_max) < 1:
        raise ValueError(f"n_max must be a positive integer, got {n_max!r}")
    R, B, lam = _positive("R", R), _positive("B", B), _positive("lam", lam)
    return B * (1.0 + R * np.sqrt(int(n_max) / lam) / 2.0)


def sensitivity(M: float, R: float, lam: float) -> float:
    """L2 sensitivity ``M R / lam`` of ``theta*`` under add/remove (HW3 Q1.5-Q1.6)."""
    return _positive("M", M) * _positive("R", R) / _positive("lam", lam)


def zcdp_sigma(M: float, R: float, lam: float, rho: float) -> float:
    """Noise std with ``sigma^2 = M^2 R^2 / (2 lam^2 rho)``: rho-zCDP (HW3 Q1.7)."""
    return sensitivity(M, R, lam) / np.sqrt(2.0 * _positive("rho", rho))


def zcdp_to_dp(rho, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """``(eps_bs, eps_exact)`` at ``delta`` for the rho-zCDP Gaussian release.

    ``eps_bs = rho + 2 sqrt(rho ln(1/delta))`` is Bun & Steinke (2016) Prop. 1.3, valid
    for any rho-zCDP mechanism.  ``eps_exact`` uses that a Gaussian mechanism with
    ``sensitivity / sigma = sqrt(2 rho)`` is exactly mu-GDP with ``mu = sqrt(2 rho)``
    (Dong, Roth & Su 2022, Thm. 2.7, Cor. 2.13): its privacy profile is exact, so ``eps_exact``
    is the tight conversion (always ``<= eps_bs``) whenever the sensitivity is attained.
    """
    rho = np.asarray(rho, dtype=float)
    if np.any(~(rho > 0)):
        raise ValueError(f"rho must be positive, got {rho!r}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    eps_bs = rho + 2.0 * np.sqrt(rho * np.log(1.0 / delta))
    eps_exact = np.vectorize(lambda r: float(eps_from_mu(np.sqrt(2.0 * r), delta)))(rho)
    return eps_bs, eps_exact


def release(X, y, lam: float, R: float, B: float, n_max: int, rho: float,
            rng: np.random.Generator) -> np.ndarray:
    """Output perturbation ``theta* + N(0, sigma^2 I)``, rho-zCDP on add/remove neighbours.

    Rows are scaled to ``||x_i|| <= R`` and labels clipped to ``|y_i| <= B``; ``n_max``
    is a public bound on the data-set size (``ValueError`` if exceeded).  ``sigma`` is
    :func:`zcdp_sigma` at ``M =`` :func:`residual_bound` ``(R, B, lam, n_max)``.
    """
    X = np.asarray(X, dtype=float)
    if X.ndim != 2 or len(X) != len(y):
        raise ValueError(f"X must be (n, d) with len(y) == n, got X {X.shape}, y {np.shape(y)}")
    if len(X) > n_max:
        raise ValueError(f"n_max={n_max} is smaller than the data set ({len(X)} records)")
    B = _positive("B", B)
    theta = ridge_fit(clip_rows(X, R), np.clip(y, -B, B), lam)
    sigma = zcdp_sigma(residual_bound(R, B, lam, n_max), R, lam, rho)
    return theta + rng.normal(0.0, sigma, size=theta.shape)


def synthetic_data(n: int, d: int, R: float, B: float, label_noise: float,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Base data: ``x ~ N(0, R^2/d I)`` scaled to ``||x|| <= R``; ``y = x^T w + noise``
    with ``w ~ N(0, I)``, clipped to ``|y| <= B``."""
    X = clip_rows(rng.normal(0.0, R / np.sqrt(d), size=(n, d)), R)
    w = rng.normal(size=d)
    y = np.clip(X @ w + label_noise * rng.normal(size=n), -B, B)
    return X, y


def canaries(m: int, d: int, R: float, B: float,
             rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``m`` canaries ``(R q_i, B)`` with orthonormal random directions ``q_i``.

    Norm ``R`` and label ``B`` maximise ``||H^-1 x||`` and the residual within the
    domain; orthogonality removes cross-talk between included canaries, so each one
    moves ``q_i^T theta`` by about ``R B / (lam + R^2)`` independently.
    """
    if not 1 <= m <= d:
        raise ValueError(f"m must be in [1, d={d}] for orthogonal canaries, got {m}")
    q, _ = np.linalg.qr(rng.normal(size=(d, m)))
    return R * q.T, np.full(m, float(B))


def one_run_audit(X, y, Xc, yc, lam: float, R: float, B: float, rho: float,
                  delta: float, rng: np.random.Generator, beta: float = 0.05) -> dict:
    """One-run audit of :func:`release` (Steinke, Nasr & Jagielski 2023, Alg. 1; HW3 s.2).

    Each canary is included with probability 1/2 (``S_i`` Rademacher); one release is
    trained on ``D + {included canaries}`` with public size bound ``n_max = n + m``, so
    toggling one ``S_i`` is an add/remove neighbour inside the domain of
    :func:`release` and the (eps, delta) guarantee applies per canary, as the theorem
    requires.  Score ``f_i = sign(y_i) x_i^T (theta - theta*(D))`` (the auditor knows
    ``D``).  Guessing the ``k`` highest in and the ``k`` lowest out, for ``k`` on the grid
    of :func:`dpaudit.bounds.guess_grid` (at most 10 counts up to ``m//2``, fixed in
    advance), gives the bounds of :func:`dpaudit.bounds.one_run_sweep`: ``eps_lb``, the
    (eps, delta) bound at ``1 - beta`` (Bonferroni over the tested k), is the one reported and
    plotted against the theoretical eps; ``eps_hat_max`` is the homework-style maximum,
    kept only for comparison.
    """
    Xc = np.asarray(Xc, dtype=float)
    m = len(Xc)
    if m < 2:
        raise ValueError(f"need at least 2 canaries, got {m}")
    S = rng.choice(np.array([-1, 1]), size=m)
    theta = release(np.vstack([X, Xc[S > 0]]), np.concatenate([y, yc[S > 0]]),
                    lam, R, B, len(X) + m, rho, rng)
    scores = np.sign(yc) * (Xc @ (theta - ridge_fit(X, y, lam)))
    res = one_run_sweep(m, guess_counts(scores, S, m // 2), delta, beta)
    return {**{k: v.item() for k, v in res.items()}, "included": int((S > 0).sum())}


@dataclass(frozen=True)
class Setup:
    """What :func:`audit_table` audits: ``n`` base rows (:func:`synthetic_data`, with
    ``label_noise``) and ``m`` canaries (:func:`canaries`) in ``d`` dimensions, on the domain
    ``||x|| <= R``, ``|y| <= B``, released by ridge regression with ``lam``."""

    n: int
    d: int
    m: int
    lam: float
    R: float
    B: float
    label_noise: float


def audit_table(setup: Setup, rhos, delta: float, repeats: int, seed: int,
                beta: float = 0.05, progress=None) -> pd.DataFrame:
    """Audit :func:`release` on ``setup`` at every rho in ``rhos``, ``repeats`` one-run
    audits each.

    One base data set and canary set (from ``seed``); repeat ``r`` draws its inclusions
    and standard-normal noise from ``seeds.rng(seed, r)`` at every rho (common
    random numbers: a row is reproducible from ``seed``, ``repeat`` and ``rho`` alone).
    One row per run with the theoretical eps at ``delta`` (both conversions of
    :func:`zcdp_to_dp`).
    """
    n, d, m, lam, R, B = setup.n, setup.d, setup.m, setup.lam, setup.R, setup.B
    data_rng = seeds.rng(seed)
    X, y = synthetic_data(n, d, R, B, setup.label_noise, data_rng)
    Xc, yc = canaries(m, d, R, B, data_rng)
    M = residual_bound(R, B, lam, n + m)
    rows = []
    for rho in rhos:
        eps_bs, eps_exact = zcdp_to_dp(rho, delta)
        for r in range(repeats):
            res = one_run_audit(X, y, Xc, yc, lam, R, B, rho, delta,
                                seeds.rng(seed, r), beta)
            rows.append({"rho": rho, "eps_theory_bs": float(eps_bs),
                         "eps_theory_exact": float(eps_exact), "repeat": r, "seed": seed,
                         "n": n, "d": d, "m": m, "lam": lam, "R": R, "B": B, "M": M,
                         "sigma": zcdp_sigma(M, R, lam, rho), "delta": delta, **res})
            if progress:
                progress(f"rho={rho} repeat={r}: eps_lb={res['eps_lb']:.3f}")
    return pd.DataFrame(rows)
