"""`audit-impl` survives the code it audits: a user's training function runs in a worker
process the auditor owns (dpaudit.user_code), and the checks after the runs use seeds and
probes the function cannot predict. Each hostile function below ends in one line naming the
call and exit status 2, no result written; the honest ones it wraps are audited."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from dpaudit import user_code
from dpaudit.cli import main

MODULE = textwrap.dedent('''
    import os
    import signal
    import sys
    import time

    import torch

    from dpaudit import dpsgd, seeds as derive

    CALLS = [0]


    def good(X, y, seeds, spec, init=None):  # one noisy clipped gradient step from init
        Xt = torch.cat([X, torch.ones(len(X), 1)], 1).double()
        onehot = torch.nn.functional.one_hot(y, 2).double()
        g = Xt[:, :, None] * (0.5 - onehot)[:, None, :]
        total = (g / g.flatten(1).norm(dim=1).clamp(min=1.0)[:, None, None]).sum(0)
        W0 = torch.zeros_like(total) if init is None else torch.cat(
            [init.W[0][0], init.b[0][0][None]]).double()
        W = torch.stack([W0 - total - torch.randn(
            total.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(s))
            for s in seeds])
        return lambda x: torch.cat([x, torch.ones(len(x), 1)], 1).double() @ W


    def exits(X, y, seeds, spec):
        sys.exit(0)


    def exits_hard(X, y, seeds, spec):
        os._exit(0)


    def kills_itself(X, y, seeds, spec):
        os.kill(os.getpid(), signal.SIGKILL)


    def interrupts(X, y, seeds, spec):
        raise KeyboardInterrupt


    class Boom(BaseException):
        pass


    def raises_base(X, y, seeds, spec):
        raise Boom("not an Exception")


    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("no")

        __repr__ = __str__


    def raises_unprintable(X, y, seeds, spec):
        raise Unprintable()


    def ignores_alarm(X, y, seeds, spec):
        signal.signal(signal.SIGALRM, signal.SIG_IGN)
        signal.setitimer(signal.ITIMER_REAL, 0)
        while True:
            time.sleep(0.05)


    def forks(X, y, seeds, spec):  # the child would go on as a second copy
        os.fork()
        return good(X, y, seeds, spec)


    def mutates(X, y, seeds, spec):
        X.mul_(2)
        return good(X, y, seeds, spec)


    def mutates_rows(X, y, seeds, spec):
        predict = good(X, y, seeds, spec)
        def change(x):
            z = predict(x)
            x.zero_()
            return z
        return change


    def _noisy(X, y, seeds, spec):  # another draw at every call
        return good(X, y, [int(torch.randint(2**62, ())) for _ in seeds], spec)


    def known_check(X, y, seeds, spec):  # deterministic on the seed check's seeds only
        check = set(derive.int_seeds(3, 5, "tramer/seed-check/out"))
        return (good if set(seeds) <= check else _noisy)(X, y, seeds, spec)


    def small_seeds(X, y, seeds, spec):  # deterministic on seeds below 2^61 only
        return (good if max(seeds) < 2**61 else _noisy)(X, y, seeds, spec)


    def first_calls(X, y, seeds, spec):  # deterministic in its first 4 calls only
        CALLS[0] += 1
        return (good if CALLS[0] <= 4 else _noisy)(X, y, seeds, spec)


    def ignores_init(X, y, seeds, spec, init=None):
        return good(X, y, seeds, spec)


    # ---- white box: DP-SGD of dpaudit's trainer, honest and not -------------------------

    MODEL = dpsgd.ModelSpec("lr", 16, n_classes=2)
    CFG = dpsgd.DPSGDConfig(1, 20, 0.5, 1.0, 1.0, "poisson")


    def _train(X, y, seeds, canaries):
        return dpsgd.train(X, y, MODEL, CFG, seeds, canaries=canaries, device="cpu")


    def honest(X, y, seeds, spec, canaries=None):
        return _train(X, y, seeds, canaries)


    def inserts_everywhere(X, y, seeds, spec, canaries=None):  # records the included only
        mine = dpsgd.GradientCanaries(canaries.directions,
                                      torch.ones_like(canaries.included), mates=canaries.mates)
        run = _train(X, y, seeds, mine)
        for ins in mine.insertions:
            canaries.record(ins.steps, ins.rate, ins.counts * canaries.included)
        return run


    def records_only(X, y, seeds, spec, canaries=None):  # plausible counts, no insertion
        mine = dpsgd.GradientCanaries(canaries.directions,
                                      torch.zeros_like(canaries.included), mates=canaries.mates)
        run = _train(X, y, seeds, mine)
        for ins in mine.insertions:
            counts = torch.tensor([[int((torch.rand(ins.steps, generator=torch.Generator(
            ).manual_seed(s)) < ins.rate).sum())] for s in seeds]) * canaries.included
            canaries.record(ins.steps, ins.rate, counts)
        return run


    def ignores_mates(X, y, seeds, spec, canaries=None):
        mine = dpsgd.GradientCanaries(canaries.directions, canaries.included)
        run = _train(X, y, seeds, mine)
        for ins in mine.insertions:
            canaries.record(*ins)
        return run
''')


def _data(n=300, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 2
    X = torch.rand(n, d, generator=g) + 0.5 * (2 * y[:, None] - 1) / 4
    X[:, :4] = 0  # features the data never uses: where the Dirac canary goes
    return X, y


@pytest.fixture
def audit(tmp_path, monkeypatch, capsys):
    """``audit(function, *flags)``: exit code, stderr and table path of audit-impl on tiny
    runs of ``hostile:function`` (100 training rows, 10 + 40 runs per side)."""
    (tmp_path / "hostile.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    X, y = _data()
    monkeypatch.setattr("dpaudit.data.load_fmnist",
                        lambda root, classes, **kw: (X.numpy(), y.numpy()))

    def run(function, *flags, seed="5"):
        out = tmp_path / "res" / f"{function}.csv"
        code = main(["audit-impl", "--train", f"hostile:{function}", "--eps", "1",
                     "--delta", "1e-5", "--alpha", "0.05", "--runs", "20", "--val-runs",
                     "10", "--n-train", "100", "--seed", seed, "--out", str(out),
                     "--spec", json.dumps({"clip": 1.0}), *flags])
        return code, capsys.readouterr().err, out
    return run


def _refused(result, line):
    """One line (the last of stderr) naming what happened, exit 2, nothing written."""
    code, err, out = result
    assert code == 2, err
    assert line in err.strip().splitlines()[-1], err
    assert "dpaudit/" not in err and not out.exists(), err


SEED_CHECK = "train(X, y, seeds, spec) of the seed check's 3 runs"


@pytest.mark.parametrize("function, what", [
    ("exits", "called sys.exit(0)"),
    ("exits_hard", "ended its process with exit status 0 (e.g. os._exit(0))"),
    ("kills_itself", "ended its process: killed by signal SIGKILL"),
    ("interrupts", "raised KeyboardInterrupt"),
    ("raises_base", "raised Boom: not an Exception"),
    ("raises_unprintable", "raised Unprintable: <its message could not be made: str() "
                           "raised>"),
    ("forks", "forked process(es) ["),
    ("mutates", "modified X in place"),
])
def test_whatever_the_users_code_does_it_ends_in_one_line(audit, function, what):
    _refused(audit(function), f"--train hostile:{function}: " + (
        "cannot be audited, no result written: " if function == "mutates" else "")
        + f"{SEED_CHECK} {what}")


@pytest.mark.parametrize("name, exit_line, what", [
    ("exits_on_import", "import sys\nsys.exit(0)\n", "called sys.exit(0)"),
    ("os_exits_on_import", "import os\nos._exit(0)\n", "called os._exit(0)"),
    ("posix_exits_on_import", "from posix import _exit\n_exit(0)\n", "called os._exit(0)")])
def test_a_module_that_exits_on_import_is_one_line(audit, tmp_path, capsys, name, exit_line,
                                                   what):
    """Checked before any training (the module imported to read its signature): an exit
    there, even os._exit, is one line, never the auditor's exit status 0."""
    (tmp_path / f"{name}.py").write_text(exit_line)
    code = main(["audit-impl", "--train", f"{name}:train", "--eps", "1", "--delta",
                 "1e-5", "--runs", "100", "--seed", "0", "--out", str(tmp_path / "o.csv")])
    err = capsys.readouterr().err
    assert code == 2 and not (tmp_path / "o.csv").exists(), err
    assert err.strip() == (f"dpaudit audit-impl: config error: --train "
                           f"'{name}:train': importing module '{name}' {what}")


