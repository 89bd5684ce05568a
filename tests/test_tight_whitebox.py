"""The white-box multi-run audit (Nasr et al. 2023): soundness against the accountant, the
Gaussian mechanism in closed form, determinism."""

import math

import numpy as np
import pytest
from scipy import stats

from dpaudit import accounting, dpsgd
from dpaudit.experiments.tight import whitebox
from dpaudit.trials import Execution

ALPHA, DELTA = 0.05, 1e-5


def _data(n, d=8, quiet=4, seed=0):
    """Two Gaussian classes whose last ``quiet`` features are 0 on every example: the
    canary sits on one of them, so no data gradient moves its coordinate and the audit is
    of the subsampled Gaussian mechanism the accountant analyses."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    X = (rng.normal(size=(n, d)) * 0.3 + y[:, None] * 0.5).astype(np.float32)
    X[:, d - quiet:] = 0
    return X, y


NOISES = (0.5, 1.0, 2.0)


@pytest.fixture(scope="module")
def subsampled():
    """q = 0.1, T = 10 steps, 500 runs per side at each noise multiplier."""
    X, y = _data(100)
    model = dpsgd.ModelSpec("lr", X.shape[1])
    out = {}
    for sigma in NOISES:
        cfg = dpsgd.DPSGDConfig(1, 10, 0.5, 1.0, sigma, "poisson")
        out[sigma] = whitebox.audit(X, y, model, cfg, 500, 1, ALPHA, DELTA,
                                    execution=Execution("cpu", 1000))
    return out


def test_certified_bound_never_exceeds_the_add_remove_eps(subsampled):
    # The add/remove eps of the accountant (one noise level: the PLD accountant is slow).
    rows = subsampled[2.0]
    assert rows[0]["eps_th"] == accounting.epsilon(2.0, 0.1, 10, DELTA, "pld")
    assert rows[0]["eps_rdp"] == accounting.epsilon(2.0, 0.1, 10, DELTA, "rdp_classic")
    for sigma, rows in subsampled.items():
        assert [r["method"] for r in rows] == ["whitebox-llr", "whitebox-dot-sum"]
        for r in rows:
            assert (r["relation"], r["q"], r["steps"], r["runs"]) == ("add/remove", 0.1, 10, 500)
            assert r["eps_th"] == rows[0]["eps_th"] <= r["eps_rdp"]
            assert r["certified"] is True and r["n_eval_pos"] == r["n_eval_neg"] == 250
            assert 0 <= r["eps_lb"] <= r["eps_th"], (sigma, r["method"], r["eps_lb"])
            assert r["eps_lb_ratio"] == pytest.approx(r["eps_lb"] / r["eps_th"])


def test_the_audit_has_power(subsampled):
    """At low noise the likelihood-ratio audit certifies a clear bound, above what 4x the
    noise would allow (an implementation adding a quarter of its claimed noise is caught),
    and at least the paper's summed dot products do."""
    llr, dot = subsampled[0.5]
    assert llr["eps_lb"] > subsampled[2.0][0]["eps_th"]
    assert llr["eps_lb"] >= 0.1 * llr["eps_th"]
    assert llr["eps_lb"] >= dot["eps_lb"] and llr["auc"] > dot["auc"]
    # More noise, less leakage: the bounds fall with the noise.
    assert [subsampled[s][0]["eps_lb"] for s in NOISES] == \
        sorted((subsampled[s][0]["eps_lb"] for s in NOISES), reverse=True)


def test_one_full_batch_step_is_the_gaussian_mechanism():
    """T = 1, q = 1: z = <update, g> / (lr / B noise C) is N(mu, 1) with the canary and
    N(0, 1) without, mu = 1 / sigma, so the log likelihood ratio mu z - mu^2 / 2 is
    N(mu^2 / 2, mu^2) on D1 and N(-mu^2 / 2, mu^2) on D0."""
    X, y = _data(40)
    sigma = 1.25
    mu = 1 / sigma
    cfg = dpsgd.DPSGDConfig(1, 40, 0.5, 1.0, sigma, "poisson")
    s = whitebox.whitebox_scores(X, y, dpsgd.ModelSpec("fnn", X.shape[1], 4), cfg, 1000, 2,
                                 execution=Execution("cpu", 2000))
    pos, neg = s["in"]["llr"], s["out"]["llr"]
    assert stats.kstest(pos, stats.norm(mu ** 2 / 2, mu).cdf).pvalue > 0.01
    assert stats.kstest(neg, stats.norm(-mu ** 2 / 2, mu).cdf).pvalue > 0.01
    # The KS test tells the claimed shift from a 25% smaller one.
    wrong = 0.75 * mu
    assert stats.kstest(pos, stats.norm(wrong ** 2 / 2, wrong).cdf).pvalue < 1e-3
    # At q = 1 the paper's summed dot product is the same test: lr / B C (C z sigma).
    for side in ("in", "out"):
        z = s[side]["dot_sum"] / (0.5 / 40 * sigma)
        np.testing.assert_allclose(s[side]["llr"], mu * z - mu ** 2 / 2, atol=1e-6)


