"""One-run audits of DP-SGD: canaries, the grid, the CLI and the figure."""

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from dpaudit import accounting, dpsgd
from dpaudit.cli import main
from dpaudit.experiments import onerun
from dpaudit.experiments.jagielski import make_task
from dpaudit.io import read_table, write_table

NOISE = {"4": 1.55, "inf": 0.0}


def _task(n=300, d=40, quiet=20, seed=0):
    """Two Gaussian classes in d dimensions whose last ``quiet`` features are always 0."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    X = (rng.normal(size=(n, d)) * 0.3 + y[:, None] * 0.5).astype(np.float32)
    X[:, d - quiet:] = 0
    X_test = X[:100] + 0.01
    return make_task(X, y, X_test, y[:100], X[:16], np.ones(16, np.int64), X[:4],
                     np.ones(4, np.int64), clipbkd_norm=5.0)


def _spec(**kw):
    spec = {"m": 20, "repeats": 2, "archs": ["lr"], "eps": ["inf"], "canaries": ["dirac"],
            "input_kind": "mislabelled", "init": 1.0, "max_k": 500, "beta": 0.05,
            "delta": 1e-5}
    return {**spec, **kw}


TRAIN = {"epochs": 4, "batch_size": 50, "lr": 0.5, "hidden": 8, "noise": NOISE, "clip": 1.0}

def test_input_canaries_of_both_kinds():
    task = _task()
    rng = np.random.default_rng(1)
    X, y = onerun.input_canaries(task, 30, "mislabelled", rng)
    rows = [np.flatnonzero((task.X_test == x).all(1))[0] for x in X]
    assert len(set(rows)) == 30 and np.array_equal(y, 1 - task.y_test[rows])
    X, y = onerun.input_canaries(task, 5, "pca", rng)
    np.testing.assert_allclose(np.linalg.norm(X, axis=1), np.linalg.norm(task.x_p), rtol=1e-5)
    np.testing.assert_allclose(X @ X.T / np.linalg.norm(task.x_p) ** 2, np.eye(5), atol=1e-5)
    # the least-variance directions: the data's spread along them is the smallest
    spread = (task.X - task.X.mean(0)) @ X.T
    assert spread.std(0).max() <= (task.X - task.X.mean(0)).std(0).max()
    with pytest.raises(ValueError, match="m=101"):
        onerun.input_canaries(task, 101, "mislabelled", rng)
    with pytest.raises(ValueError, match="kind="):
        onerun.input_canaries(task, 5, "other", rng)


def test_input_count_is_as_many_as_the_kind_allows():
    task = _task()
    assert onerun.input_count(task, 1000, "pca") == 40  # one per dimension
    assert onerun.input_count(task, 1000, "mislabelled") == 100  # one per held-out image
    assert onerun.input_count(task, 30, "pca") == 30


def test_quiet_coordinates_are_the_least_used_features():
    task = _task()
    model = dpsgd.ModelSpec("fnn", 40, 8)
    coords = onerun.quiet_coordinates(task.X, model, 20)
    rows = np.unique(coords // 8)
    assert len(coords) == 24 and set(rows) <= set(range(20, 40))  # the all-zero features


def test_white_box_canaries_without_noise_certify_a_clear_bound():
    """No noise and canaries on features no example uses: every sampled canary moves its
    coordinate and nothing else does, so every guess is right."""
    task = _task()
    model = dpsgd.ModelSpec("lr", 40)
    cfg = dpsgd.DPSGDConfig(8, 50, 0.5, 1.0, 0.0)
    rows = onerun.audit_dirac(task, model, cfg, 20, [11, 12], 1e-5, 0.05, 500, device="cpu")
    assert {r["threat_model"] for r in rows} == {"all-iterates", "last-iterate"}
    for r in rows:
        assert r["v"] == r["r"] >= 12  # every guess right, as many as the split allows
        # a perfect attack on r guesses at level beta / G: logit(level^(1/r)); G = 7 counts
        # tested, k = 4..10 (K = m/2 = 10; 2k all-right guesses reject eps = 0 at 0.05 / 10
        # from k = 4 on, 4^-4 < 0.005 < 4^-3)
        level = 0.05 / 7
        perfect = math.log((level ** (1 / r["r"])) / (1 - level ** (1 / r["r"])))
        assert r["eps_lb_pure"] == pytest.approx(perfect, rel=1e-9) and perfect > 0.5
        assert r["eps_lb_fdp"] >= r["eps_lb"] > 0.5


def test_cli_audit_table_and_figure(tmp_path, capsys):
    task = _task()
    path = tmp_path / "task.npz"
    from dpaudit import features
    features.save_features(path, task.arrays(), {"command": "test"})
    out = tmp_path / "onerun.csv"
    spec = _spec(canaries=["input", "dirac"], eps=["4", "inf"], m=20)
    assert main(["onerun-audit", "--task", str(path), "--spec", json.dumps(spec), "--train",
                 json.dumps(TRAIN), "--seed", "3", "--device", "cpu", "--out", str(out)]) == 0
    df, meta = read_table(out)
    assert meta["seed"] == 3 and meta["spec"] == spec
    assert len(df) == 2 * 2 * (1 + 2)  # eps x repeats x (black-box + 2 white-box)
    for col in ("eps_th", "eps_pld", "eps_lb", "eps_lb_fdp", "mu_lb", "eps_gdp", "m", "r", "v",
                "best_k", "models_trained", "n", "sample_rate", "steps"):
        assert col in df.columns, col
    # the accountant sees the trained set: n rows plus the included input canaries
    inp, dirac = df[df.canary == "input"], df[df.canary == "dirac"]
    assert inp.n.nunique() == 1 and 300 < inp.n.iloc[0] < 320 and (dirac.n == 300).all()
    np.testing.assert_allclose(df.sample_rate, 50 / df.n)
    cfg = dpsgd.DPSGDConfig(4, 50, 0.5, 1.0, 1.55, "poisson")
    row = dirac[dirac.eps_label == 4].iloc[0]
    assert row.eps_pld == pytest.approx(accounting.epsilon(1.55, 50 / 300, cfg.steps(300),
                                                           1e-5, "pld"))
    finite = df[np.isfinite(df.eps_th)]
    assert (finite.eps_lb_fdp <= finite.eps_pld).all() and (df.eps_lb >= 0).all()
    assert (df.r == 2 * df.best_k).all()
    fig = tmp_path / "onerun.pdf"
    assert main(["onerun-plot", "--table", str(out), "--out", str(fig)]) == 0
    assert fig.stat().st_size > 1000 and fig.with_suffix(".png").stat().st_size > 1000
    # beside a many-model table of the same cells (the columns jagielski-audit writes)
    many = tmp_path / "fig2.csv"
    write_table(pd.DataFrame({"dataset": "fmnist", "arch": "lr", "attack": "clipbkd",
                              "eps_label": ["4", "inf"], "eps_lb": [0.1, 0.5],
                              "eps_lb_best_k": [0.2, 0.6], "trials": 40}), many, {})
    assert main(["onerun-plot", "--table", str(out), "--many-model", str(many), "--out",
                 str(fig)]) == 0


@pytest.mark.parametrize("change,message", [
    ({"m": 1}, "onerun.m=1"), ({"canaries": ["other"]}, "onerun.canaries[0]='other'"),
    ({"eps": ["3"]}, "onerun.eps: ['3']"), ({"bogus": 1}, "onerun.bogus: unknown key"),
    ({"m": 81}, "onerun.m=81: the lr model has only 80 first-layer weights"),
])
def test_cli_bad_spec_names_the_key(tmp_path, capsys, change, message):
    from dpaudit import features

    features.save_features(tmp_path / "task.npz", _task().arrays(), {"command": "test"})
    out = tmp_path / "x.csv"
    assert main(["onerun-audit", "--task", str(tmp_path / "task.npz"), "--spec",
                 json.dumps(_spec(**change)), "--train", json.dumps(TRAIN), "--seed", "0",
                 "--out", str(out)]) == 2
    assert message in capsys.readouterr().err and not out.exists()


def test_glorot_rows_are_those_computed_before_the_fixed_init_existed():
    """The Glorot path draws the same initialisations, batches and noise as before `init:
    fixed` was added: correct guesses and f-DP bounds of the counter-based generator's
    draws, pinned (the noiseless rows, eps inf, are those of the generator before it)."""
    spec = _spec(canaries=["input", "dirac"], eps=["4", "inf"], archs=["lr", "fnn"], m=20)
    df = onerun.audit_grid(_task(), spec, TRAIN, 3, "cpu")
    assert list(df.v) == [5, 5, 5, 5, 6, 6, 7, 5, 14, 20, 14, 20,
                          2, 3, 2, 3, 11, 7, 6, 5, 18, 14, 18, 14]
    np.testing.assert_allclose(
        df.eps_lb_fdp, [0, 0, 0, 0, 0, 0, 0, 0, 0.859208, 1.271632, 0.859208, 1.271632,
                        0, 0, 0, 0, 0.163034, 0, 0, 0, 1.15191, 0.859208, 1.15191, 0.859208],
        atol=1e-6)


def _save_init(tmp_path, arch, seed, hidden=TRAIN["hidden"]):
    model = dpsgd.ModelSpec(arch, 40, hidden)
    path = tmp_path / f"init_{arch}_{seed}.pt"
    dpsgd.save_params(path, dpsgd.init_params(model, 1, seed, device="cpu"), model)
    return path


def _audit_cli(tmp_path, name, spec, *extra):
    from dpaudit import features

    features.save_features(tmp_path / "task.npz", _task().arrays(), {"command": "test"})
    out = tmp_path / name
    code = main(["onerun-audit", "--task", str(tmp_path / "task.npz"), "--spec", json.dumps(spec),
                 "--train", json.dumps(TRAIN), "--seed", "3", "--device", "cpu", "--out",
                 str(out), *extra])
    return code, out


def test_fixed_init_trains_every_run_from_the_saved_file(tmp_path, monkeypatch):
    spec = _spec(canaries=["input", "dirac"], eps=["4", "inf"], archs=["lr", "fnn"],
                 init="fixed")
    files = [_save_init(tmp_path, "lr", 5), _save_init(tmp_path, "fnn", 5)]
    seen, train = [], dpsgd.train

    def spy(X, y, model, cfg, seeds, init=None, **kw):
        seen.append((model.arch, cfg.init, init))
        return train(X, y, model, cfg, seeds, init=init, **kw)

    monkeypatch.setattr(dpsgd, "train", spy)
    code, out = _audit_cli(tmp_path, "a.csv", spec, "--init-files", *map(str, files))
    assert code == 0 and len(seen) == 2 * 2 * 2  # archs x canary types x eps labels
    for arch, how, init in seen:  # step 0 of every run: the file's weights
        saved, _ = dpsgd.load_params(files[arch == "fnn"])
        assert how == "fixed"
        for got, want in zip([*init.W, *init.b], [*saved.W, *saved.b]):
            assert torch.equal(got, want)
    a, meta = read_table(out)
    assert set(meta["init_sha256"]) == {"lr", "fnn"}
    monkeypatch.setattr(dpsgd, "train", train)
    # reproducible: the same seed and init file give the same table
    code, again = _audit_cli(tmp_path, "b.csv", spec, "--init-files", *map(str, files))
    pd.testing.assert_frame_equal(a, read_table(again)[0])
    # and the init matters: the black-box scores depend on where training started
    other = [_save_init(tmp_path, "lr", 6), _save_init(tmp_path, "fnn", 6)]
    code, c = _audit_cli(tmp_path, "c.csv", spec, "--init-files", *map(str, other))
    glorot = onerun.audit_grid(_task(), {**spec, "init": 1.0}, TRAIN, 3, "cpu")
    inp = a.canary == "input"
    assert not a[inp].v.equals(read_table(c)[0][inp].v)
    assert not a[inp].v.equals(glorot[inp].v)


@pytest.mark.parametrize("init,hiddens,message", [
    ("fixed", [], "onerun.init: fixed needs --init-files"),
    ("fixed", [8, 8], "want one file for each of"),  # two for lr
    ("fixed", [32], "want one file for each of"),  # another hidden width
    (1.0, [8], "--init-files: only used with onerun.init: fixed"),
])
def test_cli_fixed_init_needs_one_matching_file_per_arch(tmp_path, capsys, init, hiddens,
                                                          message):
    paths = [_save_init(tmp_path, "lr", i, hidden) for i, hidden in enumerate(hiddens)]
    extra = ["--init-files", *map(str, paths)] if paths else []
    code, out = _audit_cli(tmp_path, "x.csv", _spec(init=init), *extra)
    assert code == 2 and message in capsys.readouterr().err and not out.exists()
