"""`audit-impl` and a user's code that fails: an exception, a call that hangs, a white-box
function that never inserts the gradient canary, a white-box spec without `clip`. Each ends
in one line and exit 2, with no result file."""

import json
import textwrap

import pytest
import torch

from dpaudit import dpsgd
from dpaudit.cli import main
from dpaudit.cli import tramer as cli_tramer
from dpaudit.experiments import tramer

MODULE = textwrap.dedent('''
    import time

    import torch

    from dpaudit import dpsgd, subjects


    class Oops(Exception):
        pass


    def good(X, y, seeds, spec):
        W = torch.stack([torch.randn(X.shape[1], 2, generator=torch.Generator().manual_seed(s))
                         for s in seeds])
        return lambda x: x @ W


    def _helper(what):
        raise ValueError(f"bad {what}")


    def raises_in_train(X, y, seeds, spec):
        _helper("train")


    def raises_in_predict(X, y, seeds, spec):
        good(X, y, seeds, spec)
        return lambda x: 1 / 0


    def raises_own_class(X, y, seeds, spec):
        raise Oops("mine\\nsecond line")


    def hangs_in_train(X, y, seeds, spec):
        time.sleep(60)


    def hangs_in_predict(X, y, seeds, spec):
        predict = good(X, y, seeds, spec)
        def slow(x):
            while True:
                time.sleep(0.01)
        return slow


    def swallows(X, y, seeds, spec):  # its `except Exception` must not hide the limit
        try:
            time.sleep(60)
        except Exception:
            pass
        return good(X, y, seeds, spec)


    def passes_canary(X, y, seeds, spec, canaries=None):
        return subjects.dpsgd_fixed(X, y, seeds, spec, canaries=canaries)


    def records_mates(X, y, seeds, spec, canaries=None):  # what the audit passed, kept
        with open(__file__ + ".mates", "a") as f:  # (it runs in the worker process)
            f.write(f"{canaries.mates}\\n")
        return subjects.dpsgd_fixed(X, y, seeds, spec, canaries=canaries)


    def never_inserts(X, y, seeds, spec, canaries=None):  # runs without it on both sides
        mine = dpsgd.GradientCanaries(canaries.directions,
                                      torch.zeros_like(canaries.included))
        return subjects.dpsgd_fixed(X, y, seeds, spec, canaries=mine)
''')

from test_tight_audit_impl import D, N, SPEC, _data  # noqa: E402  (the same tiny task)