def test_predict_changing_its_rows_is_named(audit):
    _refused(audit("mutates_rows"), "modified rows x of predict(x) in place")


def test_the_time_limit_holds_against_code_that_ignores_sigalrm(audit):
    t0 = time.monotonic()
    _refused(audit("ignores_alarm", "--call-timeout", "1"),
             f"--train hostile:ignores_alarm: {SEED_CHECK} ran past the per-call time limit "
             "of 1 s (--call-timeout); no result written")
    assert time.monotonic() - t0 < 60


@pytest.mark.parametrize("function, seed", [("known_check", "5"), ("small_seeds", "185"),
                                            ("first_calls", "5")])
def test_determinism_is_checked_after_the_runs_on_seeds_it_cannot_know(audit, function, seed):
    """Each passes the seed check before the runs (seed 185's check seeds are all below
    2^61); the re-check after them refuses it."""
    _refused(audit(function, seed=seed),
             f"--train hostile:{function}: cannot be audited, no result written: not "
             "deterministic in its seed: re-trained after the runs (seeds drawn from the "
             "outputs of all of them)")


def test_the_honest_function_passes_every_check(audit):
    code, err, out = audit("good")
    assert code == 0 and out.exists(), err
    assert "3 seeds re-trained before the runs, and 3 runs of each side after them" in err


