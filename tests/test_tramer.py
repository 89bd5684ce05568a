"""Canary audits of DP training implementations (Tramer et al. 2022)."""

import math
import textwrap

import dp_accounting
import numpy as np
import pandas as pd
import pytest
import torch
from scipy import special, stats

from dpaudit import canaries, subjects
from dpaudit.experiments import tramer
from dpaudit.cli import main
from dpaudit.io import read_table, write_table

EPS, DELTA, ALPHA = 0.21, 1e-5, 1e-10

# A user's training function, imported by module path like `--train user_mech:train`: one
# full-batch step of softmax regression from zero whose clipped-gradient sum (sensitivity C
# under adding or removing one example) gets Gaussian noise of std sigma * C, with
# sigma = spec["sigma"] -- exactly (eps, delta)-DP when sigma = 1 / mu_claimed(eps, delta)
# (Dong, Roth, Su: the Gaussian mechanism is (1/sigma)-GDP).  "bug": divide the noise by n.
USER_MODULE = textwrap.dedent('''
    import torch

    def train(X, y, seeds, spec):
        n_classes, C = spec["n_classes"], spec["clip"]
        Xt = torch.cat([X, torch.ones(len(X), 1)], 1).double()
        onehot = torch.nn.functional.one_hot(y, n_classes).double()
        g = Xt[:, :, None] * (1.0 / n_classes - onehot)[:, None, :]  # per-example grads at W = 0
        norms = g.flatten(1).norm(dim=1).clamp(min=1e-12)
        total = (g * (C / norms).clamp(max=1.0)[:, None, None]).sum(0)
        std = spec["sigma"] * C / (len(X) if spec.get("bug") else 1)
        W = torch.stack([-(total + std * torch.randn(total.shape, dtype=torch.float64,
                                                       generator=torch.Generator().manual_seed(s)))
                         for s in seeds])
        return lambda x: torch.cat([x, torch.ones(len(x), 1)], 1).double() @ W

    def not_a_function():
        pass
    not_callable = 3
''')


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "user_mech.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "user_mech"


