"""``dpaudit opacus-check`` (dpaudit.adapters.opacus_probe) on users' own Opacus training
functions (dpaudit.adapters.opacus_flaws): each flaw flagged with its numbers, checked against
Opacus' own accountants at the true parameters, and a correct loop left alone."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("opacus")

from opacus.accountants import PRVAccountant, RDPAccountant  # noqa: E402
from opacus.accountants.utils import get_noise_multiplier  # noqa: E402
from opacus.optimizers.optimizer import DPOptimizer  # noqa: E402

from dpaudit import shuffle_accounting  # noqa: E402
from dpaudit.adapters import opacus_flaws as cases  # noqa: E402
from dpaudit.adapters import opacus_probe as probe  # noqa: E402
from dpaudit.cli import main  # noqa: E402

DELTA = cases.DELTA


def _eps(accountant, sigma, q, steps):
    acc = accountant()
    acc.history = [(sigma, q, steps)]
    return acc.get_epsilon(DELTA)


def _whats(report):
    return sorted(f.what for f in report.findings)


def test_a_correct_make_private_loop_has_no_finding():
    """n = 22, B = 5: len(loader) = 5 on 22 and 23 rows, so q = 0.2, 25 steps and the
    divisor int(22 * 0.2) = int(23 * 0.2) = 4 on both; PRV eps at them is the report."""
    state = torch.random.get_rng_state()
    r = probe.check(cases.correct, 22, DELTA)
    assert torch.equal(state, torch.random.get_rng_state())  # the caller's generator kept
    assert r.findings == () and r.status == probe.EXIT_CONSISTENT
    a, b = r.runs
    assert (a.steps, a.q, a.sampling, b.steps, b.q) == (25, 0.2, "poisson", 25, 0.2)
    assert (a.divisor, b.divisor) == pytest.approx((4, 4), rel=1e-6)
    assert a.clip_max == pytest.approx(1.0, abs=1e-4) and a.noise_ci[0] < 1 < a.noise_ci[1]
    assert a.per_example and b.per_example
    want = _eps(PRVAccountant, 1.0, 0.2, 25)
    assert r.eps_accountant == pytest.approx(want, rel=1e-6)
    assert a.reported_eps == pytest.approx(want, rel=1e-6)
    assert r.eps_pld == pytest.approx(want, rel=0.02)  # dp_accounting's PLD, a second method
    assert DPOptimizer.__init__.__module__ == "opacus.optimizers.optimizer"  # restored


def test_sigma_calibrated_for_the_wrong_sample_rate():
    r = probe.check(cases.wrong_rate, 22, DELTA, pld=False)
    assert _whats(r) == ["epsilon"]
    sigma = get_noise_multiplier(target_epsilon=2.0, target_delta=DELTA, sample_rate=0.02,
                                 steps=25, accountant="rdp")
    assert r.runs[0].sigma == pytest.approx(sigma, rel=1e-9)
    assert r.runs[0].reported_eps == 2.0
    assert r.eps_accountant == pytest.approx(_eps(RDPAccountant, sigma, 0.2, 25), rel=1e-6)
    assert r.eps_accountant > 4 * 2.0


def test_eps_reported_for_one_epoch_of_five():
    r = probe.check(cases.one_epoch, 22, DELTA, pld=False)
    assert _whats(r) == ["epsilon"]
    assert r.runs[0].reported_eps == pytest.approx(_eps(RDPAccountant, 1.0, 0.2, 5), rel=1e-6)
    assert r.eps_accountant == pytest.approx(_eps(RDPAccountant, 1.0, 0.2, 25), rel=1e-6)


def test_noise_not_scaled_by_the_clipping_norm():
    """clip 4, noise std 1 = sigma, not sigma * 4: the measured std's interval holds 1 and
    not 4, and eps is accounted at its upper end over the clip (about 1/4)."""
    r = probe.check(cases.unscaled_noise, 22, DELTA, pld=False)
    assert _whats(r) == ["epsilon", "noise"]
    a = r.runs[0]
    assert a.declared_std == 4.0 and a.noise_ci[0] < 1.0 < a.noise_ci[1] < 1.5
    assert a.sigma == pytest.approx(a.noise_ci[1] / 4, rel=1e-12)
    assert r.eps_accountant == pytest.approx(_eps(RDPAccountant, a.sigma, 0.2, 25), rel=1e-6)
    assert r.eps_accountant > _eps(RDPAccountant, 0.375, 0.2, 25) > 5 * a.reported_eps
    assert a.reported_eps == pytest.approx(_eps(RDPAccountant, 1.0, 0.2, 25), rel=1e-6)


def test_shuffled_batches_against_chua_et_al():
    """poisson_sampling=False on n = 20, B = 5: four fixed batches per epoch; Chua et al.'s
    lower bound at sigma 1, 4 batches, 5 epochs is above the Poisson eps reported."""
    r = probe.check(cases.shuffled, 20, DELTA, pld=False)
    a = r.runs[0]
    assert (a.sampling, a.steps_per_epoch, a.steps, set(a.sizes)) == ("fixed", 4, 20, {5})
    assert a.reported_eps == pytest.approx(_eps(RDPAccountant, 1.0, 0.25, 20), rel=1e-6)
    lb = shuffle_accounting.shuffle_eps_lower(1.0, 4, 5, DELTA)
    assert r.eps_shuffle_lb == pytest.approx(lb, rel=1e-9) and lb > a.reported_eps
    assert "sampling" in _whats(r)
    assert r.runs[1].sizes[:5] == (5, 5, 5, 5, 1)  # 21 rows: a fifth batch of one


def test_n_and_n_plus_one_are_trained_differently():
    """make_private on n = 20 and 21 rows at B = 5 (the situation of meta-pytorch/opacus#571
    and #819): q = 1/4 and 1/5, 20 and 25 steps, divisor int(20/4) = 5 and int(21/5) = 4."""
    r = probe.check(cases.correct, 20, DELTA, pld=False)
    assert _whats(r) == ["neighbours"] * 3
    text = " ".join(f.message for f in r.findings)
    for part in ("steps depends on the data set's size: 20 on n = 20, 25 on n + 1 = 21",
                 "sample rate depends on the data set's size: 0.25 on n = 20, 0.2 on",
                 "normaliser depends on the data set's size: 5 on n = 20, 4 on"):
        assert part in text
    a, b = r.runs
    assert (a.divisor, b.divisor) == pytest.approx((int(20 * (1 / 4)), int(21 * (1 / 5))),
                                                  rel=1e-6)
    assert (a.expected_batch_size, b.expected_batch_size) == (5, 4)


def test_division_by_the_sampled_batch_size_and_the_cli_exit_status(capsys):
    assert main(["opacus-check", "--train", "dpaudit.adapters.opacus_flaws:sampled_mean", "--delta",
                 "1e-5", "--n", "22"]) == probe.EXIT_FINDINGS
    out = capsys.readouterr().out
    assert "| normaliser (expected_batch_size) | sampled" in out
    assert "FINDING normaliser: the noisy sum is divided by the sampled batch size (ASGM)" in out


def test_clipping_of_the_batch_sum_not_of_each_example():
    r = probe.check(cases.batch_clipping, 22, DELTA, pld=False)
    assert _whats(r) == ["clip"] and "clipping not per example" in r.findings[0].message
    assert not r.runs[0].per_example and r.runs[0].clip_max <= 1.0


def _raises(X, y, seed):
    raise RuntimeError("no data loader\nsecond line")


def _no_optimizer(X, y, seed):
    return None, 1.0


def _bad_eps(X, y, seed):
    return None, "eps"


@pytest.mark.parametrize("argv, line", [
    (["--train", "test_opacus_probe:_bad_eps"], "reported_eps='eps': must be a finite"),
    (["--train", "fixed"], "--train 'fixed': a registry subject of audit-impl"),
    (["--train", "no_such_module_x:f"], "cannot import module 'no_such_module_x'"),
    (["--train", "test_opacus_probe:_raises"], "raised RuntimeError: no data loader"),
    (["--train", "test_opacus_probe:_no_optimizer"], "no DPOptimizer step was seen"),
])
def test_bad_input_is_one_line_and_exit_2(argv, line, capsys):
    assert main(["opacus-check", "--delta", "1e-5", "--n", "5", *argv]) == 2
    err = capsys.readouterr().err
    assert line in err and len(err.strip().splitlines()) == 1, err


def test_a_bad_delta_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["opacus-check", "--train", "m:f", "--delta", "2"])
    assert exc.value.code == 2 and "--delta" in capsys.readouterr().err
    assert not math.isnan(probe.ALPHA)


def test_a_sample_rate_fixed_in_advance_trains_n_and_n_plus_one_alike():
    """The fix of make_private's size-dependent sampling (opacus_flaws.fixed_rate): Poisson
    at q = B / 20 and the divisor B on 20 and 21 rows alike, no finding; the reported eps
    is Opacus' RDP at q 0.25, int(1 / q) = 4 steps per epoch."""
    r = probe.check(cases.fixed_rate, 20, DELTA, pld=False)
    assert r.findings == ()
    a, b = r.runs
    assert (a.q, b.q, a.steps, b.steps, a.sampling) == (0.25, 0.25, 20, 20, "poisson")
    assert (a.divisor, b.divisor) == pytest.approx((5, 5), rel=1e-6)
    assert a.reported_eps == pytest.approx(_eps(RDPAccountant, 1.0, 0.25, 20), rel=1e-6)
