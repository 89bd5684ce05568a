"""Privacy accountants for DP-SGD and composition theorems for (eps, delta)-DP.

DP-SGD here is ``steps`` compositions of the Poisson-subsampled Gaussian mechanism
(sampling rate ``q``, noise multiplier ``sigma`` = noise std / L2 sensitivity) under
add-or-remove-one neighbours, the setting of TF-Privacy, Opacus and [ACG+16].  The per-step
privacy curves come from Google's ``dp_accounting``; only what it lacks is written here:
the 2019 RDP-to-DP conversion, the Gaussian-DP central limit theorem and the classical
composition theorems.

References
----------
- [ACG+16] Abadi et al. Deep Learning with Differential Privacy. CCS 2016 (Sec. 3.1, Fig. 2).
- [Mir17] Mironov. Renyi Differential Privacy. CSF 2017, Proposition 3.
- [MTZ19] Mironov, Talwar, Zhang. Renyi DP of the Sampled Gaussian Mechanism. 2019.
- [DRV10] Dwork, Rothblum, Vadhan. Boosting and Differential Privacy. FOCS 2010, Thm III.3;
  Dwork & Roth, The Algorithmic Foundations of DP (2014), Theorem 3.20.
- [KOV15] Kairouz, Oh, Viswanath. The Composition Theorem for Differential Privacy. ICML
  2015 (arXiv:1311.0776): Theorem 3.3 (optimal composition), Theorem 3.4 (closed form).
- [DRS19] Dong, Roth, Su. Gaussian Differential Privacy. JRSS-B 2022, Corollary 2.13.
- [BDLS20] Bu, Dong, Long, Su. Deep Learning with Gaussian Differential Privacy. HDSR 2020
  (Poisson-subsampling CLT, their eq. (6)).
- [BBG18] Balle, Barthe, Gaboardi. Privacy Amplification by Subsampling. NeurIPS 2018.
- [JUO20] Jagielski, Ullman, Oprea. Auditing Differentially Private Machine Learning.
  NeurIPS 2020, whose epsilons come from the 2019 TF-Privacy accountant.
- Lecture notes: CSCI 699 (USC), Week 4: Gaussian DP and Privacy Auditing (composition
  graph); "Understanding Privacy Leakage in Machine Learning (Part 1)" (blog post).
"""

from __future__ import annotations

import functools
import logging
import math
from contextlib import contextmanager

import dp_accounting
from dp_accounting import privacy_accountant
import numpy as np
import pandas as pd
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import pld_privacy_accountant, privacy_loss_distribution
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import optimize

from .bounds import eps_from_mu

__all__ = [
    "METHODS",
    "CLASSIC_ORDERS",
    "COMPOSITION_FORMS",
    "STRONG_VARIANTS",
    "epsilon",
    "epsilon_curve",
    "epsilon_replace_one",
    "dpsgd_epsilons",
    "privacy_profile",
    "noise_multiplier",
    "basic_composition",
    "advanced_composition",
    "optimal_composition",
    "sgd_strong_composition",
    "abadi_fig2_table",
    "composition_table",
]

#: Accountants understood by :func:`epsilon` and :func:`noise_multiplier`.
METHODS = ("rdp_classic", "rdp", "pld", "gdp")
#: RDP orders of the 2019 TF-Privacy tutorials (1.1, ..., 10.9, 12, ..., 63).
CLASSIC_ORDERS = tuple([1 + x / 10 for x in range(1, 100)] + list(range(12, 64)))
#: PLD grid of privacy-loss values; dp_accounting rounds pessimistically (upper bound).
PLD_DISCRETIZATION = 1e-4
#: Forms of the advanced composition theorem, see :func:`advanced_composition`.
COMPOSITION_FORMS = ("drv", "kov", "lecture")
#: Strong-composition analyses of DP-SGD, see :func:`sgd_strong_composition`.
STRONG_VARIANTS = ("abadi", "sound")


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"method={method!r}: must be one of {METHODS}")