@pytest.fixture
def audit(tmp_path, monkeypatch, capsys):
    """``audit(function, *flags)``: exit code, stderr and table path of audit-impl on tiny
    runs of ``user_code:function``."""
    (tmp_path / "user_code.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    X, y = _data()
    monkeypatch.setattr("dpaudit.data.load_fmnist",
                        lambda root, classes, **kw: (X.numpy(), y.numpy()))

    def run(function, *flags, spec=SPEC):
        out = tmp_path / "res" / f"{function}.csv"
        code = main(["audit-impl", "--train", f"user_code:{function}", "--eps", "1", "--delta",
                     "1e-5", "--alpha", "0.05", "--runs", "20", "--val-runs", "10",
                     "--n-train", str(N), "--seed", "5", "--spec", json.dumps(spec),
                     "--out", str(out), *flags])
        return code, capsys.readouterr().err, out
    return run


@pytest.mark.parametrize("function, line, frame", [
    ("raises_in_train", "--train user_code:raises_in_train: train(X, y, seeds, spec) of the "
                        "seed check's 3 runs raised ValueError: bad train; no result written",
     "in _helper"),
    ("raises_in_predict", "--train user_code:raises_in_predict: predict(x) of the seed "
                          "check's 3 runs raised ZeroDivisionError: division by zero; no "
                          "result written", "in <lambda>"),
    ("raises_own_class", "--train user_code:raises_own_class: train(X, y, seeds, spec) of the "
                         "seed check's 3 runs raised Oops: mine; no result written",
     "in raises_own_class"),
])
def test_an_exception_of_the_users_code_is_one_line_after_the_users_frames(
        audit, function, line, frame):
    code, err, out = audit(function)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert lines[-1].endswith(line), err
    assert "Traceback (most recent call last):" in err and frame in err and "user_code.py" in err
    assert "dpaudit" not in "".join(lines[:-1]).replace("dpaudit audit-impl:", ""), err
    assert not out.exists()


@pytest.mark.parametrize("function, flags, call", [
    ("hangs_in_train", [], "train(X, y, seeds, spec) of the seed check's 3 runs"),
    ("hangs_in_predict", ["--seed-check", "0"],
     "predict(x) of the validation runs without canary 0-9"),
    ("swallows", [], "train(X, y, seeds, spec) of the seed check's 3 runs"),
])
def test_a_call_past_the_time_limit_is_named(audit, function, flags, call):
    code, err, out = audit(function, "--call-timeout", "0.3", *flags)
    assert code == 2, err
    assert (f"--train user_code:{function}: {call} ran past the per-call time limit of 0.3 s "
            "(--call-timeout); no result written") in err
    assert not out.exists()


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_a_bad_time_limit_is_refused(audit, value):
    code, err, _ = audit("good", "--call-timeout", value)
    assert code == 2 and f"--call-timeout={float(value)!r}: must be a number of seconds" in err


def test_the_time_limit_defaults_to_the_experiments_and_stays_out_of_the_table(audit):
    assert cli_tramer.CALL_LIMIT == tramer.CALL_LIMIT
    code, err, out = audit("passes_canary", "--call-timeout", "30")
    assert code == 0, err
    from dpaudit.io import read_table

    assert "call_timeout" not in read_table(out)[1]["args"]


def test_white_box_refuses_a_function_that_never_inserts_the_canary(audit):
    code, err, out = audit("never_inserts", "--mode", "white-box")
    assert code == 2, err
    assert ("--train user_code:never_inserts: cannot be audited, no result written: white-box "
            "mode: the gradient canary never went in: after train(X, y, seeds, spec, "
            "canaries=...) of the seed check's 3 runs the canaries object passed records no "
            "training call") in err
    assert not out.exists()
    code, err, _ = audit("never_inserts", "--mode", "white-box", "--seed-check", "0")
    assert code == 2 and ("of the validation runs without canary 0-9 the canaries object "
                          "passed records no training call") in err
    # The same function passing the canary on is audited.
    code, err, out = audit("passes_canary", "--mode", "white-box")
    assert code == 0, err
    assert out.exists()


def test_white_box_without_clip_is_refused_by_key_for_a_users_function(audit):
    code, err, out = audit("passes_canary", "--mode", "white-box",
                           spec={k: v for k, v in SPEC.items() if k != "clip"})
    assert code == 2, err
    assert ("--spec for 'user_code:passes_canary' --mode white-box: spec.clip=None: white-box "
            "mode needs the clipping norm C") in err
    assert len(err.strip().splitlines()) == 1 and not out.parent.exists()


def _recorded(steps, rate, counts):
    given = dpsgd.GradientCanaries(torch.ones(1, 3), torch.ones(len(counts), 1, dtype=bool))
    given.record(steps, rate, torch.tensor(counts).view(-1, 1))
    return given


def test_insertions_are_checked_against_the_draws_at_their_rate():
    # 10 runs of 100 steps at rate 0.1: about 100 insertions, refused beyond the binomial's
    # INSERTION_ALPHA quantiles on either side.
    from scipy import stats

    lo = int(stats.binom.ppf(tramer.INSERTION_ALPHA, 1000, 0.1))
    hi = int(stats.binom.isf(tramer.INSERTION_ALPHA, 1000, 0.1))
    for total in (lo + 1, 100, hi):
        tramer.check_insertions(_recorded(100, 0.1, [total] + [0] * 9), 10, True, "c")
    for total in (0, lo - 1, hi + 2):
        with pytest.raises(tramer.Unauditable, match=rf"c inserted the canary {total} times "
                                                     r"in 100 steps of 10 runs, where "
                                                     r"sampling at rate 0.1 inserts about 100"):
            tramer.check_insertions(_recorded(100, 0.1, [total] + [0] * 9), 10, True, "c")
    with pytest.raises(tramer.Unauditable, match="c inserted the canary 1 times into runs "
                                                 "without it"):
        tramer.check_insertions(_recorded(100, 0.1, [1] + [0] * 9), 10, False, "c")
    with pytest.raises(tramer.Unauditable, match=r"counts of shape \(9, 1\), not"):
        tramer.check_insertions(_recorded(100, 0.1, [0] * 9), 10, False, "c")


def test_the_trainer_records_each_runs_insertions():
    model = dpsgd.ModelSpec("lr", D, n_classes=2)
    X, y = _data()
    cfg = dpsgd.DPSGDConfig(2, 20, 0.5, 1.0, 1.0, "poisson")
    inc = torch.tensor([[True, False], [False, False], [True, True]])
    given = dpsgd.GradientCanaries(dpsgd.dirac_canaries(model, 2, 1.0, 0, device="cpu"), inc, rate=1.0)
    dpsgd.train(X, y, model, cfg, [1, 2, 3], canaries=given, device="cpu")
    (ins,) = given.insertions
    T = cfg.steps(N)
    assert (ins.steps, ins.rate) == (T, 1.0) and torch.equal(ins.counts, inc.long() * T)


def test_white_box_passes_the_batch_mates_and_the_row_records_them(audit):
    """``--mates`` reaches the function as ``canaries.mates`` on every call and the row and
    provenance record it; without it neither has the key (earlier tables unchanged)."""
    from dpaudit.io import read_table

    code, err, out = audit("records_mates", "--mode", "white-box", "--mates", "-1")
    assert code == 0, err
    calls = (out.parent.parent / "user_code.py.mates").read_text().split()
    # every call but the mates probe's (mates 0, which must move the scores)
    assert len(calls) > 3 and calls.count("0.0") == 1 and set(calls) == {"-1.0", "0.0"}
    df, prov = read_table(out)
    assert df.mates.tolist() == [-1.0] and prov["args"]["mates"] == -1.0
    code, err, out = audit("passes_canary", "--mode", "white-box")
    df, prov = read_table(out)
    assert code == 0 and "mates" not in df and "mates" not in prov["args"], err


@pytest.mark.parametrize("flags, message", [
    (["--mates", "-1"], "--mates=-1: only with --mode white-box (the gradient canary's "
                        "batch mates), not --mode black-box"),
    (["--mode", "white-box", "--mates", "1.5"], "--mates=1.5: must be a number in [-1, 1]"),
    (["--mode", "white-box", "--mates", "nan"], "--mates=nan: must be a number in [-1, 1]"),
])
def test_bad_batch_mates_are_refused_before_training(audit, flags, message):
    code, err, out = audit("passes_canary", *flags)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()
