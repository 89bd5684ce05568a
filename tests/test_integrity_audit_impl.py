"""`audit-impl` refuses what it cannot audit: fault injection into a user's training function.

Each bad function wraps one good one (a full-batch noisy gradient step of softmax regression
from zero, all randomness from the run's seed) and breaks it in one way. The CLI must exit 2
with a message naming the problem and write no result file; the good function is audited and
its verdict says how many runs were usable.
"""

import json
import textwrap

import numpy as np
import pytest
import torch

from dpaudit.canaries import Canary
from dpaudit.cli import main
from dpaudit.experiments import tramer
from dpaudit.io import read_table

MODULE = textwrap.dedent('''
    import numpy as np
    import torch

    def good(X, y, seeds, spec):
        Xt = torch.cat([X, torch.ones(len(X), 1)], 1).double()
        onehot = torch.nn.functional.one_hot(y, 2).double()
        g = Xt[:, :, None] * (0.5 - onehot)[:, None, :]  # per-example gradients at W = 0
        total = (g / g.flatten(1).norm(dim=1).clamp(min=1.0)[:, None, None]).sum(0)
        W = torch.stack([-(total + spec.get("sigma", 1.0) * torch.randn(
            total.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(s)))
            for s in seeds])
        return lambda x: torch.cat([x, torch.ones(len(x), 1)], 1).double() @ W

    def _map(fn):  # a function whose predict's logits are fn(logits, seeds)
        def train(X, y, seeds, spec):
            predict = good(X, y, seeds, spec)
            return lambda x: fn(predict(x), seeds)
        return train

    def _nan(z, seeds):
        return z * torch.nan

    def _inf(z, seeds):
        return z.index_fill(-1, torch.tensor([0]), torch.inf)

    def _one_class(z, seeds):  # always class 0, by a margin, on a two-class task
        return z.index_add(-1, torch.tensor([0]), torch.full(z.shape[:2] + (1,), 1e3,
                                                                 dtype=z.dtype))

    def _some_diverge(z, seeds):  # every run whose seed is odd
        return torch.where(torch.tensor([s % 2 == 1 for s in seeds])[:, None, None],
                           torch.nan, z)

    def _one_column(z, seeds):  # logits of one class only
        return z[..., :1]

    nan_logits, inf_logits, one_class, one_column, some_diverge = map(
        _map, (_nan, _inf, _one_class, _one_column, _some_diverge))

    def ignores_seed(X, y, seeds, spec):  # the global generator, not the seeds
        return good(X, y, [int(torch.randint(2**62, ())) for _ in seeds], spec)

    def same_seed(X, y, seeds, spec):
        return good(X, y, [0] * len(seeds), spec)

    def seeded_by_call(X, y, seeds, spec):  # one generator for the call: run k's depends
        g = torch.Generator().manual_seed(seeds[0])  # on seeds[0]
        return good(X, y, [int(torch.randint(2**62, (), generator=g)) for _ in seeds], spec)

    def returns_none(X, y, seeds, spec):
        good(X, y, seeds, spec)

    def returns_numpy(X, y, seeds, spec):
        predict = good(X, y, seeds, spec)
        return lambda x: predict(x).numpy()
''')


