"""The shuffling gap audited: crafted batch mates in the trainer (what they add, and the
likelihood ratio of Chua et al.'s pair that the white box then computes), the certified
violation of shuffled DP-SGD's Poisson claim and the Poisson control's soundness on the real
trainer, and ``shuffle-audit`` / ``shuffle-plot``."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch
from scipy import stats
from scipy.special import logsumexp

from dpaudit import dpsgd
from dpaudit.cli import main
from dpaudit.cli.shuffle import TABLE_COLUMNS
from dpaudit.dpsgd import philox, sampling
from dpaudit.experiments import shuffle
from dpaudit.io import read_table

N_FEATURES = 6


def _data(n: int, seed: int = 0):
    """n rows whose feature 0 is zero everywhere: the canary's weight W[0, 0] gets no data
    gradient, so the white box sees only the canary, its batch mates and the noise."""
    rng = np.random.default_rng(seed)
    X = torch.tensor(rng.random((n, N_FEATURES)), dtype=torch.float32)
    X[:, 0] = 0
    return X, torch.tensor(rng.integers(0, 2, n))


def _train(sampling_, n, B, E, sigma, K, mates, seed0=100):
    X, y = _data(n)
    model = dpsgd.ModelSpec("lr", N_FEATURES, 2)
    cfg = dpsgd.DPSGDConfig(E, B, 0.1, 1.0, sigma, sampling_)
    direction = torch.zeros(1, model.n_params)
    direction[0, 0] = 1.0  # W[0, 0], the first coordinate of the flat layout
    included = torch.tensor([k % 2 == 0 for k in range(K)]).view(-1, 1)
    canaries = dpsgd.GradientCanaries(direction, included, mates=mates)
    seeds = list(range(seed0, seed0 + K))
    return (dpsgd.train(X, y, model, cfg, seeds, canaries=canaries, device="cpu"),
            canaries, cfg, seeds)


@pytest.mark.parametrize("how", ["shuffle", "shuffle-once", "poisson"])
@pytest.mark.parametrize("mates", [-1.0, 0.5])
def test_mates_add_what_the_batches_hold(how, mates):
    """Without noise the canary's summed score is exactly lr / B * C^2 * (insertions + mates
    x the mates its batches held): under shuffling every row of every batch but the
    canary's slot (n - 1 per epoch), under Poisson sampling the batches' own sizes (counted
    here from the trainer's batch stream)."""
    n, B, E, K = 40, 4, 2, 6
    run, canaries, cfg, seeds = _train(how, n, B, E, 0.0, K, mates)
    counts = canaries.insertions[-1].counts[:, 0].double()
    assert counts[1::2].sum() == 0  # never into the runs without it
    if how != "poisson":
        assert counts[0::2].tolist() == [E] * (K // 2)  # once an epoch
    if how == "poisson":
        batches = sampling.Batches(cfg, n, philox.keys(seeds, "cpu"), False, torch.float32)
        held = sum(sampling.batch_sizes(*batches.step(t), n, K, "cpu")
                   for t in range(cfg.steps(n))).double()
    else:
        held = torch.full((K,), float(E * (n - 1)), dtype=torch.float64)
    expect = 0.1 / B * (counts + mates * held)
    np.testing.assert_allclose(run.scores[:, 0].numpy(), expect.numpy(), rtol=1e-5, atol=1e-6)


def _chua_pair_llr(N, S, E, sigma, inside, once, rng):
    """Chua et al.'s pair simulated directly: per epoch S noisy batch sums shifted by B,
    2 at the canary's step (1 for its empty slot), 0 elsewhere; the exact log likelihood
    ratio of the two mixtures (one slot for all epochs when ``once``)."""
    per_slot = np.zeros((2, N, S))
    total = np.zeros(N)
    for e in range(E):
        w = rng.standard_normal((N, S)) * sigma
        if e == 0 or not once:
            slot = rng.integers(0, S, N)
        w[np.arange(N), slot] += 2.0 if inside else 1.0
        a_in, a_out = (4 * w - 4) / (2 * sigma ** 2), (2 * w - 1) / (2 * sigma ** 2)
        if once:
            per_slot += np.stack([a_in, a_out])
        else:
            total += logsumexp(a_in, 1) - logsumexp(a_out, 1)
    if once:
        total = logsumexp(per_slot[0], 1) - logsumexp(per_slot[1], 1)
    return total


@pytest.mark.parametrize("how", ["shuffle", "shuffle-once"])
def test_mates_llr_is_the_likelihood_ratio_of_chuas_pair(how):
    """With batch mates -1 the trainer's all-iterates score is the log likelihood ratio of
    Chua et al.'s pair: its runs are distributed as that ratio simulated directly (two-sample
    KS on each side), and it is a likelihood ratio (E_Q[LR] = E_P[1 / LR] = 1)."""
    n, B, E, sigma, K = 40, 4, 2, 1.0, 3000
    run, *_ = _train(how, n, B, E, sigma, K, -1.0)
    llr = run.llr[:, 0].numpy()
    pos, neg = llr[0::2], llr[1::2]
    rng = np.random.default_rng(5)
    once = how == "shuffle-once"
    for got, inside in ((pos, True), (neg, False)):
        ref = _chua_pair_llr(K // 2, n // B, E, sigma, inside, once, rng)
        assert stats.ks_2samp(got, ref).pvalue > 1e-3
    assert np.exp(neg).mean() == pytest.approx(1, abs=0.12)
    assert np.exp(-pos).mean() == pytest.approx(1, abs=0.12)


def test_mates_are_checked():
    d, inc = torch.zeros(1, 3), torch.ones(1, 1, dtype=torch.bool)
    d[0, 0] = 1.0
    for bad in (-1.5, 2, math.nan, True, "1"):
        with pytest.raises(ValueError, match=r"canaries.mates=.*must be a number in \[-1, 1\]"):
            dpsgd.GradientCanaries(d, inc, mates=bad)


def test_shuffle_violation_certified_and_the_control_sound():
    """The result that matters, on the real trainer at a setting cheap enough for CI (6
    features, B = 1, 100 steps of one epoch, claim eps 2 by Poisson PLD accounting, 8,000
    runs per side): with crafted batch mates shuffled DP-SGD is certified above its claim
    (Chua et al.'s lower bound there is 6.2), while correct Poisson DP-SGD trained at the
    same noise is certified at most its claim, with mates or without."""
    X, y = _data(100)
    setting = shuffle.Setting("lr", 1, 100, 1, 2.0)
    lines = shuffle.theory(setting, 1e-5)
    assert lines["claimed_eps"] == pytest.approx(2.0, abs=1e-3)
    assert lines["shuffle"][0] == pytest.approx(6.24, abs=0.05)
    rows = {}
    for subject, mates in (("shuffle", -1.0), ("fixed", -1.0), ("fixed", 0.0)):
        got = shuffle.audit(X.numpy(), y.numpy(), setting, subject, mates, 8000, 7,
                            shuffle.Job(0.05, 1e-5, device="cpu", per_call=16000), lines)
        rows[subject, mates] = {r["method"]: r for r in got}
    violation = rows["shuffle", -1.0]["whitebox-llr"]
    assert violation["certified"] and violation["violation"]
    assert 2.0 < violation["eps_lb"] <= lines["shuffle"][1]  # never above no amplification
    for key in (("fixed", -1.0), ("fixed", 0.0)):
        for row in rows[key].values():
            assert row["eps_lb"] <= row["claimed_eps"] and not row["violation"]
            assert row["relation"] == "zero-out" and row["accounting"] == "poisson-pld"


def _task(path):
    from dpaudit import features
    from dpaudit.experiments.jagielski import make_task

    X, y = _data(60, seed=1)
    X, y = X.numpy(), y.numpy()
    task = make_task(X, y, X[:8], y[:8], X[:4], np.ones(4, np.int64), X[:2],
                     np.ones(2, np.int64), clipbkd_norm=5.0)
    features.save_features(path, task.arrays(), {"command": "test"})
    return path


SPEC = {"settings": [{"arch": "lr", "batch_size": 5, "steps_per_epoch": 4, "epochs": 2,
                      "eps": 4},
                     {"arch": "fnn", "batch_size": 4, "steps_per_epoch": 5, "epochs": 1,
                      "eps": 4, "runs": 6}],
        "subjects": ["fixed", "shuffle", "shuffle-once"], "mates": [-1, 0], "runs": 8,
        "hidden": 4, "lr": 0.1, "clip": 1.0, "alpha": 0.05, "delta": 1e-5,
        "select_frac": 0.5}


def test_shuffle_audit_writes_its_table_and_figure(tmp_path):
    task = _task(tmp_path / "task.npz")
    out = tmp_path / "shuffle_audit.csv"
    assert main(["shuffle-audit", "--task", str(task), "--spec", json.dumps(SPEC), "--seed",
                 "3", "--device", "cpu", "--out", str(out),
                 "--store", str(tmp_path / "kept")]) == 0
    df, prov = read_table(out)
    assert tuple(df.columns) == TABLE_COLUMNS
    assert prov["command"] == "shuffle-audit" and prov["seed"] == 3
    # subjects x mates x methods; at one epoch shuffle-once is shuffle, not trained again
    lr, fnn = df[df.arch == "lr"], df[df.arch == "fnn"]
    assert len(lr) == 3 * 2 * 2 and len(fnn) == 2 * 2 * 2
    assert set(lr.subject) == {"fixed", "shuffle", "shuffle-once"}
    assert (lr.runs == 8).all() and (fnn.runs == 6).all() and (fnn.hidden == 4).all()
    assert lr.noise.nunique() == 1  # every subject at the claim's noise
    df = lr
    fixed = df[df.subject == "fixed"]
    assert fixed.shuffle_lb.isna().all() and (fixed.eps_upper == fixed.claimed_eps).all()
    dyn = df[df.subject == "shuffle"].shuffle_lb.iloc[0]
    per = df[df.subject == "shuffle-once"].shuffle_lb.iloc[0]
    assert df.claimed_eps.iloc[0] == pytest.approx(4, abs=1e-3) and dyn <= per
    assert main(["shuffle-plot", "--table", str(out), "--out",
                 str(tmp_path / "shuffle.pdf")]) == 0
    assert (tmp_path / "shuffle.png").stat().st_size > 0


@pytest.mark.parametrize("change, message", [
    ({"subjects": ["shuffle", "bogus"]}, r"shuffle.subjects\[1\]='bogus': 'bogus' is not one "
                                         r"of \['fixed', 'shuffle', 'shuffle-once'\]"),
    ({"mates": [-2]}, r"shuffle.mates\[0\]=-2: -2 is less than the minimum of -1"),
    ({"settings": [{"arch": "cnn", "batch_size": 5, "steps_per_epoch": 4, "epochs": 1,
                    "eps": 2}]}, r"shuffle.settings\[0\].arch='cnn': 'cnn' is not one of"),
    ({"settings": [{"arch": "lr", "batch_size": 5, "steps_per_epoch": 4, "epochs": 1}]},
     r"shuffle.settings\[0\].eps is missing"),
    ({"settings": [{"arch": "lr", "batch_size": 50, "steps_per_epoch": 4, "epochs": 1,
                    "eps": 2}]}, r"at most the task's 60 training rows; lr B=50 S=4"),
    ({"subjects": ["shuffle-once"], "settings": [
        {"arch": "lr", "batch_size": 5, "steps_per_epoch": 4, "epochs": 1, "eps": 2}]},
     r"shuffle.subjects: \[shuffle-once\] alone must come with a setting of epochs > 1"),
])
def test_shuffle_audit_names_a_bad_spec(tmp_path, capsys, change, message):
    task = _task(tmp_path / "task.npz")
    out = tmp_path / "t.csv"
    assert main(["shuffle-audit", "--task", str(task), "--spec", json.dumps({**SPEC, **change}),
                 "--seed", "0", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(message, err[0]), err
    assert not out.exists()


def test_the_reference_table_is_the_full_config_and_draws_without_training(tmp_path):
    """reference/shuffle_audit.csv: the full config's `shuffle` section (every setting,
    subject, batch mates and method, the spec rule shuffle_audit passes) measured on 2 CPU
    cores; `shuffle_reference` draws it, training nothing. The Poisson control is never
    certified above its claim nor any subject above what is known of its epsilon, the
    shuffled subject with crafted batch mates is certified above its claim, and every
    number of docs/shuffle.md's table of it is the kept table's."""
    from pathlib import Path

    import yaml
    from test_workflow import snakemake

    from dpaudit.cli.shuffle import SPEC_KEYS

    root = Path(__file__).parents[1]
    config = yaml.safe_load((root / "config/config.yaml").read_text())["shuffle"]
    df, meta = read_table(root / "reference/shuffle_audit.csv")
    assert meta["spec"] == {k: config[k] for k in SPEC_KEYS} and meta["seed"] == 0
    assert tuple(df.columns) == TABLE_COLUMNS
    expect = 0
    for s in config["settings"]:
        at = df[(df.batch_size == s["batch_size"]) & (df.epochs == s["epochs"])
                & (df.steps_per_epoch == s["steps_per_epoch"])]
        subjects = [x for x in config["subjects"] if x != "shuffle-once" or s["epochs"] > 1]
        assert set(at.subject) == set(subjects) and set(at.mates) == set(config["mates"])
        assert (at.runs == s.get("runs", config["runs"])).all()
        expect += len(subjects) * len(config["mates"]) * 2
    assert len(df) == expect
    assert df.certified.all() and (df.eps_lb <= df.eps_upper).all()
    fixed = df[df.subject == "fixed"]
    assert (fixed.eps_lb <= fixed.claimed_eps).all() and not fixed.violation.any()
    caught = df[df.violation]
    assert len(caught) and set(caught.subject) <= {"shuffle", "shuffle-once"}
    assert set(caught.mates) == {-1.0} and (caught.eps_lb > caught.claimed_eps).all()
    out = snakemake("-n", "--directory", str(tmp_path), "shuffle_reference")
    assert out.returncode == 0, out.stderr
    assert set(re.findall(r"^(?:local)?rule (\w+):", out.stdout, re.M)) == {
        "shuffle_reference_plot", "shuffle_reference"}
    assert main(["shuffle-plot", "--table", str(root / "reference/shuffle_audit.csv"),
                 "--out", str(tmp_path / "shuffle_audit.pdf")]) == 0
    text = (root / "docs/shuffle.md").read_text().split("### The full config's table")[1]
    rows = [line for line in text.split("\n## ")[0].splitlines() if line.startswith("| B ")]
    assert rows == docs_rows(df)


def docs_rows(df) -> list[str]:
    """docs/shuffle.md's table of a shuffle-audit table: one line per all-iterates row."""
    lines = []
    for r in df[df.method == "whitebox-llr"].itertuples():
        lb = "-" if r.subject == "fixed" else f"{r.shuffle_lb:.2f}"
        lines.append(f"| B {r.batch_size}, S {r.steps_per_epoch}, E {r.epochs} | `{r.subject}` "
                     f"| {r.mates:g} | {r.runs} | {r.claimed_eps:.2f} | {lb} | "
                     f"{r.eps_upper:.2f} | {'**' if r.violation else ''}{r.eps_lb:.2f}"
                     f"{'**' if r.violation else ''} | {r.eps_lb_gdp:.2f} |")
    return lines