def _check_sgd(sigma, sample_rate, steps, delta) -> None:
    if not sigma >= 0:
        raise ValueError(f"sigma={sigma!r}: must be >= 0")
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample_rate={sample_rate!r}: must lie in (0, 1]")
    if steps < 0 or steps != int(steps):
        raise ValueError(f"steps={steps!r}: must be a whole number >= 0")
    if not 0 < delta < 1:
        raise ValueError(f"delta={delta!r}: must lie strictly between 0 and 1")


def _dp_sgd_event(sigma: float, sample_rate: float, steps: int):
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(sample_rate, dp_accounting.GaussianDpEvent(sigma)),
        int(steps))


def epsilon(sigma: float, sample_rate: float, steps: int, delta: float,
            method: str = "rdp") -> float:
    """Epsilon of DP-SGD at ``delta``: ``steps`` Poisson-subsampled Gaussian steps.

    Methods, loosest to tightest (``pld <= rdp <= rdp_classic``; ``gdp`` is asymptotic):

    - ``rdp_classic``: the 2019 TF-Privacy accountant used by [JUO20] (and, up to its
      orders, the moments accountant of [ACG+16]): the RDP ``r(a)`` of the subsampled
      Gaussian [MTZ19] at :data:`CLASSIC_ORDERS`, computed by dp_accounting, converted
      with ``eps = min_a r(a) + log(1/delta) / (a - 1)`` [Mir17, Prop. 3].
    - ``rdp``: dp_accounting's RdpAccountant (its default orders, up to 1024) with the
      improved conversion ``r(a) + log(1 - 1/a) - log(delta a) / (a - 1)`` (Canonne,
      Kamath, Steinke 2020, Prop. 12).
    - ``pld``: dp_accounting's PLDAccountant, a numerically tight upper bound (privacy
      losses rounded up to multiples of :data:`PLD_DISCRETIZATION`).
    - ``gdp``: the central limit theorem of [BDLS20]: DP-SGD is approximately
      ``mu``-GDP with ``mu = q sqrt(T (e^{1/sigma^2} - 1))``, converted exactly to
      (eps, delta) by :func:`dpaudit.bounds.eps_from_mu` [DRS19].  Only asymptotically
      valid (T -> inf with q sqrt(T) fixed); it can underestimate eps.

    ``sigma = 0`` gives ``inf``; ``steps = 0`` gives 0.
    """
    _check_method(method)
    _check_sgd(sigma, sample_rate, steps, delta)
    if steps == 0:
        return 0.0
    if sigma == 0:
        return math.inf
    if method == "gdp":
        with np.errstate(over="ignore"):
            mu = sample_rate * math.sqrt(steps * float(np.expm1(1.0 / sigma**2)))
        return eps_from_mu(mu, delta)
    event = _dp_sgd_event(sigma, sample_rate, steps)
    if method == "pld":
        acc = pld_privacy_accountant.PLDAccountant(
            value_discretization_interval=PLD_DISCRETIZATION)
        return float(acc.compose(event).get_epsilon(delta))
    if method == "rdp":
        return float(rdp_privacy_accountant.RdpAccountant().compose(event).get_epsilon(delta))
    rdp = rdp_privacy_accountant.RdpAccountant(CLASSIC_ORDERS).compose(event).rdp
    return _classic_epsilon(np.asarray(rdp), np.asarray(CLASSIC_ORDERS, dtype=float), delta)


def _classic_epsilon(rdp: np.ndarray, orders: np.ndarray, delta: float) -> float:
    """``eps = min_a r(a) + log(1/delta) / (a - 1)`` [Mir17, Prop. 3], at least 0. Orders
    where dp_accounting's series fails to converge come back as inf (skipped by the min);
    NaN (inf * 0) is skipped too."""
    with np.errstate(invalid="ignore"):
        return float(max(0.0, np.nanmin(rdp + math.log(1 / delta) / (orders - 1))))


