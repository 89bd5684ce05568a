"""The shuffled-batch theory lines: the lower bound of Chua et al. (ICML 2024; NeurIPS 2024,
"Scalable DP-SGD: Shuffling vs. Poisson Subsampling") against the Gaussian mechanism it
must meet at one batch per epoch, the authors' reference implementation, what their paper
states of its numbers, and a seeded Monte Carlo of the same privacy-loss variables."""

import itertools
import math
import re
from pathlib import Path

import numpy as np
import pytest
from scipy import special, stats

from dpaudit import accounting
from dpaudit.bounds import eps_from_mu
from dpaudit.shuffle_accounting import (
    _log_out_cube,
    claimed_poisson_eps,
    no_amplification_eps,
    shuffle_delta_lower,
    shuffle_eps_lower,
    shuffle_sigma_lower,
    theory_lines,
)


@pytest.mark.parametrize("sigma, epochs, delta", [(1.0, 1, 1e-5), (0.7, 4, 1e-5),
                                                  (2.0, 3, 1e-8), (0.3, 2, 1e-6)])
def test_one_batch_per_epoch_is_the_gaussian_mechanism(sigma, epochs, delta):
    """With S = 1 the pair is N(2, s^2) against N(1, s^2) per epoch: the threshold events
    are the Neyman-Pearson tests, so the bound is the Gaussian mechanism's epsilon at noise
    sigma / sqrt(E) (Balle and Wang 2018, Theorem 8; [CGK+24b] Theorem 3.1)."""
    exact = eps_from_mu(math.sqrt(epochs) / sigma, delta)
    assert shuffle_eps_lower(sigma, 1, epochs, delta, "persistent") == pytest.approx(
        exact, abs=1e-7)
    dynamic = shuffle_eps_lower(sigma, 1, epochs, delta)  # E-fold composed PLD
    assert exact - 0.01 < dynamic <= exact + 1e-9


# (sigma, S, E, delta): epsilon of the authors' reference implementation
# (github.com/google-research/google-research, dpsgd_batch_sampler_accounting/dpsgd_bounds.py,
# ShuffleAccountant.get_epsilons at commit 4c42994; reshuffle=True is dynamic, False
# persistent), run with dp-accounting 0.4 for this test.
REFERENCE = [((0.35, 1000, 1, 1e-6), 17.076114, 17.076114),
             ((0.5, 1000, 1, 1e-6), 10.996902, 10.996902),
             ((0.737, 100, 1, 1e-5), 6.233680, 6.233680),
             ((0.852, 100, 5, 1e-5), 10.733847, 14.046230),
             ((0.803, 10, 5, 1e-5), 14.647243, 15.148814),
             ((1.0, 100, 3, 1e-5), 5.885012, 8.384191),
             ((0.6, 1000, 2, 1e-6), 13.237745, 13.436516)]


@pytest.mark.parametrize("setting, dynamic, persistent", REFERENCE)
def test_matches_the_authors_reference_implementation(setting, dynamic, persistent):
    """Their code takes the threshold on a grid of step 0.01 and rounds the same way; ours
    refines the threshold (so a one-epoch value may only be higher, by less than 2e-3) and
    slices the same maximum (the same to 1e-4)."""
    ours_persistent = shuffle_eps_lower(*setting, "persistent")
    assert persistent - 1e-6 <= ours_persistent <= persistent + 2e-3
    ours_dynamic = shuffle_eps_lower(*setting)
    if setting[2] == 1:  # one epoch: the same threshold bound
        assert ours_dynamic == ours_persistent
    else:
        assert ours_dynamic == pytest.approx(dynamic, abs=1e-4)


