"""``dpaudit audit-impl --opacus-loop`` (dpaudit.adapters.opacus_loop): a user's own Opacus
loop (tests/opacus_loop_cases.py), run unmodified in every mode, its reported eps the
claim; the canary row placed by Opacus' own loader, its gradient replaced before Opacus
clips it, the numbers against closed forms and Opacus' own accountant."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("opacus")

import opacus_loop_cases as cases  # noqa: E402
from opacus.accountants import RDPAccountant  # noqa: E402

from dpaudit import dpsgd  # noqa: E402
from dpaudit.adapters.opacus_loop import OpacusLoop, marker  # noqa: E402
from dpaudit.cli import main  # noqa: E402
from dpaudit.experiments import tramer  # noqa: E402
from dpaudit.experiments.tight.whitebox import canary as dirac  # noqa: E402
from dpaudit.io import read_table  # noqa: E402

N = 20


def _data(n=N, d=10):
    """n rows of d features: feature 0 zero everywhere (the quiet coordinate the white
    box's Dirac canary takes), feature 1 the label's sign, learnable through the noise."""
    gen = torch.Generator().manual_seed(0)
    y = torch.arange(n) % 2
    X = torch.rand(n, d, generator=gen)
    X[:, 0] = 0.0
    X[:, 1] = 4.0 * y - 2.0
    return X, y


def _rdp(sigma, q, steps):
    acc = RDPAccountant()
    acc.history = [(sigma, q, steps)]
    return acc.get_epsilon(cases.DELTA)


def _audit(tmp_path, monkeypatch, train, *flags, runs=20):
    X, y = _data(N + 10)  # 10 rows after the first N for worst-case-init's pre-training
    monkeypatch.setattr("dpaudit.data.load_fmnist",
                        lambda root, classes, **kw: (X.numpy(), y.numpy()))
    out = tmp_path / "a.csv"
    code = main(["audit-impl", "--train", f"opacus_loop_cases:{train}", "--opacus-loop",
                 "--delta", "1e-5", "--runs", str(runs), "--val-runs", "5", "--n-train",
                 str(N), "--alpha", "0.05", "--seed", "0", "--out", str(out), *flags])
    return code, out


def test_black_box_correct_loop_claims_its_reported_eps_and_passes(tmp_path, monkeypatch,
                                                                     capsys):
    """make_private on 20 and 21 rows at B = 5: q = 1/4 and 1/5, 8 and 10 steps; the claim
    is Opacus' RDP eps on 20 rows (the larger), the row says both and the relation."""
    code, out = _audit(tmp_path, monkeypatch, "correct", "--eps", "1.5", "--seed-check", "0")
    err = capsys.readouterr().err
    assert code == 0, err
    row = read_table(out)[0].iloc[0]
    e0, e1 = _rdp(cases.SIGMA, 1 / 4, 8), _rdp(cases.SIGMA, 1 / 5, 10)
    assert e0 > e1
    assert row.claimed_eps == pytest.approx(e0, rel=1e-9)
    assert (row.reported_eps_n, row.reported_eps_n1) == pytest.approx((e0, e1), rel=1e-9)
    assert (row.rows_without, row.rows_with, row.relation) == (N, N + 1, "add/remove")
    assert row.given_eps == 1.5 and "--eps 1.5 differs: recorded, not tested" in err
    assert row.claim_source == "reported by train"
    runs = json.loads(row.measured)
    assert [(r["rows"], r["q"], r["steps"], r["expected_batch_size"]) for r in runs] == \
        [(N, 0.25, 8, 5), (N + 1, 0.2, 10, 4)]  # make_private's 1 / len(loader), floored
    assert json.loads(row.measured_spec)["clip"] == cases.CLIP
    assert row.verdict == tramer.NO_VIOLATION and row.eps_lb < e0
    assert "profile test against correct DP-SGD at noise multiplier 3, q = 0.25, T = 8" in err


def test_white_box_certifies_noise_divided_by_a_hundred(tmp_path, monkeypatch, capsys):
    """tiny_noise reports the eps of sigma 3 and adds sigma 0.03: the white box (Opacus'
    loader placing the canary row, every iterate scored) certifies eps_LB above the claim
    at the first look of a sequential audit; no profile test, since the claim is below
    RDP's eps at the declared noise."""
    code, out = _audit(tmp_path, monkeypatch, "tiny_noise", "--mode", "white-box",
                       "--sequential", "--seed-check", "2", runs=60)
    err = capsys.readouterr().err
    assert code == 0, err
    row = read_table(out)[0].iloc[0]
    assert row.claimed_eps == pytest.approx(_rdp(cases.SIGMA, 1 / 4, 8), rel=1e-9)
    assert row.verdict == tramer.VIOLATES and row.eps_lb > row.claimed_eps
    assert row.stop_reason == "certified" and row.relation == "add/remove"
    assert "no profile test: the claim 1.179 is below RDP's eps" in err


def _canaries(X, spec, inside, runs, mates=0.0):
    model = dpsgd.ModelSpec(spec["arch"], X.shape[1], 32, spec["n_classes"])
    d = dirac(X.numpy(), model, spec["clip"], 0, device="cpu")
    return dpsgd.GradientCanaries(d, torch.full((runs, 1), inside), mates=mates)


@pytest.mark.parametrize("mates", [0.0, -1.0])
def test_the_canary_rows_gradient_is_replaced_before_clipping(mates):
    """A full batch, two steps, no noise, clip C = 2, lr 1: each step along the Dirac
    canary g is lr / B times the clipped sum there, the data's part 0 (feature 0 is zero).
    With the canary row (B = n + 1): C^2 f from it, f = C / (C + 1e-6) Opacus' clip factor;
    with mates -1 each of the n rows adds -C^2 f. Without it (B = n): 0, or -C^2 f."""
    X, y = _data()
    loop = OpacusLoop(cases.one_batch)
    c = loop.claim(X, y, [0], {"delta": cases.DELTA})
    spec = c["spec"]
    assert spec["clip"] == 2.0 and spec["opacus_loop"]["shuffle"] == [N, N]
    C, f = 2.0, 2.0 / (2.0 + 1e-6)
    for inside, B in ((True, N + 1), (False, N)):
        given = _canaries(X, spec, inside, 2, mates)
        run = loop(X, y, [3, 4], spec, canaries=given)
        along = (1.0 if inside else 0.0) + mates * N
        assert run.scores[:, 0].tolist() == pytest.approx([2 * C * C * f * along / B] * 2,
                                                          rel=1e-5, abs=1e-9)
        assert run.llr is None  # no noise
        assert given.insertions[0].counts[:, 0].tolist() == [2 * int(inside)] * 2


def test_shuffled_loader_holds_the_canary_row_once_per_epoch_poisson_at_its_rate():
    """poisson_sampling=False: 21 rows at B = 5 give 5 batches an epoch, the canary row in
    exactly one of them each epoch (2 epochs: 2 insertions, rate 1/5); Poisson: the
    sampler's rate on 21 rows, 1/5, and counts that vary between runs."""
    X, y = _data()
    for fn, want in ((cases.shuffled, [2] * 6), (cases.correct, None)):
        loop = OpacusLoop(fn)
        spec = loop.claim(X, y, [0], {"delta": cases.DELTA})["spec"]
        given = _canaries(X, spec, True, 6)
        loop(X, y, list(range(6)), spec, canaries=given)
        ins = given.insertions[0]
        counts = ins.counts[:, 0].tolist()
        assert ins.rate == pytest.approx(1 / 5) and ins.steps == 10
        if want is not None:
            assert counts == want
        else:
            assert len(set(counts)) > 1 and all(0 <= k <= 10 for k in counts)


def test_worst_case_init_is_loaded_where_opacus_wraps_the_module():
    """lr 0: the model returned is the init, whatever the user's nn.Linear drew."""
    X, y = _data()
    model = dpsgd.ModelSpec("lr", X.shape[1], 32, 2)
    gen = torch.Generator().manual_seed(5)
    init = dpsgd.Params([torch.randn(1, X.shape[1], 2, generator=gen)],
                        [torch.randn(1, 2, generator=gen)])
    predict = OpacusLoop(cases.frozen)(X, y, [1, 2], {}, init=init)
    want = dpsgd.logits(init, X[:4], model)[0]
    got = predict(X[:4])
    assert got.shape == (2, 4, 2)
    assert torch.allclose(got[0], want, atol=1e-6) and torch.allclose(got[1], want, atol=1e-6)
    free = OpacusLoop(cases.frozen)(X, y, [1], {})(X[:4])[0]
    assert not torch.allclose(free, want, atol=1e-3)


@pytest.mark.parametrize("fn, tight, message", [
    (cases.no_step, False, "train took no DPOptimizer step"),
    (cases.zero_eps, False, "reported_eps=0.0: must be a finite number > 0"),
    (cases.deep, True, "mode 'worst-case-init': the Opacus adapter loads dpaudit's "
                       "parameters into"),
])
def test_refusals(fn, tight, message):
    X, y = _data()
    init = dpsgd.Params([torch.zeros(1, X.shape[1], 2)], [torch.zeros(1, 2)]) if tight else None
    with pytest.raises(ValueError, match=message):
        OpacusLoop(fn)(X, y, [0], {}, init=init)


def test_the_worker_process_path_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    code, out = _audit(tmp_path, monkeypatch, "exits", "--seed-check", "0")
    err = [ln for ln in capsys.readouterr().err.splitlines() if "WARNING" not in ln]
    assert code == 2 and err == [
        "dpaudit audit-impl: config error: --train opacus_loop_cases:exits: train(X, y, "
        "seed) of the claim's runs on n and n + 1 rows ended its process with exit status 3 "
        "(e.g. os._exit(3)); a training function must return; no result written"], err
    assert not out.exists()


@pytest.mark.parametrize("flags, line", [
    (["--train", "fixed"], "--eps (claimed epsilon): required (optional only with "
                           "--opacus-loop"),
    (["--train", "fixed", "--opacus-loop"], "--train fixed --opacus-loop: a registry subject"),
    (["--train", "opacus_loop_cases:correct", "--opacus-loop", "--spec", '{"clip": 1}'],
     '--spec {"clip": 1}: not with --opacus-loop'),
])
def test_bad_flags_are_refused_before_training(flags, line, tmp_path, capsys):
    assert main(["audit-impl", "--delta", "1e-5", "--runs", "100", "--seed", "0", "--out",
                 str(tmp_path / "a.csv"), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and line in err[0], err