def epsilon_curve(sigma: float, sample_rate: float, steps, delta: float,
                  method: str = "rdp_classic", gaussians=()) -> np.ndarray:
    """Epsilon at ``delta`` after each step count in ``steps`` (an array) of DP-SGD run
    after Gaussian mechanisms of L2 sensitivity 1 and noise multipliers ``gaussians``
    (e.g. Abadi et al.'s differentially private PCA), all composed, add/remove neighbours.

    Same ``method`` s as :func:`epsilon`. RDP composes additively, so the RDP methods
    compute the per-step and the Gaussians' RDP once and each point is ``T r_step(a) +
    r_gauss(a)`` converted as in :func:`epsilon`: a whole training curve costs one
    evaluation. ``pld`` composes the events for every point (exact composition, slow for
    long curves); ``gdp`` adds ``1/sigma_i^2`` to the CLT's ``mu^2`` (the Gaussians are
    exactly ``1/sigma_i``-GDP). ``steps = 0`` is the Gaussians alone. A noise multiplier
    of 0 (training or a Gaussian) gives eps = inf: that release is not DP.
    """
    _check_method(method)
    steps = np.asarray(steps)
    gaussians = [float(g) for g in gaussians]
    for t in steps.reshape(-1):
        _check_sgd(sigma, sample_rate, t, delta)
    if not all(g >= 0 for g in gaussians):
        raise ValueError(f"gaussians={gaussians!r}: noise multipliers must be >= 0")
    if 0.0 in gaussians:  # a noiseless release of a sensitivity-1 statistic: not DP at all
        return np.full(steps.shape, math.inf)
    if sigma == 0:
        return np.where(steps > 0, math.inf, epsilon_curve(1.0, sample_rate, 0 * steps, delta,
                                                           method, gaussians))
    if method == "gdp":
        with np.errstate(over="ignore"):
            mu2 = sample_rate ** 2 * steps * float(np.expm1(1.0 / sigma ** 2))
        mu2 = mu2 + sum(g ** -2 for g in gaussians)
        return np.array([eps_from_mu(math.sqrt(m), delta) if m > 0 else 0.0
                         for m in np.reshape(mu2, -1)]).reshape(steps.shape)
    if method == "pld":
        def one(t):
            events = [dp_accounting.GaussianDpEvent(g) for g in gaussians]
            events += [_dp_sgd_event(sigma, sample_rate, t)] if t else []
            if not events:
                return 0.0
            acc = pld_privacy_accountant.PLDAccountant(
                value_discretization_interval=PLD_DISCRETIZATION)
            return float(acc.compose(dp_accounting.ComposedDpEvent(events)).get_epsilon(delta))
        return np.array([one(int(t)) for t in steps.reshape(-1)]).reshape(steps.shape)
    orders = list(CLASSIC_ORDERS if method == "rdp_classic"
                  else rdp_privacy_accountant.DEFAULT_RDP_ORDERS)

    def rdp_of(event):
        return rdp_privacy_accountant.RdpAccountant(orders).compose(event).rdp

    per_step = rdp_of(_dp_sgd_event(sigma, sample_rate, 1))
    fixed = sum((rdp_of(dp_accounting.GaussianDpEvent(g)) for g in gaussians),
                np.zeros(len(orders)))
    orders = np.asarray(orders, dtype=float)
    out = []
    for t in steps.reshape(-1):
        rdp = int(t) * per_step + fixed if t else fixed
        if not rdp.any():
            out.append(0.0)
        elif method == "rdp":
            out.append(float(rdp_privacy_accountant.compute_epsilon(orders, rdp, delta)[0]))
        else:
            out.append(_classic_epsilon(rdp, orders, delta))
    return np.array(out).reshape(steps.shape)


