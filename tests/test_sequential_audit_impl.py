"""`audit-impl --sequential`: the evaluation runs of every mode in rounds, stopped at the
first certified violation (anytime-valid bounds), on the fixed audit's seeds."""

import time

import pytest

from dpaudit import subjects
from dpaudit.cli import main
from dpaudit.experiments import tramer
from dpaudit.io import read_table

from test_tight_audit_impl import _audit  # its tiny DP-SGD setting
from test_tramer import _image_like

MAX_RUNS = 60


def _evaluation_seeds_are_a_prefix_of_the_fixed_audits(losses, seed, runs_in, runs_out):
    ev = losses[losses.split == "evaluation"]
    for inside, n in ((True, runs_in), (False, runs_out)):
        got = ev[ev.canary_in == inside].sort_values("run")
        assert got.run.tolist() == list(range(n))
        assert got.seed.tolist() == tramer.run_seeds(seed, "evaluation", inside, MAX_RUNS)[:n]


@pytest.mark.parametrize("mode", ["worst-case-init", "white-box"])
def test_tight_modes_stop_early_on_buggy_and_run_to_the_maximum_on_fixed(mode):
    rows = {name: _audit(name, mode, runs=MAX_RUNS, schedule=tramer.schedule_of(MAX_RUNS))
            for name in ("buggy", "fixed")}
    (buggy, losses), (fixed, _) = rows["buggy"], rows["fixed"]
    # buggy: certified at the second look (30 runs per side), far fewer than 100
    assert buggy["stop_reason"] == "certified" and buggy["runs"] <= 30
    assert buggy["verdict"] in (tramer.VIOLATES, tramer.VIOLATES_PROFILE)
    assert buggy["eps_lb"] > 1.0 or buggy["profile_violation"] > 0
    _evaluation_seeds_are_a_prefix_of_the_fixed_audits(losses, 3, buggy["runs_in"],
                                                       buggy["runs_out"])
    assert (losses.split == "validation").sum() == 2 * MAX_RUNS
    # fixed: every round, no violation; the anytime bound is at most the fixed one
    assert fixed["stop_reason"] == "max_runs" and fixed["runs"] == MAX_RUNS
    assert fixed["looks"] == len(tramer.schedule_of(MAX_RUNS).targets()) == 4
    assert fixed["verdict"] == tramer.NO_VIOLATION and fixed["eps_lb"] == 0.0
    assert fixed["profile_violation"] <= 0 and fixed["max_runs"] == MAX_RUNS


def _cli(tmp_path, monkeypatch, *extra):
    X, y = _image_like(100, 4, 12, seed=2)
    monkeypatch.setattr("dpaudit.data.load_fmnist",
                        lambda root, classes, **kw: (X.numpy(), y.numpy()))
    out = tmp_path / "a.csv"
    code = main(["audit-impl", "--train", "buggy", "fixed", "--eps", "0.21", "--delta", "1e-5",
                 "--runs", str(MAX_RUNS), "--val-runs", "20", "--n-train", "100",
                 "--alpha", "0.05", "--seed", "3", "--out", str(out), "--sequential",
                 "--spec", '{"epochs": 4, "batch_size": 100, "lr": 2000.0, "clip": 0.01, '
                           '"device": "cpu"}', *extra])
    return code, out


def test_cli_black_box_buggy_stops_early_fixed_runs_to_the_maximum(tmp_path, monkeypatch,
                                                                    capsys):
    code, out = _cli(tmp_path, monkeypatch)
    assert code == 0
    err = capsys.readouterr().err
    assert "look 1: 20 + 20 runs (in + out), eps_LB" in err
    assert "buggy: sequential: stopped (certified) at look" in err
    table, meta = read_table(out)
    assert meta["args"]["sequential"] is True
    row = table.set_index("implementation")
    assert list(table.columns[:10]) == ["implementation", "claimed_eps", "delta", "runs", "tpr",
                                        "fpr", "threshold", "eps_lb", "mu_lb", "verdict"]
    assert row.loc["buggy", "stop_reason"] == "certified" and row.loc["buggy", "runs"] <= 30
    assert row.loc["buggy", "eps_lb"] > 0.21 or row.loc["buggy", "profile_violation"] > 0
    assert row.loc["buggy", "verdict"] in (tramer.VIOLATES, tramer.VIOLATES_PROFILE)
    assert row.loc["fixed", "stop_reason"] == "max_runs"
    assert row.loc["fixed", "runs"] == MAX_RUNS and row.loc["fixed", "eps_lb"] == 0.0
    losses, _ = read_table(tmp_path / "a_losses.csv")
    for name in ("buggy", "fixed"):  # the runs actually trained, and only those
        ev = losses[(losses.implementation == name) & (losses.split == "evaluation")]
        assert len(ev) == row.loc[name, "runs_in"] + row.loc[name, "runs_out"]
        _evaluation_seeds_are_a_prefix_of_the_fixed_audits(ev, 3, row.loc[name, "runs_in"],
                                                           row.loc[name, "runs_out"])
    # a fixed-n re-audit of optionally stopped runs would not hold: refused
    assert main(["tramer-reaudit", "--table", str(out), "--losses",
                 str(tmp_path / "a_losses.csv"), "--out", str(tmp_path / "r.csv"),
                 "--hist", str(tmp_path / "h.csv")]) != 0


@pytest.mark.parametrize("args, message", [
    (["--budget", "5"], "--budget=5.0: only with --sequential"),
    (["--sequential", "--budget", "0"], "--budget=0.0: must be a number of seconds > 0"),
    (["--sequential", "--store", "kept"], "--store: not with --sequential"),
])
def test_cli_refuses_bad_sequential_options(args, message, tmp_path, capsys):
    argv = ["audit-impl", "--train", "fixed", "--eps", "0.21", "--delta", "1e-5", "--runs",
            "100", "--seed", "0", "--out", str(tmp_path / "a.csv")]
    if "--store" in args:
        args = args[:-1] + [str(tmp_path / "kept")]
    assert main(argv + args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "a.csv").exists()


def _slow_fixed(X, y, seeds, spec, canaries=None):
    """The fixed subject, 0.25 s a call: a round (a call per side) outlasts the budget."""
    time.sleep(0.25)
    return subjects.SUBJECTS["fixed"](X, y, seeds, spec, canaries=canaries)


def test_budget_stops_it_after_the_round_it_began():
    """The first round always completes (a verdict on both sides' runs); the next does
    not start once the budget is spent."""
    import test_tight_audit_impl as tight

    X, y = tight._data()
    row, losses = tramer.audit_implementation(
        _slow_fixed, X, y, None, tramer.Design(
            tight.EPS, tight.DELTA, MAX_RUNS, 20, 3, tight.ALPHA,
            schedule=tramer.schedule_of(MAX_RUNS, budget_s=0.3)), tight.SPEC,
        mode=tramer.Mode("white-box"), checks=tramer.Checks(seed_check=0))
    assert row["stop_reason"] == "budget" and row["looks"] == 1 and row["runs"] == 20
    assert (losses.split == "evaluation").sum() == 40
    assert row["verdict"] == tramer.NO_VIOLATION
