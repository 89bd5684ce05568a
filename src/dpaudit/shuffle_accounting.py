"""Theory lines for DP-SGD that shuffles its batches: the epsilon claimed by Poisson
accounting, and the lower bound of [CGK+24a] and [CGK+24b] on the epsilon it really has.

The mechanism is the adaptive batch linear queries mechanism ABLQ: ``S`` batches per epoch
(``S = n / B``, a whole number), ``E`` epochs, each batch's sum of clipped (norm <= 1)
per-example values released with Gaussian noise of scale ``sigma``.  DP-SGD is its
post-processing.  Neighbours are *zero-out* ([CGK+24b] Section 2.1, after [KMS+21]): one
example is replaced by a ghost that contributes 0 to every query, so the data set keeps
its size and its batching.  For Poisson subsampling zero-out has the same
dominating pair as add/remove, ``((1 - q) N(0, s^2) + q N(1, s^2), N(0, s^2))``, so
the claim here is dp_accounting's add/remove accountant at ``q = 1 / S`` for ``S E``
steps (:func:`dpaudit.accounting.epsilon`, ``pld``), the relation of the lower bound.

The lower bound ([CGK+24b] Section 3): all examples are -1 except one, which is 1 in ``x``
and the ghost in ``x'`` (1-dimensional queries ``psi(x) = x``).  Every batch sums to
``-B`` except the canary's: ``-B + 2`` under ``x``, ``-B + 1`` under ``x'``.  Its batch
mates make the ghost's batch visible too, which Poisson's random batch sizes hide.  One
epoch gives the pair of mixtures

    P = (1/S) sum_s N(2 e_s, sigma^2 I_S),    Q = (1/S) sum_s N(e_s, sigma^2 I_S),

and ``delta(eps) >= P(G) - e^eps Q(G)`` for every event ``G``.

- One epoch, and *persistent* shuffling (one permutation kept for all epochs, so the
  canary sits in the same batch position every epoch, the pair above at noise
  ``sigma / sqrt(E)``): [CGK+24b] Theorem 3.5 with the events ``max_s w_s > C``,
  whose masses are closed-form (:func:`_log_cube`).  For a fixed ``C`` the bound inverts
  in closed form, ``eps >= log(P(G_C) - delta) - log Q(G_C)``; the supremum over ``C`` is
  taken on a grid of :data:`GRID` points and refined by a bounded scalar search.
- *Dynamic* shuffling (a fresh permutation each epoch, ``E > 1``): [CGK+24b] Theorem 3.7.
  ``max_s w_s`` is cut into slices; the slice masses under P and Q are a discrete pair
  that P, Q dominate (post-processing); its privacy loss distribution, every loss rounded
  *down* to a grid, is composed ``E`` times by FFT convolution (the PLD method of
  dp_accounting, here without tail truncation, and epsilon read off in log space where
  dp_accounting's search underflows), so the result stays a lower bound.

Every ``C`` and every partition gives a valid bound; the search only decides how tight it
is.  The true epsilon of shuffling is not known; these are lower bounds on it, which any
correct accounting must reach.  The Gaussian mechanism at noise ``sigma / sqrt(E)``
(:func:`no_amplification_eps`) is an upper bound for every shuffling (each epoch touches
each example once), so ``shuffle_eps_lower <= no_amplification_eps``; at
``S = 1`` the two meet.

References
----------
- [CGK+24a] Chua, Ghazi, Kamath, Kumar, Manurangsi, Sinha, Zhang. How Private are DP-SGD
  Implementations? ICML 2024.
- [CGK+24b] Chua, Ghazi, Kamath, Kumar, Manurangsi, Sinha, Zhang. Scalable DP-SGD:
  Shuffling vs. Poisson Subsampling. NeurIPS 2024 (arXiv:2411.04205), Section 3.
- [KMS+21] Kairouz, McMahan, Song, Thakkar, Thakurta, Xu. Practical and Private (Deep)
  Learning without Sampling or Shuffling. ICML 2021 (zero-out neighbours).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, signal, special

from .accounting import epsilon as _accounting_epsilon
from .bounds import eps_from_mu

__all__ = ["SHUFFLINGS", "GRID", "DISCRETIZATION", "claimed_poisson_eps",
           "no_amplification_eps", "shuffle_delta_lower", "shuffle_eps_lower",
           "shuffle_sigma_lower", "theory_lines"]

#: Shuffling variants of [CGK+24b]: a new permutation per epoch, or one for all epochs.
SHUFFLINGS = ("dynamic", "persistent")
#: Grid points of the threshold C before the refining search (one-epoch bound).
GRID = 20001
#: Privacy-loss grid of the multi-epoch PLD; losses are rounded down to it, so each epoch
#: gives up at most this much of the bound (coarser below sigma = 0.1, see _MAX_SLICES).
DISCRETIZATION = 1e-3
#: Mass of P outside the slices of ``max_s w_s`` (kept as two atoms, not dropped).
_LOG_TAIL = -40.0
#: Most slices of ``max_s w_s`` per epoch (memory; binds only for sigma below about 0.1).
_MAX_SLICES = 2 ** 18
#: Relative size under which composed probabilities are dropped as FFT rounding noise (so
#: the dynamic bound is tight down to a delta of about 1e-10, and valid below it).
_FFT_FLOOR = 1e-13


def _check(sigma, steps_per_epoch, epochs, delta=None, shuffling="dynamic") -> None:
    if not (isinstance(sigma, (int, float, np.floating)) and 0 < sigma < math.inf):
        raise ValueError(f"sigma={sigma!r}: must be a number > 0")
    for name, value in (("steps_per_epoch", steps_per_epoch), ("epochs", epochs)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name}={value!r}: must be a whole number >= 1")
    if delta is not None and not 0 < delta < 1:
        raise ValueError(f"delta={delta!r}: must lie strictly between 0 and 1")
    if shuffling not in SHUFFLINGS:
        raise ValueError(f"shuffling={shuffling!r}: must be one of {SHUFFLINGS}")


def _log1mexp(a):
    """``log(1 - e^a)`` for ``a <= 0``, accurate at both ends (Maechler 2012)."""
    a = np.asarray(a, dtype=float)
    with np.errstate(divide="ignore"):
        return np.where(a > -math.log(2), np.log(-np.expm1(a)), np.log1p(-np.exp(a)))


def _log_cube(caps, scale: float, steps: int, mean: float):
    """``log P[max_s w_s <= C]`` under ``(1/S) sum_s N(mean e_s, scale^2 I_S)``: by symmetry
    one coordinate is ``N(mean, scale^2)`` and ``S - 1`` are ``N(0, scale^2)``."""
    caps = np.asarray(caps, dtype=float)
    return special.log_ndtr((caps - mean) / scale) + (steps - 1) * special.log_ndtr(caps / scale)


def _log_out_cube(caps, scale: float, steps: int, mean: float):
    """``log P[max_s w_s > C]`` = ``log(1 - a b)`` (``a = Phi((C - mean) / scale)``,
    ``b = Phi(C / scale)^(S-1)``) as ``log((1 - a) + a (1 - b))`` from Gaussian log tails,
    so that it stays accurate where ``1 - a b`` is far below double precision."""
    caps = np.asarray(caps, dtype=float)
    u = (caps - mean) / scale
    log_out = special.log_ndtr(-u)
    if steps == 1:
        return log_out
    k = steps - 1
    log_tail = special.log_ndtr(-caps / scale)
    # 1 - Phi^k = k (1 - Phi) to a relative 1e-8 once k (1 - Phi) < 1e-8
    log_1mb = np.where(log_tail + math.log(k) < math.log(1e-8), math.log(k) + log_tail,
                       _log1mexp(np.minimum(k * special.log_ndtr(caps / scale), 0.0)))
    return np.logaddexp(log_out, special.log_ndtr(u) + log_1mb)


def _event_terms(caps, scale, steps):
    """``log P(G_C)`` and ``log Q(G_C)`` for ``G_C = {max_s w_s > C}``."""
    return (_log_out_cube(caps, scale, steps, 2.0), _log_out_cube(caps, scale, steps, 1.0))


def _log_slices(caps, scale, steps, mean):
    """Log masses of ``max_s w_s`` below ``caps[0]``, in each ``(caps[i], caps[i+1]]`` and
    above ``caps[-1]``: each slice as a difference of whichever of the two cumulative
    masses (below, above) is under one half there, so no mass is lost to rounding."""
    below, above = _log_cube(caps, scale, steps, mean), _log_out_cube(caps, scale, steps, mean)
    from_below = below[1:] + _log1mexp(np.minimum(below[:-1] - below[1:], 0.0))
    from_above = above[:-1] + _log1mexp(np.minimum(above[1:] - above[:-1], 0.0))
    inner = np.where(below[1:] < -math.log(2), from_below, from_above)
    return np.concatenate([[below[0]], inner, [above[-1]]])


def _cap_range(scale, steps, tail):
    """Thresholds outside which the events carry less than ``tail`` of P or are P-certain:
    below ``lo`` every coordinate of ``S`` N(0, scale^2) is under ``lo`` with probability
    at most ``tail``; above ``hi`` a union bound gives ``P(G_C) <= tail``."""
    lo = scale * float(special.ndtri(math.exp(math.log(tail) / steps)))
    hi = 2.0 - scale * float(special.ndtri(max(tail / steps, 1e-300)))
    return min(lo, 0.0), hi


def _sup_over_caps(value, lo, hi):
    """Max of ``value`` on a grid of :data:`GRID` points in [lo, hi], refined by a bounded
    search around the best one; ``-inf`` if nowhere finite."""
    caps = np.linspace(lo, hi, GRID)
    vals = value(caps)
    i = int(np.argmax(vals))
    if not np.isfinite(vals[i]):
        return -math.inf
    a, b = caps[max(i - 1, 0)], caps[min(i + 1, GRID - 1)]

    def loss(c):  # the search wants finite values; -inf (no bound at c) becomes huge
        v = float(value(np.array([c]))[0])
        return -v if np.isfinite(v) else 1e300

    res = optimize.minimize_scalar(loss, bounds=(a, b), method="bounded",
                                   options={"xatol": 1e-12 * max(1.0, abs(b))})
    return max(float(vals[i]), -float(res.fun))


def _one_epoch_delta(scale, steps, eps):
    def value(caps):
        lp, lq = _event_terms(caps, scale, steps)
        return np.exp(lp) - np.exp(eps + lq)
    lo, hi = _cap_range(scale, steps, 1e-300)
    return max(0.0, _sup_over_caps(value, lo, hi))


def _one_epoch_eps(scale, steps, delta):
    log_delta = math.log(delta)

    def value(caps):
        lp, lq = _event_terms(caps, scale, steps)
        ok = lp > log_delta
        out = np.full(lp.shape, -math.inf)
        # log(P - delta) - log Q, with log(P - delta) = log P + log(1 - delta / P)
        out[ok] = lp[ok] + _log1mexp(log_delta - lp[ok]) - lq[ok]
        return out
    lo, hi = _cap_range(scale, steps, delta / 10)
    return max(0.0, _sup_over_caps(value, lo, hi))


def _composed_losses(sigma, steps, epochs):
    """The discrete pair of one dynamic-shuffling epoch ([CGK+24b] Theorem 3.7) as its
    privacy loss distribution under P (losses rounded down to a grid), composed
    ``epochs`` times by FFT convolution without tail truncation: ``(losses, probs)``."""
    lo, hi = _cap_range(sigma, steps, math.exp(_LOG_TAIL - math.log(2 * epochs)))
    # the loss moves by about (max_s w_s - 1.5) / sigma^2: slices of width disc sigma^2 move
    # it by about one grid step; at small sigma the grid coarsens to keep _MAX_SLICES
    disc = max(DISCRETIZATION, (hi - lo) / sigma ** 2 / _MAX_SLICES)
    caps = np.linspace(lo, hi, math.ceil((hi - lo) / (disc * sigma ** 2)) + 1)
    log_p, log_q = _log_slices(caps, sigma, steps, 2.0), _log_slices(caps, sigma, steps, 1.0)
    keep = np.isfinite(log_p) & np.isfinite(log_q)
    index = np.floor((log_p[keep] - log_q[keep]) / disc).astype(np.int64)
    low = int(index.min())
    one = np.bincount(index - low, weights=np.exp(log_p[keep]))
    probs = one
    for _ in range(epochs - 1):
        probs = signal.fftconvolve(probs, one)
        # FFT rounding scatters errors of about 1e-17 of the largest value over every
        # entry; dropping all entries under _FFT_FLOOR of it removes them, and removing
        # mass of P can only lower the bound
        probs[probs < _FFT_FLOOR * probs.max()] = 0.0
    return (low * epochs + np.arange(probs.size)) * disc, probs


def _prefix_terms(losses, probs):
    """For the events ``{L >= l_k}`` (largest losses first): their P masses and the log of
    their Q masses (``Q = P e^-L``)."""
    order = slice(None, None, -1)
    losses, probs = losses[order], probs[order]
    with np.errstate(divide="ignore"):
        log_q = np.logaddexp.accumulate(np.log(probs) - losses)
    return np.cumsum(probs), log_q


def _pld_eps(losses, probs, delta):
    """``eps(delta)`` of a discrete PLD, in log space: the hockey-stick divergence is the
    largest ``P(A) - e^eps Q(A)`` over the events ``A = {L >= l_k}``, so
    ``eps = max_k log(P(A_k) - delta) - log Q(A_k)`` (dp_accounting's own search loses
    ``e^-L`` to underflow beyond ``L`` of about 745)."""
    mass_p, log_q = _prefix_terms(losses, probs)
    ok = mass_p > delta
    if not ok.any():
        return 0.0
    return max(0.0, float(np.max(np.log(mass_p[ok] - delta) - log_q[ok])))


def _pld_delta(losses, probs, eps):
    mass_p, log_q = _prefix_terms(losses, probs)
    return max(0.0, float(np.max(mass_p - np.exp(np.minimum(eps + log_q, 0.0)))))


def shuffle_delta_lower(sigma: float, steps_per_epoch: int, epochs: int, eps: float,
                        shuffling: str = "dynamic") -> float:
    """A lower bound on the smallest delta at which ABLQ with shuffled batches is
    (eps, delta)-DP for zero-out neighbours ([CGK+24b] Theorems 3.5 and 3.7); see the
    module docstring."""
    _check(sigma, steps_per_epoch, epochs, None, shuffling)
    if not 0 <= eps < math.inf:
        raise ValueError(f"eps={eps!r}: must be a number >= 0")
    if shuffling == "persistent" or epochs == 1:
        return _one_epoch_delta(sigma / math.sqrt(epochs), steps_per_epoch, eps)
    return _pld_delta(*_composed_losses(sigma, steps_per_epoch, epochs), eps)


def shuffle_eps_lower(sigma: float, steps_per_epoch: int, epochs: int, delta: float,
                      shuffling: str = "dynamic") -> float:
    """A lower bound on the epsilon at ``delta`` of ABLQ (hence of DP-SGD, all iterates)
    with ``steps_per_epoch`` shuffled batches per epoch for ``epochs`` epochs, noise
    multiplier ``sigma``, zero-out neighbours: [CGK+24a] for one epoch, [CGK+24b]
    Theorem 3.5 (``persistent``) and 3.7 (``dynamic``, the default) for several.

    Accuracy: one epoch and persistent shuffling are closed-form for each threshold (log
    space, scipy's ``log_ndtr``), the supremum refined to about 1e-9; dynamic shuffling
    loses at most :data:`DISCRETIZATION` per epoch to rounding and, for delta below about
    1e-10, what :data:`_FFT_FLOOR` drops: always downwards.
    """
    _check(sigma, steps_per_epoch, epochs, delta, shuffling)
    if shuffling == "persistent" or epochs == 1:
        return _one_epoch_eps(sigma / math.sqrt(epochs), steps_per_epoch, delta)
    return _pld_eps(*_composed_losses(sigma, steps_per_epoch, epochs), delta)


def shuffle_sigma_lower(eps: float, delta: float, steps_per_epoch: int, epochs: int,
                        shuffling: str = "dynamic") -> float:
    """A noise multiplier below which shuffled DP-SGD is certainly *not* (eps, delta)-DP:
    the ``sigma`` where :func:`shuffle_eps_lower` comes down to ``eps`` ([CGK+24b]
    Section 4, "lower bound on sigma_S").  More noise is post-processing, so the true
    epsilon falls with sigma; at the returned sigma the lower bound is still >= ``eps``,
    hence every smaller sigma fails too, and correct shuffle accounting needs more.
    Found by Brent's method on ``log sigma`` to a relative 1e-7, then moved down until
    the bound holds.  Raises ValueError when no sigma in [1e-3, 1e3] reaches ``eps``.
    """
    _check(1.0, steps_per_epoch, epochs, delta, shuffling)
    if not 0 < eps < math.inf:
        raise ValueError(f"eps={eps!r}: must be > 0 and finite")

    def gap(log_sigma):
        return shuffle_eps_lower(math.exp(log_sigma), steps_per_epoch, epochs, delta,
                                 shuffling) - eps

    lo, hi = math.log(1e-3), math.log(1e3)
    if gap(lo) < 0 or gap(hi) > 0:
        raise ValueError(f"eps={eps!r}: no sigma in [1e-3, 1e3] reaches it")
    x = optimize.brentq(gap, lo, hi, xtol=1e-7, rtol=1e-9)
    step = 1e-7
    while gap(x) < 0:  # stay on the side where the bound is at least eps
        x, step = x - step, 2 * step
    return math.exp(x)


def claimed_poisson_eps(sigma: float, steps_per_epoch: int, epochs: int,
                        delta: float) -> float:
    """The epsilon a shuffled implementation reports: Poisson subsampling at
    ``q = 1 / steps_per_epoch`` (= B / n) for ``steps_per_epoch * epochs`` steps, add/remove
    (= zero-out for Poisson), dp_accounting's PLD (:func:`dpaudit.accounting.epsilon`)."""
    _check(sigma, steps_per_epoch, epochs, delta)
    return _accounting_epsilon(sigma, 1.0 / steps_per_epoch, steps_per_epoch * epochs,
                               delta, "pld")


def no_amplification_eps(sigma: float, epochs: int, delta: float) -> float:
    """Epsilon of the Gaussian mechanism at noise ``sigma / sqrt(epochs)`` (sensitivity 1,
    ``mu = sqrt(epochs) / sigma`` GDP, exact): DP-SGD with any batches that hold each
    example once per epoch, no amplification counted; an upper bound on shuffling."""
    _check(sigma, 1, epochs, delta)
    return eps_from_mu(math.sqrt(epochs) / sigma, delta)


def theory_lines(sigma: float, steps_per_epoch: int, epochs: int, delta: float) -> dict:
    """The lines an audit of shuffled DP-SGD is drawn against, all for zero-out neighbours
    at ``delta``: ``claimed_eps`` (Poisson PLD, what implementations report),
    ``shuffle_lb`` and ``shuffle_lb_persistent`` ([CGK+24b] lower bounds, dynamic and
    persistent shuffling) and ``no_amplification`` (upper bound for shuffling)."""
    return {"claimed_eps": claimed_poisson_eps(sigma, steps_per_epoch, epochs, delta),
            "shuffle_lb": shuffle_eps_lower(sigma, steps_per_epoch, epochs, delta),
            "shuffle_lb_persistent": shuffle_eps_lower(sigma, steps_per_epoch, epochs,
                                                       delta, "persistent"),
            "no_amplification": no_amplification_eps(sigma, epochs, delta)}