def epsilon_replace_one(sigma: float, sample_rate: float, steps: int, delta: float) -> float:
    """Epsilon at ``delta`` of DP-SGD for data sets that differ by *replacing* one row (the
    neighbours of ClipBKD and the backdoor), by dp_accounting's PLD accountant with the
    ``REPLACE_ONE`` relation: tight, where ``2 eps`` of add/remove would hold only at the
    larger delta ``(1 + e^eps) delta`` of group privacy."""
    _check_sgd(sigma, sample_rate, steps, delta)
    if steps == 0:
        return 0.0
    if sigma == 0:
        return math.inf
    acc = pld_privacy_accountant.PLDAccountant(
        privacy_accountant.NeighboringRelation.REPLACE_ONE,
        value_discretization_interval=PLD_DISCRETIZATION)
    return float(acc.compose(_dp_sgd_event(sigma, sample_rate, steps)).get_epsilon(delta))


def dpsgd_epsilons(sigma: float, sample_rate: float, steps: int, delta: float) -> dict:
    """The theoretical eps a DP-SGD audit is drawn against, at ``delta``: ``eps_th``
    (``rdp_classic``, the accountant Jagielski et al. used), ``eps_pld`` (the tight PLD
    accountant), both for add/remove neighbours, and ``eps_pld_replace``
    (:func:`epsilon_replace_one`, PLD); ``inf`` without noise.

    Each (sigma, rate, steps, delta) is computed once per process (a new dict each call):
    the cells of a grid share them (a data set's attacks, a table's inits), and the PLD
    accountants take seconds per cell."""
    return dict(_dpsgd_epsilons(sigma, sample_rate, steps, delta))


@functools.lru_cache(maxsize=256)
def _dpsgd_epsilons(sigma: float, sample_rate: float, steps: int, delta: float) -> dict:
    if sigma == 0:
        return {"eps_th": math.inf, "eps_pld": math.inf, "eps_pld_replace": math.inf}
    return {"eps_th": epsilon(sigma, sample_rate, steps, delta, "rdp_classic"),
            "eps_pld": epsilon(sigma, sample_rate, steps, delta, "pld"),
            "eps_pld_replace": epsilon_replace_one(sigma, sample_rate, steps, delta)}


def privacy_profile(sigma: float, sample_rate: float, steps: int, epsilons) -> np.ndarray:
    """The privacy profile ``delta(e)`` of DP-SGD, for every ``e`` of ``epsilons``: the
    smallest delta at which ``steps`` Poisson-subsampled Gaussian steps (noise multiplier
    ``sigma``) are (e, delta)-DP for add/remove neighbours, by dp_accounting's PLD.

    Each direction has its own privacy loss distribution (removing a row differs from adding
    one when ``sample_rate < 1``); dp_accounting keeps both and returns the larger delta of
    the two, which is the add/remove profile. Its losses are rounded up and truncated mass
    counted as infinite loss (pessimistic), so every value is an upper bound on the exact
    profile (within about 1e-15 and the discretization's rounding above it).
    """
    _check_sgd(sigma, sample_rate, steps, 0.5)  # a profile has no delta of its own
    if not sigma > 0 or steps < 1:
        raise ValueError(f"sigma={sigma!r}, steps={steps!r}: need sigma > 0 and steps >= 1")
    eps = np.asarray(epsilons, dtype=float)
    if eps.ndim != 1 or not eps.size or not np.all(np.isfinite(eps)):
        raise ValueError(f"epsilons={epsilons!r}: must be a non-empty 1-d array of finite "
                         "numbers")
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION)
    acc.compose(_dp_sgd_event(sigma, sample_rate, steps))
    return np.asarray(acc.get_delta(list(eps)), dtype=float).reshape(eps.shape)