def test_the_papers_statement_of_where_shuffling_needs_more_noise_than_poisson():
    """[CGK+24b] Section 4 (Figure 4): batch 65,536 of the Criteo training set (about 36.7
    million examples, so S = 560 batches per epoch), delta = 2.7e-8: shuffling, with the
    lower bound, needs more noise than Poisson accounting at small eps (eps = 1, one and
    five epochs) and less at large eps ("at large eps the noise required under Poisson
    subsampling is in fact larger"); here eps = 32, one epoch."""
    steps, delta = 560, 2.7e-8
    for epochs in (1, 5):
        sigma = shuffle_sigma_lower(1.0, delta, steps, epochs)
        assert claimed_poisson_eps(sigma, steps, epochs, delta) < 1.0  # sigma_P < sigma
    sigma = shuffle_sigma_lower(32.0, delta, steps, 1)
    assert claimed_poisson_eps(sigma, steps, 1, delta) > 32.0  # sigma_P > sigma


def _log_density_of_max(m, sigma, steps, mean):
    """Density of max_s w_s under (1/S) sum_s N(mean e_s, sigma^2 I), differentiated from
    the cube mass by hand (scipy.stats, independent of the module)."""
    z, c = (m - mean) / sigma, m / sigma
    own = stats.norm.logpdf(z) + (steps - 1) * stats.norm.logcdf(c)
    others = (math.log(steps - 1) + stats.norm.logcdf(z) + stats.norm.logpdf(c)
              + (steps - 2) * stats.norm.logcdf(c))
    return np.logaddexp(own, others) - math.log(sigma)


def test_monte_carlo_of_the_same_privacy_loss_variables():
    """Seeded draws from P (the canary's batch at a uniform position each epoch, value 2).
    The privacy loss of the maximum (its exact densities) gives the divergence the bound
    computes by slicing; the full likelihood ratio of the mixtures gives the pair's own,
    which the bound may not exceed."""
    rng = np.random.default_rng(41)
    sigma, steps, epochs, n = 0.8, 10, 3, 100_000
    w = rng.standard_normal((n, epochs, steps)) * sigma
    w[np.arange(n)[:, None], np.arange(epochs), rng.integers(0, steps, (n, epochs))] += 2.0
    full = (special.logsumexp((2 * w - 2) / sigma ** 2, axis=2)
            - special.logsumexp((w - 0.5) / sigma ** 2, axis=2)).sum(1)
    m = w.max(axis=2)
    of_max = (_log_density_of_max(m, sigma, steps, 2.0)
              - _log_density_of_max(m, sigma, steps, 1.0)).sum(1)
    for eps in (1.0, 2.0, 3.0):
        bound = shuffle_delta_lower(sigma, steps, epochs, eps)
        for loss, slack in ((of_max, 0.0), (full, None)):
            terms = np.clip(1 - np.exp(eps - loss), 0, None)
            mc, se = terms.mean(), terms.std() / math.sqrt(n)
            assert bound <= mc + 4 * se
            if slack is not None:
                assert bound >= mc - 4 * se - 2e-3  # rounding gives up a little
    # one epoch: the closed-form mass of {max > C} against the draws
    for c in (1.5, 2.5, 3.5):
        hits = (m[:, 0] > c).mean()
        assert math.exp(_log_out_cube(c, sigma, steps, 2.0)) == pytest.approx(
            hits, abs=4 * math.sqrt(hits * (1 - hits) / n))


def test_never_above_no_amplification_and_monotone():
    """Each epoch touches each example once, so the Gaussian mechanism at sigma / sqrt(E)
    bounds every shuffling from above (joint convexity); the bound falls as the noise grows
    and grows with the epochs (composition).  Also where the losses are beyond float's
    exp (sigma = 0.01, eps in the thousands)."""
    for sigma, steps, epochs, delta in [(0.35, 1000, 1, 1e-6), (0.852, 100, 5, 1e-5),
                                        (0.01, 560, 3, 2.7e-8), (0.1, 560, 3, 2.7e-8),
                                        (3.0, 50, 4, 1e-5)]:
        top = no_amplification_eps(sigma, epochs, delta)
        for shuffling in ("dynamic", "persistent"):
            assert 0 <= shuffle_eps_lower(sigma, steps, epochs, delta, shuffling) <= top + 1e-9
    sigmas = [0.5, 0.7, 1.0, 1.5, 2.5]
    values = [shuffle_eps_lower(s, 100, 3, 1e-5) for s in sigmas]
    assert all(a > b for a, b in itertools.pairwise(values)), values
    by_epochs = [shuffle_eps_lower(1.0, 100, e, 1e-5) for e in (1, 2, 4, 8)]
    assert all(a < b for a, b in itertools.pairwise(by_epochs)), by_epochs