def _image_like(n=400, informative=8, blank=248, seed=0):
    """Two Gaussian classes in the first coordinates, constant-zero "border pixels" after."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 2
    X = torch.randn(n, informative, generator=g) + 1.5 * (2 * y[:, None] - 1) / informative**0.5
    return torch.cat([X, torch.zeros(n, blank)], 1), y


# ---- the worked check of Tramer et al. 2022 (CSCI 699 Week 4 lecture) ---------------

def test_worked_check_inconsistent_with_claim():
    """Claimed (0.21, 1e-5); TPR 4922/1e5 and FPR 174/1e5 at p = 1e-10 (Tramer et al. 2022,
    as worked in the CSCI 699 Week 4 lecture notes)."""
    n = 100_000
    # The lecture's numbers: alpha^+ (FNR upper bound) <= 0.95509 and the FPR bound 0.00274, from
    # one-sided Clopper-Pearson bounds at p/2 each -- scipy's two-sided exact interval at p.
    tpr_lo = stats.binomtest(4922, n).proportion_ci(1 - ALPHA, "exact").low
    fpr_hi = stats.binomtest(174, n).proportion_ci(1 - ALPHA, "exact").high
    assert 0.9550 < 1 - tpr_lo <= 0.95509
    assert round(fpr_hi, 5) == 0.00274
    # Under the claim the FPR must be >= (1 - delta - FNR) / e^eps = 0.0398885... (the lecture)
    # for the observed FNR, far above what the runs allow.
    assert (1 - DELTA - 0.95078) / math.exp(EPS) == pytest.approx(0.03988885074, abs=1e-11)
    assert (1 - DELTA - (1 - tpr_lo)) / math.exp(EPS) > 10 * fpr_hi
    out = tramer.audit_counts(4922, n, 174, n, EPS, DELTA, ALPHA)
    assert out["eps_lb"] == pytest.approx(math.log((tpr_lo - DELTA) / fpr_hi), rel=1e-9)
    assert out["eps_lb"] > 10 * EPS
    assert out["verdict"] == tramer.VIOLATES
    # GDP test: mu_LB = Phi^-1(TPR_lo) - Phi^-1(FPR_hi), far above the claim's mu.
    assert out["mu_lb"] == pytest.approx(special.ndtri(tpr_lo) - special.ndtri(fpr_hi), rel=1e-9)
    assert out["mu_lb"] > 10 * out["mu_claimed"] and out["eps_lb_gdp"] > out["eps_lb"]
    assert round(out["eps_lb"], 3) == 2.795  # the number docs/tramer.md compares ours with


def test_consistent_counts_give_no_violation():
    out = tramer.audit_counts(5000, 100_000, 4990, 100_000, EPS, DELTA, ALPHA)
    assert out["eps_lb"] == 0.0 and out["verdict"] == tramer.NO_VIOLATION


def test_mu_claimed_matches_dp_accounting_gaussian():
    """The Gaussian mechanism with sigma = 1 / mu_claimed is (0.21, 1e-5)-DP, tightly (PLD)."""
    for eps, delta in [(EPS, DELTA), (1.0, 1e-6), (4.0, 1e-3)]:
        sigma = 1 / tramer.mu_claimed(eps, delta)
        acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-5)
        acc.compose(dp_accounting.GaussianDpEvent(sigma))
        assert acc.get_epsilon(delta) == pytest.approx(eps, rel=2e-3)


def test_min_runs_closed_form():
    """A perfect attack on n runs: TPR_lo = (alpha/2)^(1/n), FPR_hi = 1 - TPR_lo."""
    def perfect(n, delta):
        p = (ALPHA / 2) ** (1 / n)
        return math.log((p - delta) / (1 - p))

    n = tramer.min_runs(EPS, DELTA, ALPHA)
    assert n == 40 and perfect(40, DELTA) > EPS >= perfect(39, DELTA)
    for eps in (0.05, 0.21, 1.0, 3.0):  # delta = 0: p > e^eps / (1 + e^eps)
        expect = math.floor(math.log(ALPHA / 2) / math.log(special.expit(eps))) + 1
        assert tramer.min_runs(eps, 0.0, ALPHA) == expect


# ---- threshold and canaries --------------------------------------------------------------

def _tau(val_in, val_out, alpha=ALPHA):
    return tramer.audit_losses(val_in, val_out, [0.0, 1.0], [0.0, 1.0], EPS, DELTA,
                               alpha)["threshold"]


def test_threshold_separates_and_breaks_ties():
    tau = _tau(np.array([0.1, 0.2, 0.3]), np.array([1.0, 2.0, 3.0]), 0.5)
    assert tau == pytest.approx(0.65)  # midway between the last "in" and the first "out"
    # Few runs: every bound is 0 at alpha = 1e-10; the tie goes to the largest TPR - FPR.
    tau = _tau(np.array([0.1, 0.2, 5.0]), np.array([0.15, 3.0, 4.0]))
    assert tau == pytest.approx(1.6)  # TPR 2/3, FPR 1/3 (as at 0.1; the larger tau wins)


@pytest.mark.parametrize("args,match", [
    (([np.nan, 0.2], [1.0, 2.0], [0.0, 0.5], [0.3, 5.0]), "val_pos has 1 NaN"),
    (([0.1, 0.2], [1.0, 2.0], [np.nan] * 2, [np.nan] * 2), "eval_pos has 2 NaN"),
    (([0.1, 0.2], [1.0, 2.0], [], [0.3]), "eval_pos has 0 scores"),
    (([0.1, 0.2], [], [0.1], [0.3]), "val_neg has 0 scores"),
])
def test_audit_losses_refuses_nan_and_empty_losses(args, match):
    """All-NaN losses used to give threshold NaN and "no violation detected"; empty
    evaluation arrays a ZeroDivisionError."""
    with pytest.raises(ValueError, match=match):
        tramer.audit_losses(*args, EPS, DELTA)


def test_infinite_losses_of_diverged_runs_count_as_out():
    row = tramer.audit_losses([0.1, 0.2], [np.inf, 2.0], [0.0, np.inf], [np.inf, 7.0], EPS,
                              DELTA, alpha=0.5)
    assert (row["ct_pos"], row["ct_neg"]) == (1, 0) and np.isfinite(row["threshold"])


def test_audit_losses_counts_below_threshold():
    row = tramer.audit_losses([0.1, 0.2], [1.0, 2.0], [0.0, 0.5, 0.59, 2.0], [0.3, 5.0, 6.0, 7.0],
                              EPS, DELTA, alpha=0.5)
    assert row["threshold"] == pytest.approx(0.6)
    assert (row["ct_pos"], row["ct_neg"]) == (3, 1)
    assert (row["tpr"], row["fpr"]) == (0.75, 0.25)
    # the attack's ROC on the evaluation losses (score = -loss): 13 of 16 pairs ordered;
    # with 4 runs without the canary FPR <= 1% allows no false positive: only loss 0 < 0.3
    assert row["auc"] == pytest.approx(13 / 16)
    assert row["tpr_at_fpr_1pct"] == row["tpr_at_fpr_0_1pct"] == 0.25


def test_katz_and_bayes_beside_the_verdict_on_the_lectures_counts():
    row = tramer.audit_counts(4922, 10**5, 174, 10**5, EPS, DELTA)
    assert row["verdict"] == tramer.VIOLATES
    # at 1 - 1e-10 all three read the same counts within 10 % (the posterior is narrow)
    for column in ("eps_lb_katz", "eps_lb_bayes"):
        assert row[column] == pytest.approx(row["eps_lb"], rel=0.1), column


def test_predict_with_wrong_shape_is_a_contract_error():
    X, y = _image_like(20, 2, 2)
    with pytest.raises(ValueError, match="contract"):
        tramer.train_runs(lambda X, y, s, spec: (lambda x: torch.zeros(len(x), 2)),
                          X, y, X[0], [1, 2], {})


def test_train_runs_test_accuracy_and_canary_log_probs():
    """Fixed linear models (one per seed): the canary's log-probabilities and each model's
    test accuracy against numpy; a non-finite logit makes a prediction wrong."""
    X, y = _image_like(30, 2, 1)
    Xt, yt = _image_like(50, 2, 1, seed=5)
    W = torch.randn(3, 3, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)

    def train(X_, y_, seeds, spec):
        def predict(x):
            z = torch.einsum("md,kdc->kmc", x.double(), W)
            if len(x) > 1:
                z[2, 0] = torch.nan  # model 2 diverged on the first test point
            return z
        return predict

    out = tramer.train_runs(train, X, y, X[0], [1, 2, 3], {}, test=(Xt, yt))
    z = np.einsum("md,kdc->kmc", np.vstack([X[:1].numpy(), Xt.numpy()]), W.numpy())
    lp = z[:, 0] - np.log(np.exp(z[:, 0]).sum(1, keepdims=True))
    np.testing.assert_allclose(out["log_prob"], lp, rtol=1e-12)
    right = z[:, 1:].argmax(-1) == yt.numpy()
    right[2, 0] = False
    np.testing.assert_array_equal(out["test_acc"], right.mean(1))
    assert "test_acc" not in tramer.train_runs(train, X, y, X[0], [1, 2, 3], {})
    cols = tramer.accuracy_columns(out["test_acc"], "these")
    assert (cols["test_acc_min"], cols["test_acc_max"], cols["test_acc_models"]) == (
        right.mean(1).min(), right.mean(1).max(), 3)
    with pytest.raises(ValueError, match="finite accuracies"):
        tramer.accuracy_columns([0.5, np.nan], "these")


# ---- audits of implementations --------------------------------------------------------------

def test_buggy_violates_its_claim_and_fixed_does_not():
    """The registry subjects at the same claim (0.21, 1e-5) on small image-like data.

    Full batches (q = 1) and a small clip with a large lr (every gradient clipped: each
    example moves the weights by lr * C / B per step) make the bug glaring: the buggy noise
    std sigma * C / B is 1/400 of the correct one.
    """
    X, y = _image_like()
    spec = {"epochs": 10, "batch_size": 400, "lr": 4000.0, "clip": 0.01, "eps": EPS,
            "delta": DELTA, "n": len(X), "device": "cpu"}
    canary = canaries.make_canary("checkerboard", X, y)
    rows = {}
    for name in ("buggy", "fixed"):
        rows[name], losses = tramer.audit_implementation(
            subjects.SUBJECTS[name], X, y, canary,
            tramer.Design(EPS, DELTA, runs=100, val_runs=50, seed=3), spec)
        assert len(losses) == 300 and losses.seed.is_unique
    assert rows["buggy"]["verdict"] == tramer.VIOLATES
    assert rows["buggy"]["eps_lb"] > 4 * EPS and rows["buggy"]["tpr"] > 0.9
    assert rows["fixed"]["verdict"] == tramer.NO_VIOLATION and rows["fixed"]["eps_lb"] == 0.0


def test_kept_runs_of_both_subjects_train_once_as_columns(tmp_path):
    """With stores, the buggy subject's audit trains the fixed one's runs beside its own
    (columns of one call: the same batches and noise draws, the noise std apart) and keeps
    them, so the fixed audit trains nothing; a rerun (a timed-out job) restores every
    batch, bit for bit. The runs are those trained apart, to float rounding."""
    X, y = _image_like(n=100)
    spec = {"epochs": 2, "batch_size": 25, "lr": 1.0, "clip": 0.5, "eps": EPS,
            "delta": DELTA, "n": len(X), "device": "cpu"}
    canary = canaries.make_canary("checkerboard", X, y)
    stores = {name: (subjects.SUBJECTS[name], tmp_path / name, {"implementation": name})
              for name in ("buggy", "fixed")}

    def audit(name, log=None, kept=True):
        fn, store, key = stores[name]
        more = dict(store=store, key=key, together={other: stores[other] for other in stores
                                                    if other != name}) if kept else {}
        return tramer.audit_implementation(
            fn, X, y, canary, tramer.Design(EPS, DELTA, runs=12, val_runs=6, seed=1), spec,
            batches=tramer.Batches(8, None if log is None else log.append, **more))

    msgs = {name: [] for name in stores}
    first = {name: audit(name, msgs[name]) for name in stores}
    assert first["buggy"][0]["canary_label"] == first["fixed"][0]["canary_label"]
    assert [m for m in msgs["buggy"] if "restored" in m] == ["0 models restored, 18 to train"] * 2
    assert [m for m in msgs["fixed"] if "restored" in m] == ["18 models restored, 0 to train"] * 2
    for name in stores:
        apart = audit(name, kept=False)
        np.testing.assert_allclose(first[name][1].loss, apart[1].loss, rtol=1e-4)
        assert first[name][0]["verdict"] == apart[0]["verdict"]
        again = audit(name)
        pd.testing.assert_frame_equal(again[1], first[name][1], check_exact=True)


def test_user_function_by_module_path(user_module):
    """The exact Gaussian mechanism: flagged only with the 1/n bug; ClipBKD canary."""
    X, y = _image_like(100, 4, 4, seed=1)
    sigma = 1 / tramer.mu_claimed(EPS, DELTA)
    canary = canaries.make_canary("clipbkd", X, y)
    assert canary.label in (0, 1) and float(canary.x.norm()) == pytest.approx(10.0)
    verdicts = {}
    for bug in (True, False):
        fn = subjects.load_train_fn(f"{user_module}:train")
        row, _ = tramer.audit_implementation(
            fn, X, y, canary, tramer.Design(EPS, DELTA, runs=200, val_runs=100, seed=0),
            {"n_classes": 2, "clip": 1.0, "sigma": sigma, "bug": bug})
        verdicts[bug] = row["verdict"]
    assert verdicts == {True: tramer.VIOLATES, False: tramer.NO_VIOLATION}


def test_batched_runs_equal_unbatched_ones(user_module, tmp_path):
    """The trials loop hands each batch its start: batches of 1, 7 or all runs train the
    same runs (seed for seed) and keep them under the same trial numbers."""
    X, y = _image_like(60, 4, 4, seed=2)
    canary = canaries.make_canary("checkerboard", X, y)
    fn = subjects.load_train_fn(f"{user_module}:train")
    spec = {"n_classes": 2, "clip": 1.0, "sigma": 1.0}
    out = {b: tramer.audit_implementation(
        fn, X, y, canary, tramer.Design(EPS, DELTA, runs=40, val_runs=9, seed=4), spec,
        batches=tramer.Batches(b, store=tmp_path / str(b)))
           for b in (1, 7, 1000)}
    for b in (1, 7):
        pd.testing.assert_frame_equal(out[b][1], out[1000][1], check_exact=True)
        assert out[b][0] == out[1000][0]
    kept = sorted(p.name for p in (tmp_path / "7").iterdir())
    assert "evaluation_runs_with_canary_000035-000040.csv" in kept and len(kept) == 2 * (6 + 2)


# ---- the CLI -------------------------------------------------------------------------------

@pytest.fixture
def no_training(monkeypatch):
    """Fail the test if the CLI gets as far as loading data or training."""
    def boom(*a, **k):
        raise AssertionError("reached data loading / training")
    monkeypatch.setattr("dpaudit.data.load_fmnist", boom)
    monkeypatch.setattr(tramer, "audit_implementation", boom)


@pytest.mark.parametrize("args, message", [
    (["--train", "no_such_module_xyz:train"], "cannot import module 'no_such_module_xyz'"),
    (["--train", "user_mech:missing"], "has no callable 'missing'"),
    (["--train", "user_mech:not_callable"], "has no callable 'not_callable'"),
    (["--train", "nonsense"], "must be 'module.path:function'"),
    (["--eps", "abc"], "--eps (claimed epsilon)='abc': must be a number > 0"),
    (["--eps", "nan"], "must be a number > 0"),
    (["--delta", "1.5"], "must be a number > 0 and < 1"),
    (["--runs", "39"], "need --runs >= 40"),
    (["--spec", '{"epochs": 1, "batch_size": 10, "lr": 1, "clip": 1, "eps": 3}'],
     "are set by the audit"),
    (["--spec", '{"epochs": 1, "lr": 1, "clip": 1}'], "missing keys ['batch_size']"),
])
def test_cli_rejects_bad_input_before_training(args, message, user_module, no_training,
                                               tmp_path, capsys):
    base = {"--train": "buggy", "--eps": "0.21", "--delta": "1e-5", "--runs": "100",
            "--spec": '{"epochs": 1, "batch_size": 10, "lr": 1, "clip": 1}'}
    base.update(dict(zip(args[::2], args[1::2])))
    argv = ["audit-impl", "--seed", "0", "--out", str(tmp_path / "a.csv")]
    for key, value in base.items():
        argv += [key, value]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "config error" in err and message in err
    assert not (tmp_path / "a.csv").exists()


def test_cli_too_few_runs_message_names_the_best_possible_bound(no_training, tmp_path, capsys):
    assert main(["audit-impl", "--train", "fixed", "--eps", "0.21", "--delta", "1e-5",
                 "--runs", "20", "--seed", "0", "--out", str(tmp_path / "a.csv")]) == 2
    best = tramer.max_eps_lb(20, DELTA, ALPHA)
    assert f"certifies at most eps_LB={best:.3g}" in capsys.readouterr().err and best < EPS


def test_cli_audit_and_plot_end_to_end(user_module, monkeypatch, tmp_path):
    X, y = _image_like(100, 4, 12, seed=2)
    monkeypatch.setattr("dpaudit.data.load_fmnist",
                        lambda root, classes, **kw: (X.numpy(), y.numpy()))
    sigma = 1 / tramer.mu_claimed(EPS, DELTA)
    out = tmp_path / "res" / "audit.csv"
    spec = f'{{"n_classes": 2, "clip": 1.0, "sigma": {sigma}, "bug": true}}'
    assert main(["audit-impl", "--train", f"{user_module}:train", "--eps", "0.21",
                 "--delta", "1e-5", "--runs", "60", "--val-runs", "30", "--n-train", "100",
                 "--canary", "clipbkd", "--seed", "7", "--out", str(out), "--spec", spec]) == 0
    table, meta = read_table(out)
    assert list(table.columns[:10]) == ["implementation", "claimed_eps", "delta", "runs", "tpr",
                                        "fpr", "threshold", "eps_lb", "mu_lb", "verdict"]
    assert table.seed.tolist() == [7] and meta["seed"] == 7 and table.runs.tolist() == [60]
    assert table.verdict.tolist() == [tramer.VIOLATES]
    losses, _ = read_table(tmp_path / "res" / "audit_losses.csv")
    assert len(losses) == 2 * (60 + 30) and losses.seed.is_unique
    assert set(losses.seed[losses.split == "evaluation"]) == set(
        tramer.run_seeds(7, "evaluation", True, 60) + tramer.run_seeds(7, "evaluation", False, 60))
    # every model's test accuracy: the models of two seeds re-trained here and scored by hand
    fn = subjects.load_train_fn(f"{user_module}:train")
    spec_ = {"n_classes": 2, "clip": 1.0, "sigma": sigma, "bug": True}
    for seed in losses.seed[~losses.canary_in].iloc[[0, -1]]:
        logits = fn(X, y, [int(seed)], spec_)(X)[0]  # the test split is X here (patched)
        acc = float((logits.argmax(1) == y).double().mean())
        assert losses.test_acc[losses.seed == seed].item() == pytest.approx(acc, abs=1e-12)
    assert table.test_acc_mean.item() == pytest.approx(losses.test_acc.mean(), rel=1e-12)
    assert table.test_acc_models.item() == len(losses)
    assert "device" not in meta  # a user's function: dpaudit's trainer trained nothing

    # re-audited from the losses: the same row; the histogram holds every evaluation run
    res = tmp_path / "res"
    again = ["tramer-reaudit", "--table", str(out), "--losses", str(res / "audit_losses.csv"),
             "--out", str(res / "re.csv"), "--hist", str(res / "hist.csv")]
    assert main(again) == 0
    re_table, re_meta = read_table(res / "re.csv")
    pd.testing.assert_frame_equal(re_table, table)
    assert re_meta["audit"]["seed"] == 7 and re_meta["accuracy"] is None
    hist, _ = read_table(res / "hist.csv")
    assert hist.groupby("canary_in")["count"].sum().tolist() == [60, 60]
    # accuracy from a re-training of some of the same runs (here: a copy of the first 50)
    sub = losses.iloc[:50].assign(test_acc=0.5)
    write_table(sub, res / "sub.csv", {"device": {"device": "cpu"}})
    assert main(again + ["--accuracy", str(res / "sub.csv")]) == 0
    re_table, re_meta = read_table(res / "re.csv")
    assert re_table.test_acc_models.item() == 50 and re_table.test_acc_mean.item() == 0.5
    # the copied runs' losses are the audited ones: KS distance 0 in the one group they fill
    assert [(c["runs"], c["ks"], c["p"]) for c in re_meta["retrained_vs_audited"]] == [
        (30, 0.0, 1.0), (20, 0.0, 1.0)]
    shifted = tramer.compare_retrained(losses, sub.assign(loss=sub.loss + 1e9))
    assert (shifted.ks == 1.0).all()  # every re-trained loss above every audited one
    assert re_table.test_acc_source.item() == "re-trained on cpu with the same seeds"
    write_table(sub.assign(seed=sub.seed + 1), res / "sub.csv", {})
    assert main(again + ["--accuracy", str(res / "sub.csv")]) == 2  # not the same runs

    fig = tmp_path / "fig.pdf"
    assert main(["tramer-plot", "--table", str(out), "--losses",
                 str(tmp_path / "res" / "audit_losses.csv"), "--out", str(fig)]) == 0
    assert fig.stat().st_size > 0 and fig.with_suffix(".png").stat().st_size > 0
    from_hist = tmp_path / "fig_hist.pdf"
    assert main(["tramer-plot", "--table", str(out), "--hist", str(res / "hist.csv"),
                 "--out", str(from_hist)]) == 0
    assert from_hist.with_suffix(".png").read_bytes() == fig.with_suffix(".png").read_bytes()


def test_report_caption_renders_as_snakemake_renders_it():
    """Snakemake renders captions with trim_blocks and lstrip_blocks: each branch's last
    sentence must still be apart from the text after the block."""
    import jinja2
    from pathlib import Path

    text = (Path(__file__).parents[1] / "workflow/report/tramer.rst").read_text()
    template = jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string(text)
    tramer_cfg = {"eps": 0.21, "delta": 1e-5, "canary": "checkerboard", "alpha": 1e-10,
                  "user": {"train": "m:f", "eps": 1.0, "delta": 1e-6}}
    for figure, first in (("tramer", "audited with a checkerboard canary.\n"),
                          ("audit_user", "(eps, delta) = (1.0, 1e-06).\n")):
        snake = type("S", (), {"wildcards": type("W", (), {"figure": figure}),
                               "config": {"tramer": tramer_cfg}})
        out = template.render(snakemake=snake)
        assert first + "Histograms of the canary's loss" in out, out


def test_reference_targets_draw_the_kept_tables_without_training(tmp_path):
    """`tramer_reference` and `trials_needed_reference` read reference/ and only plot."""
    import re
    from pathlib import Path

    from test_workflow import snakemake

    out = snakemake("-n", "--directory", str(tmp_path), "tramer_reference",
                    "trials_needed_reference")
    assert out.returncode == 0, out.stderr
    jobs = set(re.findall(r"^(?:local)?rule (\w+):", out.stdout, re.M))
    assert jobs == {"tramer_reference_plot", "tramer_reference",
                    "trials_needed_reference_plot", "trials_needed_reference"}
    ref = Path(__file__).parents[1] / "reference"
    assert f"{ref}/tramer_audit_hist.csv" in out.stdout
    # the kept table is the GPU run's 100,000 runs per side, with the accuracy columns
    table, meta = read_table(ref / "tramer_audit.csv")
    assert table.runs.tolist() == [100_000, 100_000] and meta["audit"]["spec"]["runs"] == 100_000
    assert table.verdict.tolist() == [tramer.VIOLATES, tramer.NO_VIOLATION]
    for row in table.itertuples():  # its bounds are those of its counts
        again = tramer.audit_counts(row.ct_pos, row.runs, row.ct_neg, row.runs, EPS, DELTA)
        assert row.eps_lb == pytest.approx(again["eps_lb"], rel=1e-12)


def test_cli_keeps_the_runs_of_the_registry_subjects(monkeypatch, tmp_path, capsys):
    """`--store`: a folder per subject; the fixed subject's runs come with the buggy one's
    calls, and a rerun restores every batch: the same losses, nothing trained. The fixed
    subject audited alone does not take the runs trained as a column."""
    X, y = _image_like(60, 4, 12, seed=3)
    monkeypatch.setattr("dpaudit.data.load_fmnist",
                        lambda root, classes, **kw: (X.numpy(), y.numpy()))
    argv = ["audit-impl", "--train", "buggy", "fixed", "--eps", "0.21", "--delta", "1e-5",
            "--runs", "40", "--val-runs", "8", "--n-train", "60", "--batch-runs", "32",
            "--seed", "3", "--spec",
            '{"epochs": 1, "batch_size": 20, "lr": 1.0, "clip": 1, "device": "cpu"}',
            "--store", str(tmp_path / "kept")]
    assert main(argv + ["--out", str(tmp_path / "a.csv")]) == 0
    err = capsys.readouterr().err
    assert err.count("fixed: 48 models restored, 0 to train") == 2
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["buggy", "fixed"]
    assert main(argv + ["--out", str(tmp_path / "b.csv")]) == 0
    assert capsys.readouterr().err.count("48 models restored, 0 to train") == 4
    a, b = (read_table(tmp_path / f"{n}_losses.csv")[0] for n in "ab")
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    # fixed alone trains alone: its runs beside buggy's are equal to float rounding only
    alone = argv[:2] + argv[3:]
    assert alone[1:3] == ["--train", "fixed"]
    assert main(alone + ["--out", str(tmp_path / "c.csv")]) == 0
    assert capsys.readouterr().err.count("fixed: 0 models restored, 48 to train") == 2


def test_tramer_audit_trains_the_registry_subjects_on_the_device_given(monkeypatch, tmp_path,
                                                                        capsys):
    """`tramer-audit --device` (config `tramer.device`, which the workflow turns into `cuda`
    only for a job that reserved a GPU) reaches the registry subjects' spec; a device the
    spec names itself (`audit_user`'s) is kept."""
    import json

    from dpaudit.cli.tramer_plan import Request, check

    X, y = _image_like(60, 4, 12, seed=4)
    monkeypatch.setattr("dpaudit.data.load_fmnist",
                        lambda root, classes, **kw: (X.numpy(), y.numpy()))
    sec = {"implementations": ["fixed"], "eps": EPS, "delta": DELTA, "alpha": ALPHA,
           "canary": "checkerboard", "classes": [0, 1], "n_train": 60, "runs": 40,
           "val_runs": 8, "batch_runs": 48,
           "model": {"arch": "lr", "epochs": 1, "batch_size": 20, "lr": 1.0, "clip": 1.0}}
    data = {"root": None, "download": False, "cifar10_tarball": None, "cifar100_root": None}
    out = tmp_path / "t.csv"
    assert main(["tramer-audit", "--target", "case-study", "--spec", json.dumps(sec),
                 "--data", json.dumps(data), "--device", "cpu", "--seed", "0", "--out",
                 str(out), "--losses", str(tmp_path / "l.csv")]) == 0
    table, prov = read_table(out)
    assert prov["device"]["device"] == "cpu" and table.implementation.tolist() == ["fixed"]
    spec = {"epochs": 1, "batch_size": 20, "lr": 1.0, "clip": 1.0}
    [(_, _, given)] = check(Request(["fixed"], EPS, DELTA, ALPHA, 40, 8, 60, 48, [0, 1], None,
                                    spec, "cpu"))["plans"]
    [(_, _, own)] = check(Request(["fixed"], EPS, DELTA, ALPHA, 40, 8, 60, 48, [0, 1], None,
                                  {**spec, "device": "cuda"}, "cpu"))["plans"]
    assert given["device"] == "cpu" and own["device"] == "cuda"