def noise_multiplier(eps: float, sample_rate: float, steps: int, delta: float,
                     method: str = "rdp") -> float:
    """The noise multiplier ``sigma`` with ``epsilon(sigma, ...) = eps``.

    Epsilon decreases in sigma; the root is found by Brent's method on ``log sigma`` to a
    relative precision of 1e-9 (for ``pld`` the curve is a fine staircase, so the returned
    sigma meets ``eps`` to about the discretization).  Raises ValueError when no sigma in
    [1e-3, 1e4] reaches ``eps``.
    """
    _check_method(method)
    _check_sgd(1.0, sample_rate, steps, delta)
    if not 0 < eps < math.inf:
        raise ValueError(f"eps={eps!r}: must be > 0 and finite")
    if steps < 1:
        raise ValueError(f"steps={steps!r}: must be >= 1 to calibrate noise")

    def gap(log_sigma: float) -> float:
        return epsilon(math.exp(log_sigma), sample_rate, steps, delta, method) - eps

    # Bracket the root from sigma = 1 in steps of e: up while eps is too large, else down.
    # Only the sign of the gap counts here, and a sign that says "eps is below" is right
    # even where dp_accounting leaves out an order it cannot compute (its absl warning
    # "_compute_log_a_frac failed to converge", at small sigma): leaving orders out can
    # only raise eps.  So those warnings are not printed for these points; Brent's method's
    # own evaluations (the bracket's ends and the points near the root) still print them.
    with _absl_warnings_hidden():
        x, g = 0.0, gap(0.0)
        step = 1.0 if g > 0 else -1.0
        while (g > 0) == (step > 0):
            x += step
            if not math.log(1e-3) <= x <= math.log(1e4):
                raise ValueError(f"eps={eps!r}: no sigma in [1e-3, 1e4] reaches it")
            g = gap(x)
    lo, hi = sorted((x - step, x))
    return math.exp(optimize.brentq(gap, lo, hi, xtol=1e-12, rtol=1e-9))


@contextmanager
def _absl_warnings_hidden():
    """Within this scope, warnings that dp_accounting logs through absl are not printed."""
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        yield
    finally:
        absl.setLevel(level)


def basic_composition(eps0, delta0, k):
    """Basic composition: k adaptive (eps0, delta0)-DP steps are (k eps0, k delta0)-DP.

    Dwork & Roth Theorem 3.16; Theorem 1 of the blog post "Understanding Privacy Leakage
    in Machine Learning (Part 1)"; "simple k eps" of the CSCI 699 Week 4 lecture.  Broadcasts
    over arrays of ``k``; returns ``(eps, delta)``.
    """
    k = np.asarray(k)
    if np.any(k < 1) or eps0 < 0 or not 0 <= delta0 <= 1:
        raise ValueError("need k >= 1, eps0 >= 0 and 0 <= delta0 <= 1")
    return k * eps0, k * delta0


def advanced_composition(eps0, k, delta_prime, form: str = "drv"):
    """Epsilon of k adaptive eps0-DP steps by an advanced composition theorem.

    The result is (eps, k delta0 + delta')-DP when each step is (eps0, delta0)-DP.  All forms
    share the Azuma term ``eps0 sqrt(2 k ln(1/delta'))`` and differ in the bias term, which
    bounds k times the per-step expected privacy loss (a KL divergence):

    - ``"drv"``: ``+ k eps0 (e^eps0 - 1)`` -- Dwork, Rothblum, Vadhan [DRV10] (Dwork & Roth
      Thm 3.20), the "strong composition theorem" of [ACG+16].  The blog post
      "Understanding Privacy Leakage in Machine Learning (Part 1)", eq. (2), states
      this form but prints ``sqrt(2 T ln(1/delta') eps)``, eps inside the root: a typo.
    - ``"kov"``: ``+ k eps0 (e^eps0 - 1) / (e^eps0 + 1)`` -- Kairouz, Oh, Viswanath
      [KOV15] Theorem 3.4 (last term of its min; their delta is 1 - (1 - delta0)^k (1 -
      delta')).  The sharper bias ``eps0 tanh(eps0 / 2)`` is the exact worst-case KL.
    - ``"lecture"``: ``+ k (e^eps0 - 1) / (e^eps0 + 1)`` -- the CSCI 699 Week 4 lecture
      (theorem, and graph ``0.1 sqrt(2 x ln 1000) + x (e^0.1 - 1)/(e^0.1 + 1)``) as
      printed: the KOV form without its factor eps0.  For eps0 <= 1 it is at least the
      KOV bound, hence valid but loose; for eps0 > 1 it is below KOV and not a theorem,
      so it is refused.

    Each form is a valid bound only as ``min(k eps0, ...)`` is; the raw expression is
    returned so figures can show where it beats basic composition.  Broadcasts over ``k``.
    """
    if form not in COMPOSITION_FORMS:
        raise ValueError(f"form={form!r}: must be one of {COMPOSITION_FORMS}")
    k = np.asarray(k, dtype=float)
    if np.any(k < 1) or not eps0 >= 0 or not 0 < delta_prime < 1:
        raise ValueError("need k >= 1, eps0 >= 0 and 0 < delta_prime < 1")
    if form == "lecture" and eps0 > 1:
        raise ValueError(f"eps0={eps0!r}: the 'lecture' form is valid only for eps0 <= 1")
    bias = {"drv": eps0 * math.expm1(eps0),
            "kov": eps0 * math.tanh(eps0 / 2),  # (e^x - 1)/(e^x + 1) = tanh(x/2)
            "lecture": math.tanh(eps0 / 2)}[form]
    return eps0 * np.sqrt(2 * k * math.log(1 / delta_prime)) + k * bias