def test_worst_case_init_refuses_a_function_that_ignores_init(audit):
    flags = ["--mode", "worst-case-init", "--n-aux", "100"]
    _refused(audit("ignores_init", *flags), "worst-case-init mode: the function ignores "
                                             "init: the runs of seeds")
    code, err, out = audit("good", *flags)  # the same step, from init
    assert code == 0 and out.exists(), err


@pytest.mark.parametrize("function, flags, message", [
    ("inserts_everywhere", [], "white-box mode: the canary changed nothing: the run of seed"),
    ("records_only", [], "white-box mode: the canary changed nothing: the run of seed"),
    ("ignores_mates", ["--mates", "-1"], "white-box mode: the function ignores "
                                         "canaries.mates"),
])
def test_white_box_probes_refuse_a_canary_or_mates_not_inserted(audit, function, flags,
                                                                 message):
    _refused(audit(function, "--mode", "white-box", *flags),
             f"--train hostile:{function}: cannot be audited, no result written: {message}")


def test_white_box_honest_function_passes_the_probes(audit):
    for flags in ([], ["--mates", "-1"]):
        code, err, out = audit("honest", "--mode", "white-box", *flags)
        assert code == 0 and out.exists(), err


def test_a_worker_serves_many_calls_and_is_killed_with_its_group(tmp_path, monkeypatch):
    """One worker for every call (X and y sent once); close() kills it."""
    (tmp_path / "hostile.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import hostile

    X, y = _data(50)
    request = {"names": ("train", "predict"), "seeds": [1, 2], "spec": {}, "rows": [X[:3]]}
    with pytest.raises(ValueError, match="cannot be sent to the worker process by reference"):
        user_code.Worker(lambda X, y, seeds, spec: None).call(X, y, {}, 60)
    with user_code.Worker(hostile.good) as worker:  # a module-level function: by reference
        first = worker.call(X, y, request, 60)["logits"][0]
        for _ in range(3):
            assert torch.equal(worker.call(X, y, request, 60)["logits"][0], first)
        pid = worker._proc.pid
    torch.testing.assert_close(first, hostile.good(X, y, [1, 2], {})(X[:3]))
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_ctrl_c_kills_the_worker_and_ends_without_a_traceback(tmp_path, sig):
    """SIGINT to the auditor (as the terminal sends it) while the worker hangs: exit 130,
    one line, the worker gone. SIGKILL, which the auditor cannot handle: the worker sees
    its parent gone and kills itself (within seconds)."""
    (tmp_path / "hangs.py").write_text(textwrap.dedent('''
        import os, time
        def train(X, y, seeds, spec):
            open(os.environ["PIDFILE"], "w").write(str(os.getpid()))
            time.sleep(600)
    '''))
    X, y = _data(100)
    script = textwrap.dedent(f'''
        import sys, numpy as np, dpaudit.data
        X, y = np.load({str(tmp_path / "X.npy")!r}), np.load({str(tmp_path / "y.npy")!r})
        dpaudit.data.load_fmnist = lambda root, classes, **kw: (X, y)
        from dpaudit.cli import main
        sys.exit(main(["audit-impl", "--train", "hangs:train", "--eps", "1", "--delta",
                       "1e-5", "--alpha", "0.05", "--runs", "20", "--val-runs", "10",
                       "--n-train", "100", "--seed", "0", "--out", {str(tmp_path / "o.csv")!r}]))
    ''')
    import numpy as np

    np.save(tmp_path / "X.npy", X.numpy())
    np.save(tmp_path / "y.npy", y.numpy())
    pidfile = tmp_path / "pid"
    env = dict(os.environ, PIDFILE=str(pidfile),
               PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 300
    while not pidfile.exists() or not pidfile.read_text():
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
        time.sleep(0.1)
    proc.send_signal(sig)
    err = proc.communicate(timeout=60)[1]
    if sig == signal.SIGINT:
        assert proc.returncode == 130, err
        assert err.strip().splitlines()[-1] == ("dpaudit audit-impl: interrupted; no result "
                                                "written") and "Traceback" not in err, err
    worker, deadline = int(pidfile.read_text()), time.monotonic() + 30
    while time.monotonic() < deadline and _alive(worker):
        time.sleep(0.2)
    assert not _alive(worker)


def _alive(pid: int) -> bool:
    """Is ``pid`` a running process (not gone, not a zombie)?"""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
