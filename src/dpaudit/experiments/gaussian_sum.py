"""Gaussian sum mechanism: noise calibration and one-run audits (HW3 section 2).

Source: the HW3 homework of DA 5001/6400 (IIT Madras, 2024), section 2 (Q2.1-Q2.3).

Mechanism.  Inputs lie in the unit ball of R^d, ``A(D) = sum_{x in D} x`` has L2
sensitivity 1, and the Gaussian mechanism releases ``A(D) + N(0, sigma^2 I_d)``.

Calibration.  :func:`classical_sigma` is the homework's ``sqrt(2 ln(1.25/delta)) / eps``
(Dwork & Roth 2014, Thm. A.1), proved only for ``eps < 1``; above that it does not give
the stated eps.  The exact privacy profile of the Gaussian mechanism with sensitivity 1
is (Balle & Wang 2018, Thm. 8)

    delta(eps) = Phi(1/(2 sigma) - eps sigma) - e^eps Phi(-1/(2 sigma) - eps sigma),

which is the profile of mu-GDP with ``mu = 1/sigma`` (Dong, Roth & Su 2022, Cor. 2.13), so
:func:`true_eps` and :func:`analytic_sigma` reuse :func:`dpaudit.bounds.delta_from_mu`
and :func:`dpaudit.bounds.eps_from_mu`.  At ``eps = 16, delta = 1e-6`` the classical
sigma 0.3315 is really (18.3, 1e-6)-DP.

Audit (Steinke, Nasr & Jagielski 2023, Alg. 1, as in the homework).  Data set ``{0_d}``;
``m`` canaries uniform on the unit sphere, canary ``i`` included iff the Rademacher sign
``S_i = +1``; ``theta = sum_{S_j=+1} x_j + sigma z`` with ``z ~ N(0, I_d)``; score
``f_i = x_i^T theta``.  For ``k = m1 = m2 = 1 .. K = min(m//2, max_m1)`` guess the ``k``
highest scores IN and the ``k`` lowest OUT; ``v_k`` of the ``r = 2k`` guesses are right.
The certified bounds test the at most 10 ``k`` of :func:`dpaudit.bounds.guess_grid`
(geometric up to K, fixed in advance, each at beta / their number); the homework's
estimate takes the largest over every k.

Exact computation without the ``m x d`` matrix.  ``f_i = a_i + sigma b_i`` with
``a_i = x_i^T u``, ``u = sum_{S_j=+1} x_j`` and ``b_i = x_i^T z``.  Canaries come in
fixed blocks of :func:`block_rows` ``(d)`` rows, block ``j`` drawn from its own generator
(child ``j`` of a ``SeedSequence``), so a block can be regenerated bit for bit.  Pass 1
accumulates ``u`` block by block (a vector-matrix product per block); pass 2 regenerates
each block (or reuses it while the blocks kept so far fit in ``cache_bytes``) and
computes ``[a, b] = X_block [u, z]`` (one ``(rows x d) @ (d x 2)`` product).  Every sigma
then costs only ``a + sigma b``, so the canaries, signs and noise of one (repeat, m, d)
are shared by all eps values and both calibrations (common random numbers).  Memory is
``cache_bytes`` plus one block per thread, whatever ``m`` and ``d``.  Canaries, ``u``,
``z`` and the products are float32 (about 1e-6 relative error, far below the score noise
of order 0.1); the scores ``a + sigma b`` and all statistics are float64.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd
from scipy import optimize

from .. import seeds
from ..bounds import delta_from_mu, eps_from_mu, guess_counts, one_run_sweep

#: Elements per canary block (4 MiB of float32); fixed, so the draws depend on
#: (seed, repeat, m, d) only, not on threads or the cache size.
BLOCK_ELEMENTS = 1 << 20
#: Canary memory kept between the two passes by default (bytes).
DEFAULT_CACHE_BYTES = 256 << 20
CALIBRATIONS = ("classical", "analytic")


def _check_eps_delta(eps: float, delta: float) -> None:
    if not (eps > 0 and np.isfinite(eps)):
        raise ValueError(f"eps={eps!r}: must be a positive finite number")
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta={delta!r}: must lie strictly between 0 and 1")


def classical_sigma(eps: float, delta: float) -> float:
    """``sqrt(2 ln(1.25/delta)) / eps`` (the homework; Dwork & Roth 2014, Thm. A.1, eps < 1)."""
    _check_eps_delta(eps, delta)
    return float(np.sqrt(2.0 * np.log(1.25 / delta)) / eps)


def true_eps(sigma: float, delta: float) -> float:
    """The exact eps at ``delta`` of the sensitivity-1 Gaussian mechanism with noise ``sigma``.

    Inverts Balle & Wang (2018) Thm. 8, i.e. :func:`dpaudit.bounds.eps_from_mu` at
    ``mu = 1/sigma``.
    """
    if not (sigma > 0 and np.isfinite(sigma)):
        raise ValueError(f"sigma={sigma!r}: must be a positive finite number")
    return eps_from_mu(1.0 / sigma, delta)


def analytic_sigma(eps: float, delta: float) -> float:
    """Smallest sigma making the sensitivity-1 Gaussian mechanism (eps, delta)-DP.

    Balle & Wang (2018) Thm. 8 / Alg. 1: ``delta(eps; sigma)`` decreases in sigma; solved
    for ``delta(eps; sigma) = delta`` with brentq on ``log sigma``.
    """
    _check_eps_delta(eps, delta)
    gap = lambda log_s: delta_from_mu(np.exp(-log_s), eps) - delta  # noqa: E731
    lo = hi = np.log(classical_sigma(eps, delta))
    while gap(lo) <= 0:
        lo -= 1.0
    while gap(hi) > 0:
        hi += 1.0
    return float(np.exp(optimize.brentq(gap, lo, hi, xtol=1e-14, rtol=1e-13)))


def calibrate(eps: float, delta: float, calibration: str) -> float:
    """sigma of ``calibration`` (``"classical"`` or ``"analytic"``) for (eps, delta)."""
    if calibration == "classical":
        return classical_sigma(eps, delta)
    if calibration == "analytic":
        return analytic_sigma(eps, delta)
    raise ValueError(f"calibration={calibration!r}: must be one of {CALIBRATIONS}")


# ---- canaries and scores ---------------------------------------------------------------

def block_rows(d: int) -> int:
    """Canaries per block: ``max(1, BLOCK_ELEMENTS // d)``."""
    return max(1, BLOCK_ELEMENTS // int(d))


def _seeds(m: int, d: int, key) -> tuple[np.random.SeedSequence, np.random.SeedSequence,
                                         list[np.random.SeedSequence]]:
    """(signs, noise, per-block) seed sequences of the draw ``key`` (ints, e.g. (seed, repeat))."""
    n_blocks = -(-m // block_rows(d))
    children = seeds.sequence(*map(int, key), m, d).spawn(2 + n_blocks)
    return children[0], children[1], children[2:]


def _block(seq: np.random.SeedSequence, j: int, m: int, d: int) -> np.ndarray:
    """Canaries ``j * block_rows(d) ..`` (at most ``block_rows(d)``): Gaussian rows normalized."""
    rows = min(block_rows(d), m - j * block_rows(d))
    x = np.random.default_rng(seq).standard_normal((rows, d), dtype=np.float32)
    x /= np.sqrt(np.einsum("ij,ij->i", x, x))[:, None]
    return x


def _signs_noise(m: int, d: int, key) -> tuple[np.ndarray, np.ndarray]:
    s_seq, z_seq, _ = _seeds(m, d, key)
    signs = np.where(np.random.default_rng(s_seq).random(m) < 0.5, 1, -1).astype(np.int8)
    noise = np.random.default_rng(z_seq).standard_normal(d, dtype=np.float32)
    return signs, noise


def canaries(m: int, d: int, key) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The draws of :func:`canary_scores` materialized: ``(X (m, d), signs S, noise z)``.

    For small ``m * d`` only (tests, illustrations); the audit never builds ``X``.
    """
    _, _, seqs = _seeds(m, d, key)
    signs, noise = _signs_noise(m, d, key)
    return np.vstack([_block(s, j, m, d) for j, s in enumerate(seqs)]), signs, noise


@dataclass(frozen=True)
class CanaryScores:
    """Scores ``f = signal + sigma * noise`` of one canary draw, for any sigma."""

    signs: np.ndarray   # S_i in {-1, +1} (int8): +1 = canary included
    signal: np.ndarray  # a_i = x_i^T sum_{S_j=+1} x_j
    noise: np.ndarray   # b_i = x_i^T z

    def scores(self, sigma) -> np.ndarray:
        """``x_i^T theta`` for each sigma: shape ``(m,)``, or ``(len(sigma), m)``."""
        sigma = np.asarray(sigma, dtype=float)
        return self.signal + sigma[..., None] * self.noise


def canary_scores(m: int, d: int, key, threads: int = 1,
                  cache_bytes: int = DEFAULT_CACHE_BYTES) -> CanaryScores:
    """Two-pass chunked computation of the scores of draw ``key`` (see the module docstring).

    Blocks are generated ``threads`` at a time (numpy releases the GIL while drawing);
    partial sums are added in block order, so the result does not depend on ``threads``.
    """
    if m < 2 or d < 1:
        raise ValueError(f"need m >= 2 and d >= 1, got m={m}, d={d}")
    _, _, seqs = _seeds(m, d, key)
    signs, z = _signs_noise(m, d, key)
    rows = block_rows(d)
    keep = max(0, int(cache_bytes) // (4 * rows * d))  # blocks cached between the passes
    cache: dict[int, np.ndarray] = {}

    def pass1(j: int) -> np.ndarray:
        x = _block(seqs[j], j, m, d)
        if j < keep:
            cache[j] = x
        return (signs[j * rows:j * rows + len(x)] > 0).astype(np.float32) @ x

    def pass2(j: int) -> np.ndarray:
        x = cache.pop(j) if j in cache else _block(seqs[j], j, m, d)
        return x @ uz

    with ThreadPoolExecutor(max(1, int(threads))) as pool:
        u = np.zeros(d, dtype=np.float32)
        for part in pool.map(pass1, range(len(seqs))):
            u += part
        uz = np.column_stack([u, z])
        ab = np.vstack(list(pool.map(pass2, range(len(seqs))))).astype(np.float64)
    return CanaryScores(signs, ab[:, 0], ab[:, 1])


# ---- guesses and bounds ----------------------------------------------------------------

def audit_point(m: int, d: int, sigmas, key, delta: float, beta: float = 0.05,
                max_m1: int = 500, threads: int = 1,
                cache_bytes: int = DEFAULT_CACHE_BYTES) -> pd.DataFrame:
    """One-run audits of one canary draw ``key`` at every sigma in ``sigmas``.

    One row per sigma: the :func:`dpaudit.bounds.one_run_sweep` columns, plus the mean IN
    and OUT scores.
    """
    sc = canary_scores(m, d, key, threads, cache_bytes)
    scores = sc.scores(np.atleast_1d(sigmas))
    res = one_run_sweep(m, guess_counts(scores, sc.signs, min(m // 2, max_m1)), delta, beta)
    inc = sc.signs > 0
    return pd.DataFrame({**res, "n_in": int(inc.sum()),
                         "score_in_mean": scores[:, inc].mean(axis=1),
                         "score_out_mean": scores[:, ~inc].mean(axis=1)})


def audit_grid(grid: str, eps_values, m_values, d_values, delta: float, repeats: int,
               seed: int, beta: float = 0.05, max_m1: int = 500, threads: int = 1,
               cache_bytes: int = DEFAULT_CACHE_BYTES,
               progress: Callable[[str], None] | None = None) -> pd.DataFrame:
    """Audit every (m, d) of the grid, ``repeats`` independent draws each, at every eps of
    ``eps_values`` under both calibrations.

    The draw of repeat ``r`` at (m, d) is keyed ``(seed, r)`` (+ m, d): a row is
    reproducible from ``seed, repeat, m, d``, and grid points shared between grids get
    identical draws.  One row per (eps, m, d, calibration, repeat).
    """
    cal = [(eps, c, calibrate(eps, delta, c)) for eps in eps_values for c in CALIBRATIONS]
    sigmas = np.array([s for _, _, s in cal])
    eps_true = [true_eps(s, delta) for s in sigmas]
    frames = []
    for m in m_values:
        for d in d_values:
            for rep in range(repeats):
                res = audit_point(int(m), int(d), sigmas, (seed, rep), delta, beta, max_m1,
                                  threads, cache_bytes)
                frames.append(pd.DataFrame({
                    "grid": grid, "eps": [e for e, _, _ in cal], "m": int(m), "d": int(d),
                    "delta": delta, "calibration": [c for _, c, _ in cal], "sigma": sigmas,
                    "true_eps": eps_true, "repeat": rep, "seed": seed, "beta": beta,
                    **res}))
                if progress:
                    top = res.loc[res.eps_lb.idxmax()]
                    progress(f"m={m} d={d} repeat={rep}: max eps_lb={top.eps_lb:.3f} "
                             f"(f-DP {top.eps_lb_fdp:.3f}, pure {top.eps_lb_pure:.3f}, "
                             f"homework max {top.eps_hat_max:.3f})")
    return pd.concat(frames, ignore_index=True)