def optimal_composition(eps0: float, k: int, delta_prime: float) -> float:
    """The smallest eps such that every k-fold adaptive composition of eps0-DP mechanisms
    is (eps, delta')-DP.

    By [KOV15] Theorem 3.3 the worst case is k-fold randomized response, the pair with
    privacy loss ``+eps0`` w.p. ``e^eps0 / (1 + e^eps0)`` and ``-eps0`` otherwise;
    dp_accounting builds exactly this pair (``from_privacy_parameters``), self-composes it
    and inverts its privacy profile.  Losses are rounded up to multiples of
    :data:`PLD_DISCRETIZATION`, so the value is an upper bound within about
    ``k * PLD_DISCRETIZATION`` of the exact one.
    """
    if k < 1 or k != int(k) or not eps0 > 0 or not 0 < delta_prime < 1:
        raise ValueError("need whole k >= 1, eps0 > 0 and 0 < delta_prime < 1")
    pld = privacy_loss_distribution.from_privacy_parameters(
        pld_common.DifferentialPrivacyParameters(eps0, 0.0),
        value_discretization_interval=PLD_DISCRETIZATION)
    return float(pld.self_compose(int(k)).get_epsilon_for_delta(delta_prime))


def sgd_strong_composition(sigma: float, sample_rate: float, steps: int, delta: float,
                           variant: str = "abadi") -> float:
    """Epsilon of DP-SGD by per-step (eps0, delta0) guarantees and strong composition.

    Each step is a Gaussian mechanism (sensitivity 1, std ``sigma``) run on a Poisson
    sample of rate ``q``; it is (eps0, delta0)-DP on the sample, amplified to
    (eps_step, q delta0)-DP on the data set, and ``T = steps`` steps compose by
    :func:`advanced_composition` (``"drv"``) with failure probability ``delta'``, so
    ``T q delta0 + delta' = delta``.

    - ``"abadi"``: [ACG+16] Sec. 3.1: ``eps0 = sqrt(2 ln(1.25/delta0)) / sigma`` (the
      classical Gaussian calibration, Dwork & Roth Thm 3.22), ``eps_step = q eps0`` (the
      O(q eps) of the amplification theorem with constant 1) and the even split
      ``T q delta0 = delta' = delta / 2``.  It reproduces their quoted eps = 9.34 at
      q = 0.01, sigma = 4, delta = 1e-5, T = 10^4, but is not a proof: the classical
      calibration needs eps0 < 1 (here eps0 ~ 1.5) and tight amplification gives
      ``log(1 + q (e^eps0 - 1)) ~ q (e^eps0 - 1) > q eps0``.
    - ``"sound"``: a valid bound with the same theorem: ``eps0`` is the exact Gaussian
      epsilon at delta0 (the mechanism is 1/sigma-GDP; :func:`dpaudit.bounds.eps_from_mu`,
      i.e. Balle-Wang's analytic Gaussian), ``eps_step = log(1 + q (e^eps0 - 1))``
      ([BBG18] Thm 8; "subsampling amplification" in the CSCI 699 Week 4 lecture), and
      the split of delta minimizing eps (any split is valid, so a numerical minimum is too).
    """
    if variant not in STRONG_VARIANTS:
        raise ValueError(f"variant={variant!r}: must be one of {STRONG_VARIANTS}")
    _check_sgd(sigma, sample_rate, steps, delta)
    if steps == 0:
        return 0.0
    if sigma == 0:
        return math.inf
    budget = steps * sample_rate  # delta0 = (share of delta) / budget

    if variant == "abadi":
        delta0 = delta / 2 / budget
        if delta0 >= 1:
            raise ValueError("steps * sample_rate too small for the delta split")
        eps0 = math.sqrt(2 * math.log(1.25 / delta0)) / sigma
        return float(advanced_composition(sample_rate * eps0, steps, delta / 2, "drv"))

    def eps_at(share: float) -> float:
        eps0 = eps_from_mu(1.0 / sigma, share * delta / budget)
        eps_step = math.log1p(sample_rate * math.expm1(eps0))
        return float(advanced_composition(eps_step, steps, (1 - share) * delta, "drv"))

    top = min(1 - 1e-9, 0.999 * budget / delta)  # keep delta0 < 1
    res = optimize.minimize_scalar(eps_at, bounds=(1e-9, top), method="bounded",
                                   options={"xatol": 1e-6})
    return float(res.fun)


