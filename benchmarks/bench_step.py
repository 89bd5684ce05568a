"""Runs per second of the audits that need many runs, and the operations one training step
launches, against another checkout of dpaudit side by side (e.g. the version before the
counter-based generator and the shared-data step).

Workloads (FMNIST classes 0/1, or random data of that shape where FMNIST is not installed):

  tramer    Tramer et al.'s case study: the two subjects (buggy, fixed) as the columns of
            one call, logistic regression 784 -> 2, n = 501, Poisson batches of 100, 100
            steps (runs/s counts both subjects' runs);
  blackbox  the worst-case-init black box of the tight audits: full-batch DP-SGD on n =
            1000 rows, 100 steps, logistic regression, both inits as columns (runs/s counts
            both);
  table2    Jagielski et al.'s Table 2 group: 72 cells of the 784-32-2 net as columns, n =
            6000, batch 250, one epoch (model-steps/s);
  whitebox  the tight white box: the 784-32-2 net with a Dirac gradient canary, n = 6000,
            Poisson batches of 250, one epoch (runs/s);
  shuffle   the shuffle audit's white box (docs/shuffle.md): logistic regression, n = 500,
            shuffled batches of 5, one epoch (100 steps), a Dirac gradient canary with
            crafted batch mates (runs/s);
  poisson   the same with Poisson batches: its control, which the shuffled subjects should
            match in speed.

Each workload runs in a fresh process per checkout (``--baseline SRC`` names the other
checkout's ``src`` folder, e.g. ``git worktree add /tmp/base 508af69`` then ``--baseline
/tmp/base/src``), the checkouts taking turns in every round so that load from other
processes hits them alike; best of ``--repeats`` rounds, after a warm-up call. Then the
operations per training step of this checkout (torch.profiler: aten operations that
compute, allocations and views left out), at K = 1, 32 and 1024 runs: a step that loops
over its runs launches more operations as K grows.

    python benchmarks/bench_step.py [--baseline /tmp/base/src] [--threads 2] [--repeats 3]
                                    [--workloads tramer blackbox table2 whitebox] [--tiny]

On CUDA (``--device cuda``) the runs per call are the workflow's (Tramer's batch_runs,
the seeds per call of the others). ``--tiny``: a few runs on small data, to check that
the benchmark works (seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ("tramer", "blackbox", "table2", "whitebox", "shuffle", "poisson")
#: Runs per call on the CPU, and the sizes of --tiny.
CPU_K = {"tramer": 512, "blackbox": 64, "table2": 2, "whitebox": 128, "shuffle": 128,
         "poisson": 128}
TINY = {"n_scale": 0.05, "K": 4, "epochs": 1}


def _data(n: int, tiny: bool):
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from setups import load_data

    X, y, source = load_data(max(n, 64))
    if tiny:
        X = X[:, :49].contiguous()  # 7 x 7 pixels
    return X[:n], y[:n], source, torch


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():  # not a forced description
        torch.cuda.synchronize()


def _tramer(spec: dict):
    """Runs/s of Tramer et al.'s two subjects as the columns of one call."""
    from dpaudit import subjects

    n = 25 if spec["tiny"] else 501
    X, y, source, torch = _data(n, spec["tiny"])
    sub = {"arch": "lr", "epochs": 2 if spec["tiny"] else 20, "batch_size": max(2, n // 5), "lr": 50.0, "clip": 0.1,
           "eps": 0.21, "delta": 1e-5, "n": n, "device": spec["device"]}
    fns = [subjects.SUBJECTS["buggy"], subjects.SUBJECTS["fixed"]]

    def call(K):
        subjects.train_columns(fns, X, y, list(range(K)), sub)[0](X[:1])
        _sync(spec["device"])
        return 2 * K
    return call, source


def _blackbox(spec: dict):
    """Runs/s of the full-batch black box, both inits as columns."""
    import numpy as np

    from dpaudit import dpsgd
    from dpaudit.experiments.tight import blackbox

    n = 50 if spec["tiny"] else 1000
    X, y, source, torch = _data(n, spec["tiny"])
    model = dpsgd.ModelSpec("lr", X.shape[1])
    setting = blackbox.FullBatch(10 if spec["tiny"] else 100, 1e-4, 1.0, 5.0)
    init = dpsgd.init_params(model, 1, [0], device=spec["device"])
    x_c, y_c = np.zeros(X.shape[1], np.float32), 1

    def call(K):
        blackbox.train_scores(X.numpy(), y.numpy(), model, setting, blackbox.INITS, init, x_c,
                              y_c, list(range(K)), K, spec["device"])
        _sync(spec["device"])
        return 2 * K
    return call, source


def _table2(spec: dict):
    """Model-steps/s of Table 2's group: its 72 cells as the columns of one call."""
    import yaml

    from dpaudit import dpsgd
    from dpaudit.experiments.jagielski import grid_cells, groups

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from setups import group_cells

    n = 300 if spec["tiny"] else 6000
    X, y, source, torch = _data(n, spec["tiny"])
    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    jag = cfg["jagielski"]
    one = cfg["onerun"] if cfg["onerun"]["compare_many_model"] else None
    grid = groups(grid_cells(jag, one)["all"])
    cells = grid[(jag["table2"]["dataset"], jag["table2"]["arch"], "clipbkd")]
    cfgs = group_cells(jag, cells, 1)
    model = dpsgd.ModelSpec("fnn", X.shape[1], hidden=32)
    init = dpsgd.init_params(model, 1, [0], device="cpu")

    def call(K):
        dpsgd.train(X, y, model, cfgs, list(range(K)), init=init, device=spec["device"])
        _sync(spec["device"])
        return K * len(cfgs) * cfgs[0].steps(n)
    return call, source


def _whitebox(spec: dict):
    """Runs/s of the tight white box: one column, a Dirac gradient canary, Poisson batches."""
    from dpaudit import dpsgd

    n = 300 if spec["tiny"] else 6000
    X, y, source, torch = _data(n, spec["tiny"])
    model = dpsgd.ModelSpec("fnn", X.shape[1], hidden=32)
    cfg = dpsgd.DPSGDConfig(1, max(2, n // 24), 0.15, 1.0, 2.68, "poisson")
    dirs = dpsgd.dirac_canaries(model, 1, 1.0, 0, device=spec["device"])

    def call(K):
        inc = torch.arange(K).remainder(2).eq(0).view(-1, 1)
        dpsgd.train(X, y, model, cfg, list(range(K)), device=spec["device"],
                    canaries=dpsgd.GradientCanaries(dirs, inc))
        _sync(spec["device"])
        return K
    return call, source


def _mates(sampling: str):
    """The shuffle audit's white box (module docstring), with ``sampling``'s batches."""
    def make(spec: dict):
        from dpaudit import dpsgd

        n = 50 if spec["tiny"] else 500
        X, y, source, torch = _data(n, spec["tiny"])
        model = dpsgd.ModelSpec("lr", X.shape[1], 2)
        cfg = dpsgd.DPSGDConfig(1, 5, 0.1, 1.0, 0.74, sampling)
        dirs = dpsgd.dirac_canaries(model, 1, 1.0, 0, device=spec["device"])

        def call(K):
            inc = torch.arange(K).remainder(2).eq(0).view(-1, 1)
            dpsgd.train(X, y, model, cfg, list(range(K)), device=spec["device"],
                        canaries=dpsgd.GradientCanaries(dirs, inc, mates=-1.0))
            _sync(spec["device"])
            return K
        return call, source
    return make


def _k(name: str, spec: dict) -> int:
    """Runs (seeds) per call: --tiny's, the CPU's, or the workflow's on CUDA."""
    if spec["tiny"]:
        return TINY["K"]
    if not spec["device"].startswith("cuda"):
        return CPU_K[name]
    import yaml

    from dpaudit import dpsgd

    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    if name == "tramer":
        return int(cfg["tramer"]["batch_runs"])
    if name in ("shuffle", "poisson"):
        return dpsgd.seeds_per_call(dpsgd.ModelSpec("lr", 784, 2), 500, dpsgd.DPSGDConfig(
            1, 5, 0.1, 1.0, 0.74, name), 1, spec["device"], limit=20000)
    model = dpsgd.ModelSpec("lr" if name == "blackbox" else "fnn", 784, hidden=32)
    if name == "blackbox":
        return dpsgd.seeds_per_call(model, 1000, dpsgd.DPSGDConfig(100, 1000, 0.1, 1.0, 5.0),
                                    2, spec["device"], limit=20000)
    setup = dpsgd.DPSGDConfig(1, 250, 0.15, 1.0, 1.0, "shuffle" if name == "table2" else
                              "poisson")
    return dpsgd.seeds_per_call(model, 6000, setup, 72 if name == "table2" else 1,
                                spec["device"], limit=20000)


def worker(spec: dict) -> None:
    """The workloads of ``spec`` in this process (``--worker``), each a warm-up call and the
    best of the timed calls of 2 s (one with --tiny), then with ``ops`` the operations per
    step; prints {"rate": {workload: ...},
    "K": {...}, "source": ..., "ops": {...}}."""
    import torch

    torch.set_num_threads(spec["threads"])
    out = {"rate": {}, "K": {}}
    for name in spec["workloads"]:
        call, out["source"] = {"tramer": _tramer, "blackbox": _blackbox, "table2": _table2,
                               "whitebox": _whitebox, "shuffle": _mates("shuffle"),
                               "poisson": _mates("poisson")}[name](spec)
        K = _k(name, spec)
        call(min(K, 4))
        best, spent = 0.0, 0.0
        while not best or spent < (0 if spec["tiny"] else 2.0):  # calls of 2 s, at least one
            t = time.perf_counter()
            done = call(K)
            took = time.perf_counter() - t
            spent, best = spent + took, max(best, done / took)
        out["rate"][name], out["K"][name] = best, K
    if spec.get("ops"):
        out["ops"] = ops_per_step(spec)
    print(json.dumps(out), flush=True)


def ops_per_step(spec: dict) -> dict:
    """Operations per training step at K = 1, 32 and 1024 runs, on the CPU (--tiny: 1
    and 32) of Tramer et al.'s and the black box's calls: {workload: {K: ops}}."""
    from torch.profiler import ProfilerActivity, profile

    no_kernel = {"empty", "empty_like", "empty_strided", "view", "reshape", "_reshape_alias",
                 "as_strided", "expand", "select", "slice", "transpose", "unsqueeze",
                 "squeeze", "t", "permute", "detach", "alias", "unflatten", "flatten",
                 "_unsafe_view", "lift_fresh", "resolve_conj", "resolve_neg", "split",
                 "narrow"}
    spec = {**spec, "device": "cpu"}
    out = {}
    for name in ("tramer", "blackbox"):
        call, _ = {"tramer": _tramer, "blackbox": _blackbox}[name](spec)
        steps = 10 if spec["tiny"] else 100
        row = {}
        for K in (1, 32) if spec["tiny"] else (1, 32, 1024):
            call(1)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                call(K)
            row[K] = sum(1 for e in prof.events() if e.name.startswith("aten::")
                         and e.name[6:] not in no_kernel) / steps
        out[name] = row
    return out


def _run(src: str, args: list[str], threads: int) -> dict:
    path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)  # src first
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": str(threads),
           "PYTHONWARNINGS": "ignore"}
    got = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True,
                         text=True)
    if got.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:2])} with {src}: {got.stderr.strip()[-2000:]}")
    return json.loads(got.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", help="the src folder of another checkout to compare with")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu", help="cpu or cuda [cpu]")
    ap.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    ap.add_argument("--tiny", action="store_true", help="small data and few runs (a check)")
    ap.add_argument("--no-ops", action="store_true",
                    help="leave out the operations per step (CPU-bound, minutes at K=1024)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(json.loads(args.worker))
    if args.repeats < 1 or args.threads < 1:
        ap.error("--repeats and --threads: must be >= 1")
    here = str(ROOT / "src")
    checkouts = {"this": here}
    if args.baseline:
        if not (Path(args.baseline) / "dpaudit" / "__init__.py").is_file():
            ap.error(f"--baseline {args.baseline}: not a src folder holding dpaudit/")
        checkouts = {"baseline": args.baseline, "this": here}
    repeats = 1 if args.tiny else args.repeats
    best = {(w, c): 0.0 for w in args.workloads for c in checkouts}
    K, ops = {}, {}
    # --tiny: every workload and the operations count in one process per checkout; else
    # a fresh process per workload, the checkouts taking turns.
    batches = [args.workloads] if args.tiny else [[w] for w in args.workloads]
    for r in range(repeats):
        for i, workloads in enumerate(batches):
            for c, src in checkouts.items():
                spec = {"workloads": workloads, "threads": args.threads,
                        "device": args.device, "tiny": args.tiny,
                        "ops": not args.no_ops and r == 0
                        and (args.tiny or i == len(batches) - 1)}
                got = _run(src, ["--worker", json.dumps(spec)], args.threads)
                for w in workloads:
                    best[w, c] = max(best[w, c], got["rate"][w])
                K.update(got["K"])
                source = got["source"]
                if "ops" in got:
                    ops[c] = got["ops"]
        print(f"round {r + 1} of {repeats} done", file=sys.stderr, flush=True)
    unit = {"table2": "model-steps/s"}
    print(f"\n{source} data, {args.device}, {args.threads} threads, best of {repeats}")
    for w in args.workloads:
        line = ", ".join(f"{c} {best[w, c]:.1f}" for c in checkouts)
        ratio = (f" ({best[w, 'this'] / best[w, 'baseline']:.2f}x the baseline)"
                 if "baseline" in checkouts else "")
        print(f"{w} (K={K[w]}): {line} {unit.get(w, 'runs/s')}{ratio}")
    for c, by_workload in ops.items():
        for w, row in by_workload.items():
            print(f"operations per step ({c}, {w}, CPU): "
                  + ", ".join(f"K={k} {v:.1f}" for k, v in row.items()))


if __name__ == "__main__":
    main()