def test_same_seed_same_rows():
    X, y = _data(60)
    model = dpsgd.ModelSpec("fnn", X.shape[1], 4)
    cfg = dpsgd.DPSGDConfig(2, 10, 0.5, 1.0, 2.0, "poisson")
    a = whitebox.audit(X, y, model, cfg, 12, 7, ALPHA, DELTA, execution=Execution("cpu", 24))
    b = whitebox.audit(X, y, model, cfg, 12, 7, ALPHA, DELTA, execution=Execution("cpu", 24))
    assert a == b
    # A run's models depend on its seed alone (to float rounding across call widths), and
    # more runs extend each side; another seed, other runs.
    s12 = whitebox.whitebox_scores(X, y, model, cfg, 12, 7, execution=Execution("cpu", 5))
    s16 = whitebox.whitebox_scores(X, y, model, cfg, 16, 7, execution=Execution("cpu", 32))
    other = whitebox.whitebox_scores(X, y, model, cfg, 12, 8, execution=Execution("cpu", 24))
    for side in ("in", "out"):
        for score in ("llr", "dot_sum"):
            np.testing.assert_allclose(s12[side][score], s16[side][score][:12], rtol=1e-9,
                                       atol=1e-12)
        assert not np.allclose(other[side]["llr"], s12[side]["llr"])
    pos = [r["auc"] for r in a]
    assert pos[0] == whitebox.audit_scores(s12["in"]["llr"], s12["out"]["llr"], ALPHA,
                                           DELTA)["auc"]


def test_kept_runs_resume_an_interrupted_audit_and_a_damaged_block_is_retrained(
        tmp_path, monkeypatch, capsys):
    X, y = _data(60)
    model = dpsgd.ModelSpec("fnn", X.shape[1], 4)
    cfg = dpsgd.DPSGDConfig(2, 10, 0.5, 1.0, 2.0, "poisson")
    args = (X, y, model, cfg, 12, 7, ALPHA, DELTA)
    fresh = whitebox.audit(*args, execution=Execution("cpu", 8))
    real, calls = dpsgd.train, []

    def counted(*a, fail_at=None, **k):
        calls.append(len(a[4]))
        if len(calls) == fail_at:
            raise KeyboardInterrupt  # the job is stopped during its third call
        return real(*a, **k)

    def audit(fail_at=None):
        calls.clear()
        monkeypatch.setattr(dpsgd, "train",
                            lambda *a, **k: counted(*a, fail_at=fail_at, **k))
        return whitebox.audit(*args, execution=Execution("cpu", 8, print, tmp_path))

    with pytest.raises(KeyboardInterrupt):
        audit(fail_at=3)
    assert audit() == fresh and calls == [8]  # the two kept calls restored, bit for bit
    assert "16 models restored, 8 to train" in capsys.readouterr().out
    assert audit() == fresh and calls == []
    block = sorted(tmp_path.glob("*.csv"))[1]
    text = block.read_text()
    last = max(i for i, c in enumerate(text) if c in "0123456789")
    block.write_text(text[:last] + str((int(text[last]) + 1) % 10) + text[last + 1:])
    assert audit() == fresh and calls == [8]
    assert f"kept block {block}: its rows do not match the content hash" in \
        capsys.readouterr().err
    # Another noise, another trainer: nothing kept under another key is reused.
    other = dpsgd.DPSGDConfig(2, 10, 0.5, 1.0, 3.0, "poisson")
    monkeypatch.setattr(whitebox, "trainer_digest", lambda: "edited trainer")
    assert audit() == fresh and calls == [8, 8, 8]
    key = whitebox.store_key(X, y, model, cfg, 7, device="cpu")
    assert key["dpsgd"]["noise_multiplier"] == 2.0
    assert whitebox.store_key(X, y, model, other, 7, device="cpu") != key