def abadi_fig2_table(sample_rate: float, sigma: float, delta: float,
                     epochs) -> pd.DataFrame:
    """[ACG+16] Fig. 2 as a tidy table: eps vs epochs for every accountant.

    One row per (method, epochs) with ``steps = round(epochs / q)``; methods are the two
    strong-composition variants (``strong_abadi``, ``strong_sound``) and :data:`METHODS`
    (``rdp_classic`` standing in for the moments accountant).
    """
    rows = []
    for e in epochs:
        steps = int(round(e / sample_rate))
        values = {f"strong_{v}": sgd_strong_composition(sigma, sample_rate, steps, delta, v)
                  for v in STRONG_VARIANTS}
        values |= {m: epsilon(sigma, sample_rate, steps, delta, m) for m in METHODS}
        rows += [{"method": m, "epochs": float(e), "steps": steps, "sample_rate": sample_rate,
                  "sigma": sigma, "delta": delta, "eps": v} for m, v in values.items()]
    return pd.DataFrame(rows)


def composition_table(eps0: float, delta_prime: float, ks) -> pd.DataFrame:
    """The CSCI 699 Week 4 lecture's composition graph as a tidy table: eps of k
    eps0-DP steps at delta' vs k.

    One row per (method, k): ``basic`` (k eps0, a pure-DP guarantee, so its ``delta`` is
    0), the :data:`COMPOSITION_FORMS` of :func:`advanced_composition` and ``optimal``
    (:func:`optimal_composition`), each (eps, delta')-DP.
    """
    ks = np.asarray(ks, dtype=int)
    curves = {"basic": basic_composition(eps0, 0.0, ks)[0]}
    curves |= {f: advanced_composition(eps0, ks, delta_prime, f) for f in COMPOSITION_FORMS}
    curves["optimal"] = [optimal_composition(eps0, k, delta_prime) for k in ks]
    return pd.DataFrame([
        {"method": m, "k": int(k), "eps0": eps0, "delta_prime": delta_prime,
         "delta": 0.0 if m == "basic" else delta_prime, "eps": float(v)}
        for m, values in curves.items() for k, v in zip(ks, values)])
