"""Audit the three Opacus trainings of examples/opacus/cases.py with dpaudit audit-impl
and print one verdict line per audit.

They train logistic regression on Fashion-MNIST classes 0/1 (784 inputs, n = 500 rows),
not your data: an example of the audit, to run before auditing your own Opacus training
(docs/audit_your_implementation.md, "Opacus trainings"). Needs Opacus:
pip install -e ".[opacus]".

    python examples/opacus/audit.py --quick --data-root /path/to/data

Each audit is the command a user runs on their own Opacus training, the claim and the spec
given by the adapter dpaudit.adapters.opacus.OpacusTrainer (OpacusTrainer.cli_args):

    PYTHONPATH=examples/opacus dpaudit audit-impl --train cases:correct \\
        $(OpacusTrainer.cli_args(1e-5)) --runs 80 --val-runs 40 --out ...

Each training is audited by the mode that shows what it does: correct in all three modes,
shuffled and noise_on_mean in the black box. --quick: the sequential audit (audit-impl
--sequential) at alpha = 0.05, 10 validation runs per side, then evaluation runs in rounds
of 20 and 30 per side, stopping at the first certified violation: at most 80 runs per
audit (and the seed check's), each verdict at 95% confidence. Without it the fixed
audit, 1000 evaluation and 500 validation runs per side at alpha = 1e-10. The tables and
each audit's log go to --out. The audits run side by side, one per core (--jobs), each on
one thread.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# Opacus' PRV accountant bounds its domain with RDP, whose orders it warns about.
warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")

from dpaudit.cli import main  # noqa: E402
from dpaudit.io import read_table  # noqa: E402

#: (training of cases.py, mode): each case by the mode that shows it; the correct one in
#: the tight modes too, the adapter's other two.
AUDITS = [("correct", "black-box"), ("shuffled", "black-box"),
          ("noise_on_mean", "black-box"), ("correct", "worst-case-init"),
          ("correct", "white-box")]


def audit(name: str, mode: str, runs: int, val_runs: int, out: Path, data_root, seed: int,
          alpha: float | None = None, sequential: bool = False):
    """One audit-impl run (at its default alpha unless ``alpha``; with ``sequential`` at
    most ``runs`` evaluation runs per side, in rounds), its log in OUT/NAME_MODE.log; its
    verdict line."""
    import cases  # here, not at the top: --help needs no Opacus
    table = out / f"{name}_{mode}.csv"
    args = ["audit-impl", "--train", f"cases:{name}", "--mode", mode, "--runs", str(runs),
            "--val-runs", str(val_runs), "--seed", str(seed), "--out", str(table),
            *getattr(cases, name).cli_args(cases.DELTA).split()]
    if data_root is not None:
        args += ["--data-root", str(data_root)]
    if alpha is not None:
        args += ["--alpha", str(alpha)]
    if sequential:
        args.append("--sequential")
    start = time.perf_counter()
    with open(out / f"{name}_{mode}.log", "w") as log, contextlib.redirect_stderr(log):
        code = main(args)
    took = time.perf_counter() - start
    if code != 0:
        last = (out / f"{name}_{mode}.log").read_text().strip().splitlines()[-1:]
        return f"{name} ({mode}): audit failed (exit {code}): {' '.join(last)}"
    row = read_table(table)[0].iloc[0]
    how = f", sequential at alpha {row.alpha:g}, at most {runs}" if sequential else ""
    return (f"{name} ({mode}, {row.runs} + {val_runs} runs per side{how}, {took:.0f} s): "
            f"eps_LB {row.eps_lb:.2f} against Opacus' eps {row.claimed_eps:.3f}, profile test V "
            f"{row.profile_violation:+.3f}: {row.verdict}")


def main_(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="the sequential audit at alpha 0.05: at most 30 evaluation runs per "
                        "side, 10 validation runs (default: the fixed audit, 1000 + 500 at "
                        "alpha 1e-10)")
    p.add_argument("--data-root", default=None, help="the data folder holding Fashion-MNIST "
                   "(default $DPAUDIT_DATA or ~/.cache/dpaudit/data; Debian's "
                   "dataset-fashion-mnist package is found without it)")
    p.add_argument("--out", type=Path, default=Path("results/opacus"),
                   help="folder of the audits' tables and logs (default results/opacus)")
    p.add_argument("--seed", type=int, default=0,
                   help="master seed of every audit's runs (default 0)")
    p.add_argument("--only", default=None, help="these audits, NAME:MODE[,NAME:MODE...] (e.g. "
                   "correct:white-box)")
    p.add_argument("--runs", type=int, default=None, help="evaluation runs per side, in place "
                   "of --quick's or the default")
    p.add_argument("--val-runs", type=int, default=None, help="validation runs per side, as "
                   "--runs")
    p.add_argument("--alpha", type=float, default=None, help="the audits' alpha (default "
                   "0.05 with --quick, else audit-impl's, 1e-10: at least 76 runs per side "
                   "for these claims)")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    p.add_argument("--jobs", type=int, default=cores or 1,
                   help="audits at once, one thread each (default: the cores at hand)")
    a = p.parse_args(argv)
    runs, val_runs, alpha = (30, 10, 0.05) if a.quick else (1000, 500, None)
    runs, val_runs = a.runs or runs, a.val_runs or val_runs
    alpha = alpha if a.alpha is None else a.alpha
    todo = AUDITS if a.only is None else list(dict.fromkeys(  # each once: one table each
        tuple(x.split(":", 1)) for x in a.only.split(",")))
    if not set(todo) <= set(AUDITS):
        p.error(f"--only {a.only}: each must be one of {[f'{n}:{m}' for n, m in AUDITS]}")
    if a.jobs < 1:
        p.error(f"--jobs {a.jobs}: must be at least 1")
    # One thread per audit: tiny models, and two threads on a busy 2-core machine made each
    # Opacus step about 16 times slower (measured). Set before cases.py is imported, so
    # that whatever it runs at import starts no thread pool the forked audits would inherit.
    torch.set_num_threads(1)
    try:
        import cases  # noqa: F401  (Opacus is needed from here on: one line if it is missing)
    except ImportError as exc:
        p.error(str(exc))
    a.out.mkdir(parents=True, exist_ok=True)
    args = [(name, mode, runs, val_runs, a.out, a.data_root, a.seed, alpha, a.quick)
            for name, mode in todo]
    # Side by side in processes forked from this one on Linux: they inherit its imports of
    # torch, Opacus and cases.py, Opacus' noise multiplier with them, where spawned ones
    # would import and compute them again. Forking is safe while torch has one thread and
    # no CUDA context (a forked child cannot use its parent's); spawned otherwise, and
    # elsewhere (macOS' fork is unsafe). The lines in the order of the audits, each once it
    # and those before it are done.
    start = ("fork" if sys.platform.startswith("linux") and not torch.cuda.is_initialized()
             else "spawn")
    pool = (None if a.jobs == 1 or len(todo) == 1 else
            ProcessPoolExecutor(min(a.jobs, len(todo)), multiprocessing.get_context(start),
                                initializer=torch.set_num_threads, initargs=(1,)))
    with pool or contextlib.nullcontext():
        for line in (pool.map if pool else map)(audit, *zip(*args)):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main_())