def _data(n=100, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 2
    X = torch.randn(n, d, generator=g) + 1.5 * (2 * y[:, None] - 1) / 4
    return X, y


@pytest.fixture
def audit(tmp_path, monkeypatch, capsys):
    """``audit(function, *flags)``: exit code, stderr and table path of audit-impl on tiny
    runs of ``faulty:function``."""
    (tmp_path / "faulty.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    X, y = _data()
    monkeypatch.setattr("dpaudit.data.load_fmnist",
                        lambda root, classes, **kw: (X.numpy(), y.numpy()))

    def run(function, *flags):
        out = tmp_path / "res" / f"{function}.csv"
        code = main(["audit-impl", "--train", f"faulty:{function}", "--eps", "0.21",
                     "--delta", "1e-5", "--runs", "40", "--val-runs", "10", "--n-train", "100",
                     "--seed", "5", "--out", str(out), *flags])
        return code, capsys.readouterr().err, out
    return run


def test_a_good_function_is_audited_and_its_verdict_counts_the_usable_runs(audit):
    code, err, out = audit("good")
    assert code == 0, err
    table, _ = read_table(out)
    row = table.iloc[0]
    assert (row.total_runs, row.usable_runs, row.diverged_runs, row.seed_check) == (100, 100, 0, 3)
    assert "100 of 100 runs usable (0 diverged, counted as out); 3 seeds re-trained" in err
    assert row.test_acc_mean > 0.6


@pytest.mark.parametrize("function, flags, message", [
    # diverged runs: caught by the seed check before the runs, and after them without it
    ("nan_logits", [], "all 3 runs of the seed check diverged"),
    ("nan_logits", ["--seed-check", "0"], "100 of 100 runs diverged (non-finite canary loss)"),
    ("inf_logits", [], "all 3 runs of the seed check diverged"),
    ("inf_logits", ["--seed-check", "0"], "100 of 100 runs diverged (non-finite canary loss)"),
    ("some_diverge", [], "runs diverged (non-finite canary loss); at most max_diverged=0"),
    # one class on a two-class task: half the test set right
    ("one_class", [], "mean test accuracy 0.5000 is at chance (always predicting the most "
                      "frequent test class scores 0.5000)"),
    ("one_column", [], "predict(x) returned torch.Tensor of shape (3, 101, 1), dtype "
                       "torch.float64; the contract is a floating-point torch tensor of shape "
                       "(len(seeds)=3, len(x)=101, n_classes=2)"),
    ("ignores_seed", [], "not deterministic in its seed: the run of seed"),
    ("seeded_by_call", [], "not deterministic in its seed: the run of seed"),
    ("same_seed", [], "the runs of 3 different seeds"),
    ("returns_none", [], "train returned NoneType, not a function; train(X, y, seeds, spec) "
                         "must return predict"),
    ("returns_numpy", [], "predict(x) returned numpy.ndarray of shape (3, 101, 2), dtype "
                          "float64; the contract is a floating-point torch tensor of shape "
                          "(len(seeds)=3, len(x)=101, n_classes=2)"),
])
def test_a_function_that_cannot_be_audited_is_refused_and_nothing_written(
        audit, function, flags, message):
    code, err, out = audit(function, *flags)
    assert code == 2, err
    assert f"--train faulty:{function}: cannot be audited, no result written: " in err
    assert message in err
    assert not out.parent.exists() or not any(out.parent.iterdir())


def test_diverged_runs_up_to_max_diverged_count_as_out_and_are_reported(audit):
    """Half the runs diverge (odd seeds): refused by default, audited with room for them."""
    code, err, out = audit("some_diverge", "--max-diverged", "0.6")
    assert code == 0, err
    losses, _ = read_table(out.with_name(f"{out.stem}_losses.csv"))
    diverged = int((losses.seed % 2 == 1).sum())
    assert 20 < diverged < 80 and np.isinf(losses.loss[losses.seed % 2 == 1]).all()
    table, _ = read_table(out)
    assert (table.usable_runs.item(), table.diverged_runs.item()) == (100 - diverged, diverged)
    assert f"{100 - diverged} of 100 runs usable ({diverged} diverged" in err


def test_the_seed_check_can_be_skipped(audit):
    code, err, out = audit("ignores_seed", "--seed-check", "0")
    assert code == 0, err
    assert read_table(out)[0].seed_check.item() == 0 and "seeds not checked" in err
    code, err, _ = audit("good", "--seed-check", "1")
    assert code == 2 and "seed_check=1: must be 0 (no check) or >= 2 seeds" in err


def test_the_config_target_takes_the_checks_options(tmp_path, monkeypatch, capsys):
    """`tramer.user.seed_check` and `max_diverged` reach the audit of `audit_user`."""
    (tmp_path / "faulty.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    X, y = _data()
    monkeypatch.setattr("dpaudit.data.load_fmnist",
                        lambda root, classes, **kw: (X.numpy(), y.numpy()))
    user = {"train": "faulty:ignores_seed", "eps": 0.21, "delta": 1e-5,
            "canary": "checkerboard", "runs": 40, "val_runs": 10, "spec": "{}"}
    data = {"root": None, "download": False, "cifar10_tarball": None, "cifar100_root": None}

    def run(**more):
        sec = {"alpha": 1e-10, "classes": [0, 1], "n_train": 100, "batch_runs": 64,
               "user": {**user, **more}}
        return main(["tramer-audit", "--target", "user", "--spec", json.dumps(sec), "--data",
                     json.dumps(data), "--seed", "0", "--out", str(tmp_path / "u.csv"),
                     "--losses", str(tmp_path / "l.csv")])

    assert run() == 2 and "not deterministic in its seed" in capsys.readouterr().err
    assert run(seed_check=0) == 0
    assert read_table(tmp_path / "u.csv")[0].seed_check.item() == 0
    assert run(seed_check=0, max_diverged=1.5) == 2
    assert "tramer.user.max_diverged" in capsys.readouterr().err


def test_check_seeds_passes_exact_and_batched_runs_alike():
    """The registry's batched DP-SGD (runs as columns of one call) passes the check."""
    from dpaudit import subjects

    X, y = _data(60, 8)
    spec = {"epochs": 1, "batch_size": 20, "lr": 1.0, "clip": 1.0, "eps": 1.0,
            "delta": 1e-5, "n": 60, "device": "cpu"}
    tramer.check_seeds(subjects.dpsgd_fixed, X, y, [3, 1, 4, 1 << 40], spec, X[:10])
    with pytest.raises(ValueError, match="at least 2"):
        tramer.check_seeds(subjects.dpsgd_fixed, X, y, [3], spec, X[:10])


def test_the_chance_check_refuses_user_functions_only():
    """audit_implementation refuses models at chance unless told the function is dpaudit's
    own (the registry subjects, which a tiny configuration may leave at chance)."""
    X = torch.tensor([[0.0], [1.0]] * 10)
    y = torch.tensor([0, 1] * 10)

    def at_chance(X_, y_, seeds, spec):  # always class 0, deterministic in its seeds
        return lambda x: torch.tensor([[[1.0 + s % 7, 0.0]] * len(x) for s in seeds])

    canary = Canary("test", torch.tensor([0.5]), 1)
    args = (at_chance, X, y, canary, tramer.Design(1.0, 1e-5, 40, 10, 0), {})
    with pytest.raises(tramer.Unauditable, match="at chance"):
        tramer.audit_implementation(*args, test=(X, y), checks=tramer.Checks(seed_check=0))
    row, _ = tramer.audit_implementation(*args, test=(X, y), checks=tramer.Checks(
        seed_check=0, refuse_at_chance=False))
    assert row["test_acc_mean"] == 0.5 and row["verdict"]