def test_sigma_lower_is_where_the_bound_meets_eps():
    sigma = shuffle_sigma_lower(2.0, 1e-5, 100, 3)
    assert shuffle_eps_lower(sigma, 100, 3, 1e-5) >= 2.0
    assert shuffle_eps_lower(sigma * 1.001, 100, 3, 1e-5) < 2.0
    # one batch per epoch: the Gaussian mechanism's calibration
    sigma = shuffle_sigma_lower(3.0, 1e-6, 1, 1, "persistent")
    assert eps_from_mu(1 / sigma, 1e-6) == pytest.approx(3.0, abs=1e-5)


def test_the_claim_is_the_projects_poisson_pld_accountant():
    """q = B / n = 1 / S for S E steps, add/remove (= zero-out for Poisson)."""
    assert claimed_poisson_eps(1.192, 10, 2, 1e-5) == accounting.epsilon(
        1.192, 0.1, 20, 1e-5, "pld")


@pytest.mark.parametrize("call, name", [
    (lambda: shuffle_eps_lower(0.0, 10, 1, 1e-5), "sigma"),
    (lambda: shuffle_eps_lower(1.0, 0, 1, 1e-5), "steps_per_epoch"),
    (lambda: shuffle_eps_lower(1.0, 10, 2.5, 1e-5), "epochs"),
    (lambda: shuffle_eps_lower(1.0, 10, 1, 1.0), "delta"),
    (lambda: shuffle_eps_lower(1.0, 10, 1, 1e-5, "cyclic"), "shuffling"),
    (lambda: shuffle_delta_lower(1.0, 10, 1, -1.0), "eps"),
    (lambda: shuffle_sigma_lower(0.0, 1e-5, 10, 1), "eps"),
])
def test_bad_arguments_are_named(call, name):
    with pytest.raises(ValueError, match=f"^{name}="):
        call()


def test_docs_table_is_the_tests_numbers():
    """docs/shuffle.md's table of the reference code's values holds the numbers above,
    and ours as computed, to the four decimals it prints."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "shuffle.md").read_text()
    rows = [line for line in text.splitlines() if "| reference code" in line]
    assert len(rows) == len(REFERENCE)
    for row, (setting, dynamic, persistent) in zip(rows, REFERENCE):
        cells = [c.strip() for c in row.strip("|").split("|")]
        sigma, steps, epochs, delta = (float(x) for x in cells[0].split(","))
        assert (sigma, int(steps), int(epochs), delta) == setting
        theirs = [float(x) for x in cells[2].split("/")]
        ours = [float(x) for x in cells[3].split("/")]
        names = ("dynamic", "persistent") if "/" in cells[2] else ("persistent",)
        assert theirs == [round(dynamic if n == "dynamic" else persistent, 4) for n in names]
        assert ours == [round(shuffle_eps_lower(*setting, n), 4) for n in names]


def test_docs_gap_table_is_current():
    """docs/shuffle.md's table of the lines at a few settings, to the decimals it prints."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "shuffle.md").read_text()
    table = text.split("## The gap at a few settings")[1].split("\n## ")[0]
    rows = [line for line in table.splitlines() if re.match(r"\| \d", line)]
    assert len(rows) == 5
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        steps, epochs, claim, sigma = int(cells[0]), int(cells[1]), float(cells[2]), float(
            cells[3])
        lines = theory_lines(sigma, steps, epochs, 1e-5)
        assert round(lines["claimed_eps"], 1) == claim
        assert [float(c) for c in cells[4:7]] == [round(lines[k], 2) for k in (
            "shuffle_lb", "shuffle_lb_persistent", "no_amplification")]
        assert [float(x) for x in cells[7].split("/")] == [
            round(shuffle_sigma_lower(claim, 1e-5, steps, epochs, s), 2)
            for s in ("dynamic", "persistent")]