def test_without_noise_only_the_dot_sum_row():
    X, y = _data(40)
    # 12 steps at q = 0.25: an "in" run's canary is sampled at least once w.p. 0.97
    cfg = dpsgd.DPSGDConfig(3, 10, 0.5, 1.0, 0.0, "poisson")
    rows = whitebox.audit(X, y, dpsgd.ModelSpec("lr", X.shape[1]), cfg, 20, 0, ALPHA, DELTA,
                          execution=Execution("cpu"))
    assert [r["method"] for r in rows] == ["whitebox-dot-sum"]
    assert rows[0]["eps_th"] == math.inf and rows[0]["eps_lb_ratio"] == 0.0
    assert rows[0]["eps_lb"] > 0  # the canary's coordinate moves only when it is sampled


@pytest.mark.parametrize("kw, match", [
    ({"runs": 1}, "runs=1"), ({"runs": 2.5}, "runs=2.5"), ({"per_call": 0}, "per_call=0"),
    ({"alpha": 0.0}, "alpha=0.0"), ({"delta": 1.0}, "delta=1.0"),
    ({"select_frac": 1}, "select_frac=1")])
def test_bad_arguments_are_named(kw, match):
    X, y = _data(20)
    args = {"runs": 4, "alpha": ALPHA, "delta": DELTA, "per_call": None, **kw}
    runs, alpha, delta = args.pop("runs"), args.pop("alpha"), args.pop("delta")
    execution = Execution("cpu", args.pop("per_call"))
    with pytest.raises(ValueError, match=match):
        whitebox.audit(X, y, dpsgd.ModelSpec("lr", X.shape[1]),
                       dpsgd.DPSGDConfig(1, 10, 0.5, 1.0, 1.0, "poisson"), runs, 0, alpha,
                       delta, execution=execution, **args)


def _cli(argv):
    """``dpaudit`` with this subcommand registered (the lead wires it into the CLI)."""
    import argparse

    from dpaudit.cli import tight

    parser = argparse.ArgumentParser()
    tight.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    args.func(args)


SPEC = {"runs": 6, "archs": ["lr"], "eps": ["2"], "alpha": ALPHA, "delta": DELTA,
        "select_frac": 0.5}
TRAIN = {"epochs": 1, "batch_size": 10, "lr": 0.5, "hidden": 4, "noise": {"2": 2.0},
         "clip": 1.0}


@pytest.fixture
def task_file(tmp_path):
    from dpaudit import features
    from dpaudit.experiments.jagielski import make_task

    X, y = _data(40)
    task = make_task(X, y, X[:8], y[:8], X[:4], np.ones(4, np.int64), X[:2],
                     np.ones(2, np.int64), clipbkd_norm=5.0)
    path = tmp_path / "task.npz"
    features.save_features(path, task.arrays(), {"command": "test"})
    return path


def test_cli_writes_one_row_per_method(tmp_path, task_file, capsys):
    import json

    from dpaudit.io import read_table

    out = tmp_path / "tight.csv"
    _cli(["tight-whitebox-audit", "--task", str(task_file), "--spec", json.dumps(SPEC),
          "--train", json.dumps(TRAIN), "--seed", "3", "--device", "cpu", "--out", str(out)])
    df, meta = read_table(out)
    assert meta["spec"] == SPEC and meta["seed"] == 3
    assert list(df.method) == ["whitebox-llr", "whitebox-dot-sum"]
    assert (df.eps_label == 2).all() and (df.relation == "add/remove").all()
    assert (df.eps_lb <= df.eps_th).all() and (df.runs == 6).all()
    # Progress during the cell's training, in models of both sides (12 here).
    assert "dpaudit tight-whitebox-audit: lr eps 2: side in/out: 12/12 models, " \
        in capsys.readouterr().err


@pytest.mark.parametrize("spec, train, match", [
    ({"bogus": 1}, {}, r"tight.bogus: unknown key"), ({"eps": ["3"]}, {}, r"tight.eps: \['3'\]"),
    ({"archs": ["cnn"]}, {}, r"tight.archs\[0\]='cnn'"), ({"runs": 1}, {}, "runs=1"),
    ({}, {"lr": None, "hidden": None}, None)])
def test_cli_bad_spec_names_the_key(tmp_path, task_file, spec, train, match):
    import json

    from dpaudit.config import SpecError

    train = {k: v for k, v in {**TRAIN, **train}.items() if v is not None}
    out = tmp_path / "x.csv"
    with pytest.raises(SpecError, match=match or r"--train.(lr|hidden) is missing"):
        _cli(["tight-whitebox-audit", "--task", str(task_file), "--spec",
              json.dumps({**SPEC, **spec}), "--train", json.dumps(train), "--seed", "0",
              "--device", "cpu", "--out", str(out)])
    assert not out.exists()
