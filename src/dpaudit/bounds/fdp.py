"""One-run audits in f-DP ([MMC25]): of mu-GDP and of (eps, delta)-DP.

The bound on P[at least v of r guesses correct] for an f-DP mechanism, by a recursion over
the number of correct guesses, turned into audits.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from scipy import special

from ._checks import _check_delta, _check_level, _one_run_counts


def _fdp_args(m, r, v, beta) -> tuple[int, int, int]:
    """Scalar one-run counts (:func:`_one_run_counts`) with ``m >= 1``, and a valid beta."""
    for name, a in (("m", m), ("r", r), ("v", v)):
        if np.ndim(a):
            raise ValueError(f"{name}={a!r}: must be a single whole number")
    m, r, v = (int(a) for a in _one_run_counts(m, r, v))
    _check_level("beta", beta)
    return m, r, v


def _fdp_one_run_rejects(inv_blowup: Callable[[np.ndarray], np.ndarray], n: int, m: int,
                         r: int, v: int, beta: float) -> np.ndarray:
    """Does the [MMC25] analysis reject each of ``n`` hypothesised trade-off functions?

    ``inv_blowup(y)`` maps an array of ``n`` probabilities (one per hypothesis) to
    ``f(1 - y)``: the least probability an event can have under one neighbouring input when
    it has probability ``y`` under the other.  Returns a boolean array: True where "the
    mechanism is f-DP" and "at least ``v`` of ``r`` guesses correct with probability
    ``>= beta``" contradict each other, i.e. where f-DP is rejected at level ``beta``.
    """
    cap = r / m  # P[the uniformly drawn canary I is guessed] exactly: r guesses always
    # state at level v: mass beta placed at exactly v correct (the extremal case)
    corr = np.full(n, beta * v / m)
    wrong = np.full(n, beta * (r - v) / m)
    for i in range(v - 1, -1, -1):
        need = inv_blowup(np.minimum(corr, 1.0)) - wrong
        live = (need > 0.0) & (corr + wrong <= cap)
        if not live.any():  # every hypothesis frozen (need <= 0 stays so) or already over
            break
        np.maximum(need, 0.0, out=need)
        corr += (i / (r - i)) * need
        wrong += need
    return corr + wrong > cap


def _fdp_largest_rejected(inv_blowup_factory, m: int, r: int, v: int, beta: float,
                          lo: float = 1e-6, hi: float = 100.0, n: int = 256,
                          refine: int = 2) -> float:
    """Lower end of the bracket of the smallest parameter NOT rejected (0.0 if ``lo`` is not).

    ``inv_blowup_factory(params)`` returns the vectorised ``y -> f_param(1 - y)`` for an
    array of parameters, the trade-off growing weaker as the parameter grows (rejection is
    then monotone: a prefix of any increasing grid).  One geometric grid of ``n`` points on
    ``[lo, hi]``, then ``refine`` linear grids inside the bracket (relative precision about
    ``1e-6`` with the defaults).  The answer is the largest grid value below the first
    non-rejected one: all smaller tested values were rejected, so it never overshoots.
    Values above ``hi`` are reported as ``hi``.
    """
    if v == 0:
        return 0.0
    grid = np.geomspace(lo, hi, n)
    for _ in range(refine + 1):
        rej = _fdp_one_run_rejects(inv_blowup_factory(grid), grid.size, m, r, v, beta)
        j = int(np.argmin(rej)) if not rej.all() else grid.size
        if j == 0:  # only in the first round: later grids start at a rejected value
            return 0.0
        if j == grid.size:
            return float(grid[-1])
        grid = np.linspace(grid[j - 1], grid[j], n)[:-1]  # grid[j-1] is rejected, grid[j] not
    return float(grid[0])  # rejected; the next grid value up was not


def mu_lb_one_run_gdp(m, r, v, beta: float = 0.05) -> float:
    """One-run audit of mu-GDP by the analysis of [MMC25]: the largest mu rejected at ``beta``.

    Setting as in :func:`eps_lb_one_run`: ``m`` canaries, each included independently with
    probability 1/2, the auditor guesses in/out on ``r`` of them (abstains on the rest) and
    ``v`` guesses are correct.  The hypothesis "the mechanism is mu-GDP", i.e. ``f``-DP with
    ``f = G_mu``, ``G_mu(x) = Phi(Phi^{-1}(1 - x) - mu)`` ([DRS19]), is rejected when the
    [MMC25] bound on ``P[at least v of r guesses correct]`` under f-DP is below ``beta``.

    The bound ([MMC25], guessing game, computed by a recursion over the number of correct
    guesses).  Draw a canary ``I`` uniformly from the ``m``, let ``T`` be the number of
    correct guesses and, for ``i = 0..r``, ``C_i = P[I guessed right and T >= i]``,
    ``W_i = P[I guessed wrong and T >= i]``.  Exactly ``r`` guesses are made, so
    (1) ``C_0 + W_0 = r / m``, and since ``T = i`` means ``i`` right and ``r - i`` wrong
    guesses, (2) ``C_i - C_{i+1} = i / (r - i) * (W_i - W_{i+1})``.  Flipping canary ``I``'s
    membership turns a right guess with ``T >= i + 1`` into a wrong one with ``T >= i``;
    f-DP for that neighbouring pair and convexity of ``y -> f(1 - y)`` (Jensen over ``I``,
    the other canaries and the two memberships) give (3) ``W_i >= f(1 - C_{i+1})``, and
    trivially ``W_i >= W_{i+1}``.  If ``P[T >= v] >= beta`` then, with that mass put at
    exactly ``v`` correct, the recursion from ``C_v = beta v / m``,
    ``W_v = beta (r - v) / m`` downwards, taking at each ``i = v-1, ..., 0`` the least
    ``W_i = max(W_{i+1}, f(1 - C_{i+1}))`` that (3) allows and ``C_i`` from (2), yields the
    least total mass any f-DP mechanism needs; if ``C_0 + W_0 > r / m`` this contradicts
    (1), so ``P[T >= v] < beta`` under f-DP.  (That this greedy recursion is the optimum of
    constraints (1)-(3) was checked against a linear program in ``tests/test_bounds_fdp.py``.)
    Rejection is monotone in mu (``G_mu`` decreases in mu), so the boundary is found on a
    geometric grid refined twice (relative precision ~1e-6; values above 100 read as 100),
    every grid point evaluated at once: one vectorised pass of the recursion per grid.

    Returns the largest mu rejected (the lower end of the last bracket), 0.0 when nothing is
    rejected (e.g. ``v <= r / 2`` at ``beta < 1/2``).  With probability at least
    ``1 - beta`` the mechanism is not mu'-GDP for any mu' below it.  ``eps_from_mu(mu, delta)``
    of the result is only an *estimate* of epsilon at delta: it assumes the mechanism's
    trade-off curve has the GDP shape, and is not a certified bound; for a certified lower
    bound on epsilon at delta use :func:`eps_lb_one_run_fdp`.  Scalar arguments
    (numpy integers accepted); a ValueError names any bad argument.
    """
    m, r, v = _fdp_args(m, r, v, beta)

    def factory(mu: np.ndarray):
        return lambda y: special.ndtr(special.ndtri(y) - mu)

    return _fdp_largest_rejected(factory, m, r, v, beta)


def eps_lb_one_run_fdp(m, r, v, delta: float, beta: float = 0.05) -> float:
    """One-run audit of (eps, delta)-DP by the f-DP analysis of [MMC25]: certified eps_LB.

    Same setting and recursion as :func:`mu_lb_one_run_gdp`, with the trade-off function of
    (eps, delta)-DP, ``f(x) = max(0, 1 - delta - e^eps x, e^-eps (1 - delta - x))``, i.e.
    ``f(1 - y) = max(0, e^-eps (y - delta), 1 - delta - e^eps (1 - y))`` in the recursion.
    Returns the largest eps at which (eps, delta)-DP is rejected at level ``beta`` (0.0 if
    none), on a geometric grid refined twice (relative precision ~1e-6; capped at 100): with
    probability at least ``1 - beta`` the mechanism is not (eps', delta)-DP for any eps'
    below it, a certified lower bound on epsilon at this delta.

    Compared with [SNJ23] (:func:`eps_lb_one_run` at the same delta): the recursion uses the
    (eps, delta) curve directly instead of the ``2 m delta`` term of their Appendix D. It is
    tighter for a perfect attack (``v = r``) at every delta > 0 and everywhere at
    delta >= 1e-3, but slightly *looser* (by 0.004-0.018 in eps at m = 100..2000) for
    ``v < r`` at delta <= 1e-5; at ``delta = 0`` it cannot beat [SNJ23], whose binomial tail
    is attained by randomized response (they agree at ``v = r``: ``eps = logit(beta^(1/r))``).
    ``tests/test_bounds_fdp.py`` pins these cases; audits report both.
    Nothing is rejected when ``beta <= delta`` (a mechanism that reveals every canary with
    probability delta is (0, delta)-DP).  Scalar arguments (numpy integers accepted); a
    ValueError names any bad argument.
    """
    m, r, v = _fdp_args(m, r, v, beta)
    _check_delta(delta)

    def factory(eps: np.ndarray):
        up, down = np.exp(eps), np.exp(-eps)
        return lambda y: np.maximum(np.maximum(down * (y - delta), 1.0 - delta - up * (1.0 - y)),
                                    0.0)

    return _fdp_largest_rejected(factory, m, r, v, beta)
