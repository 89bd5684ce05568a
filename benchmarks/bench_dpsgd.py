"""Speed of the wide DP-SGD trainer against Opacus and plain SGD, and the projected
wall time of the config's Jagielski grids.

The FMNIST 2-layer setup of Jagielski et al. (2020): classes 0/1, a random half (n=6000,
d=784), 784 -> 32 ReLU -> 2, batch 250, lr 0.15, clip 1, noise multiplier 1.01. Times, in
model-steps per second (one SGD step of one model):

  (a) dpaudit.dpsgd.train of one cell, K=32 models at once (the per-model baseline),
  (b) the real training of the config's Table 2 group: its 3 clips x 4 inits x 6 eps = 72
      cells as columns of one wide call (K seeds, --table2-seeds, each seed's batch
      gathered once for all 72 models), and of a Figure 2 group (its eps labels),
  (c) Opacus 1.6 per-sample gradients (hooks, its default): GradSampleModule + DPOptimizer on
      the same index-gathered batches, and PrivacyEngine.make_private with its DataLoader,
  (d) plain non-private SGD (nn.Sequential, torch.optim.SGD, same batches),

at each thread count of --threads (default: the machine's default and 2); the Opacus rows
and ratios are left out where opacus is not installed. Best of --repeats
rounds of --epochs epochs each (methods interleaved). It prints the line

  table2 grid: N model-steps/s, R x plain SGD, S x Opacus

and the projected wall time of the config's Figure 2 + Table 2 grids, group by group at the
measured speed of a group of that many cells (every model costed as an FMNIST 2-layer model
of 24 epochs: CIFAR heads train on 1024-d features for 20 epochs of 20 steps), on the CPU
and on CUDA when present (with the seeds per call a workflow job takes there, the card
shared by the config's jobs_per_gpu jobs, and the estimated bytes per seed against the
measured peak). Then the levers of the paper-scale run's speed, on the CPU (unless
--cuda-only) and on CUDA:

  K sizing: a Figure 2 group (6 cells) and Table 2's (72) at several seeds per call K;
  N jobs at once: N processes each training a Figure 2 group, together against one alone;
  TF32 (CUDA): both groups with fp32 and with TF32 products (dpsgd.matmul_precision);
  Tramer case study: its two subjects' runs per second, trained apart and as columns;

and, on CUDA, the projected wall time of the whole run (fp32 and TF32): every training
job's time alone from these speeds, the config's jobs_per_gpu at once at the measured
speed-up, between the reference run's measured head and tail. --cuda-only skips the CPU
timings (a GPU session's device time is short), --skip-levers the lever lines.

Without a GPU, DPAUDIT_FORCE_GPU (a GPU description, dpaudit.device) runs the CUDA lines on
the CPU through every GPU-only branch (seeds per call from the described memory, TF32's
clip margin), with the described GPU's name and no measured memory peak; --tiny runs every
line at a small scale (TINY, TINY_CONFIG), so that such a dry run is short:

    python benchmarks/bench_dpsgd.py [--threads 2] [--epochs 1] [--table2-seeds 2] [--cuda-only]
    DPAUDIT_FORCE_GPU='{"name": "H100", ...}' python benchmarks/bench_dpsgd.py --cuda-only --tiny
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

import yaml

from dpaudit import dpsgd
from dpaudit.device import FORCE_GPU_VAR, forced, gpu_count, resolve
from dpaudit.experiments.jagielski import grid_cells, groups

ROOT = Path(__file__).resolve().parents[1]

sys.path.insert(0, str(Path(__file__).resolve().parent))
from setups import B, CLIP, D, H, LR, N, SIGMA, group_cells, load_data  # noqa: E402


@dataclass(frozen=True)
class Scale:
    """What the benchmark times: ``n`` examples; the CUDA lines' epochs per group timing,
    and per lever with its rounds; the K of the K sizing lines (Figure 2's, Table 2's) on
    the CPU and on CUDA (with the K a workflow job takes); the counts of jobs at once on
    CUDA (with the config's jobs_per_gpu); the Tramer et al. runs per call on the CPU."""

    n: int = N
    cuda_epochs: int = 24
    lever_epochs: int = 4
    lever_repeats: int = 2
    cpu_ks: tuple = ((6, 12, 24, 48), (1, 2, 4, 8))
    cuda_ks: tuple = ((100, 200, 400), (100, 200))
    cuda_jobs: tuple = (1, 2, 4)
    tramer_runs: int = 100


#: --tiny: every line in a few seconds on 2 CPU cores (a dry run under DPAUDIT_FORCE_GPU,
#: tests/test_gpu_branches.py); its speeds measure nothing. Its CUDA jobs at once are
#: the config's two only: each process compiles the fused draws anew (dpaudit.dpsgd.philox).
TINY = Scale(n=500, cuda_epochs=1, lever_epochs=1, lever_repeats=1, cpu_ks=((2, 4), (1, 2)),
             cuda_ks=((2, 4), (1, 2)), cuda_jobs=(), tramer_runs=4)
#: --tiny's overlay of --config: few trials (the K of a call is at most a side's trials),
#: two jobs per GPU, a small Tramer et al. case study.
TINY_CONFIG = {"jobs_per_gpu": 2, "jagielski": {"trials": 8},
               "tramer": {"n_train": 100, "batch_runs": 4, "model": {"epochs": 1}}}


def merged(base: dict, overlay: dict) -> dict:
    """``overlay`` over ``base`` as Snakemake merges a ``--configfile``: dicts recursively,
    anything else replaced whole."""
    out = dict(base)
    for key, value in overlay.items():
        out[key] = (merged(out[key], value) if isinstance(value, dict)
                    and isinstance(out.get(key), dict) else value)
    return out


def _real_cuda(device) -> bool:
    """Whether ``device`` is a CUDA card (under a forced GPU description, ``cuda`` is the
    CPU: nothing to synchronize, no CUDA memory to measure)."""
    return resolve(device).type == "cuda"


def _sync(device) -> None:
    """Wait for ``device``'s queued work, so that a timing covers it."""
    if _real_cuda(device):
        torch.cuda.synchronize()


def _empty_cache(device) -> None:
    """Hand the CUDA memory cache back, so that the next line starts from a clean card."""
    if _real_cuda(device):
        torch.cuda.empty_cache()


def _gpu_name() -> str:
    """The GPU the CUDA lines are of: torch's, or the forced description's."""
    desc = forced()
    return torch.cuda.get_device_name() if desc is None else f"{desc.name} (forced, on the CPU)"


def _where(device) -> str:
    """What a line says it ran on."""
    return "CPU" if device == "cpu" else _gpu_name()


def _peak_start() -> int | None:
    """The CUDA bytes allocated now, with the peak reset; None without CUDA memory (a forced
    GPU description trains on the CPU)."""
    if not _real_cuda("cuda"):
        return None
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def _peak_since(start: int | None) -> str:
    """The peak CUDA bytes allocated since :func:`_peak_start`, as printed."""
    if start is None:
        return "unavailable (forced GPU description: trained on the CPU)"
    return f"{(torch.cuda.max_memory_allocated() - start) / 2**20:.0f} MiB"


def _module():
    return nn.Sequential(nn.Linear(D, H), nn.ReLU(), nn.Linear(H, 2))


def _batches(epochs, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [idx for _ in range(epochs) for idx in torch.randperm(n, generator=g).split(B)]


def plain_sgd(X, y, epochs):
    module = _module()
    opt = torch.optim.SGD(module.parameters(), lr=LR)
    for idx in _batches(epochs, len(X)):
        opt.zero_grad()
        nn.functional.cross_entropy(module(X[idx]), y[idx]).backward()
        opt.step()
    return epochs * (len(X) // B)


def opacus_index_batches(X, y, epochs):
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    module = GradSampleModule(_module())
    opt = DPOptimizer(torch.optim.SGD(module.parameters(), lr=LR), noise_multiplier=SIGMA,
                      max_grad_norm=CLIP, expected_batch_size=B)
    for idx in _batches(epochs, len(X)):
        opt.zero_grad()
        nn.functional.cross_entropy(module(X[idx]), y[idx]).backward()
        opt.step()
    return epochs * (len(X) // B)


def opacus_privacy_engine(X, y, epochs):
    from opacus import PrivacyEngine

    module = _module()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, y), batch_size=B,
                                         shuffle=True)
    module, opt, loader = PrivacyEngine().make_private(
        module=module, optimizer=torch.optim.SGD(module.parameters(), lr=LR),
        data_loader=loader, noise_multiplier=SIGMA, max_grad_norm=CLIP, poisson_sampling=False)
    for _ in range(epochs):
        for xb, yb in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(module(xb), yb).backward()
            opt.step()
    return epochs * (len(X) // B)


def ours(K, device="cpu"):
    model = dpsgd.ModelSpec("fnn", D, hidden=H)

    def run(X, y, epochs):
        cfg = dpsgd.DPSGDConfig(epochs=epochs, batch_size=B, lr=LR, clip=CLIP,
                                noise_multiplier=SIGMA)
        dpsgd.train(X, y, model, cfg, list(range(K)), device=device)
        _sync(device)
        return K * cfg.steps(len(X))
    return run


def wide(jag, cells, K, device="cpu", precision="fp32"):
    """The real training of a group: its cells as columns of one call of K seeds, with
    float32 matmuls of ``precision`` (dpsgd.matmul_precision)."""
    model = dpsgd.ModelSpec("fnn", D, hidden=H)
    init = dpsgd.init_params(model, 1, [0], device="cpu")

    def run(X, y, epochs):
        cfgs = group_cells(jag, cells, epochs)
        fixed = init if any(c.init == "fixed" for c in cfgs) else None
        with dpsgd.matmul_precision(precision):
            dpsgd.train(X, y, model, cfgs, list(range(K)), init=fixed, device=device)
        _sync(device)
        return K * len(cfgs) * cfgs[0].steps(len(X))
    return run


def sized_k(jag, cells, device, n, jobs=1):
    """The seeds per call run_group takes for a group of ``cells`` on ``n`` examples (a
    side's trials at most)."""
    cfg = group_cells(jag, cells, jag["datasets"]["fmnist"]["epochs"])[0]
    return dpsgd.seeds_per_call(dpsgd.ModelSpec("fnn", D, hidden=H), n, cfg, len(cells),
                                device, limit=jag["trials"], jobs_per_gpu=jobs)


def k_sizing(jag, named, X, y, device, epochs, repeats):
    """Model-steps/s of each group of ``named`` ({name: (cells, [K, ...])}) at each K."""
    fns = {(name, K): wide(jag, cells, K, device) for name, (cells, ks) in named.items()
           for K in ks}
    got = rates(fns, X, y, epochs, repeats)
    where = _where(device)
    for name, (cells, ks) in named.items():
        line = ", ".join(f"K={K} {got[name, K]:.0f}" for K in ks)
        print(f"K sizing ({where}, {len(cells)} cells, {epochs} epochs): {line} model-steps/s"
              f" ({got[name, ks[-1]] / got[name, ks[0]]:.2f}x from K={ks[0]} to K={ks[-1]})")
    return got


def worker(spec: dict) -> None:
    """One of several jobs at once (``--worker``): warm up, say "ready", wait for a line on
    stdin, train ``rounds`` calls, print its start, end (wall clock) and model-steps."""
    torch.set_num_threads(spec["threads"])
    cells = [tuple(c) for c in spec["cells"]]
    X, y, _ = load_data(spec["n"])
    run = wide(spec["jag"], cells, spec["K"], spec["device"])
    run(X, y, 1)
    print("ready", flush=True)
    sys.stdin.readline()
    t0 = time.time()
    steps = sum(run(X, y, spec["epochs"]) for _ in range(spec["rounds"]))
    print(json.dumps({"t0": t0, "t1": time.time(), "steps": steps}), flush=True)


def several_jobs(jag, cells, device, counts, epochs, rounds, n):
    """Model-steps/s of P processes training a group of ``cells`` on ``n`` examples at
    once, for P in ``counts`` (each P: the K a job takes when P share a GPU; on the CPU,
    its cores split between the jobs), against one alone. Returns {P: aggregate speed-up}."""
    _empty_cache(device)
    where = _where(device)
    speedup, alone = {}, None
    for P in counts:
        spec = {"jag": jag, "cells": cells, "device": device, "epochs": epochs, "n": n,
                "rounds": rounds, "K": sized_k(jag, cells, device, n, P),
                "threads": max(1, torch.get_num_threads() // P) if device == "cpu" else 2}
        procs = [subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(spec)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                 for _ in range(P)]
        for proc in procs:
            assert proc.stdout.readline().strip() == "ready"
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        done = [json.loads(proc.stdout.readline()) for proc in procs]
        for proc in procs:
            proc.wait()
        together = sum(d["steps"] for d in done) / (max(d["t1"] for d in done)
                                                     - min(d["t0"] for d in done))
        alone = alone or together
        speedup[P] = together / alone
        each = ", ".join(f"{d['steps'] / (d['t1'] - d['t0']):.0f}" for d in done)
        print(f"{P} jobs at once ({where}, {len(cells)} cells, K={spec['K']}, "
              f"{spec['threads']} threads each): {together:.0f} model-steps/s together, "
              f"{speedup[P]:.2f}x one job; each {each}")
    return speedup


def tf32_rates(jag, named, X, y, epochs, repeats):
    """fp32 against TF32 products (CUDA) for each group of ``named`` ({name: cells})."""
    fns = {(name, p): wide(jag, cells, sized_k(jag, cells, "cuda", len(X)), "cuda", p)
           for name, cells in named.items() for p in dpsgd.PRECISIONS}
    got = rates(fns, X, y, epochs, repeats)
    for name, cells in named.items():
        fp32, tf32 = got[name, "fp32"], got[name, "tf32"]
        print(f"TF32 ({_gpu_name()}, {len(cells)} cells, K="
              f"{sized_k(jag, cells, 'cuda', len(X))}): fp32 {fp32:.0f}, tf32 {tf32:.0f} "
              f"model-steps/s ({tf32 / fp32:.2f}x)")
    return {name: got[name, "tf32"] / got[name, "fp32"] for name in named}


def tramer_rate(tramer_cfg, X, y, runs, repeats):
    """Runs per second of the Tramer et al. case study's two subjects (its model on the
    first n_train examples), trained apart (a call each) and as the two columns of one call
    (subjects.train_columns); the default device. Returns the columns' runs/s (both
    subjects counted)."""
    from dpaudit import subjects

    n = tramer_cfg["n_train"]
    spec = {**tramer_cfg["model"], "eps": tramer_cfg["eps"], "delta": tramer_cfg["delta"],
            "n": n + 1}
    Xs, ys, seeds = X[:n + 1], y[:n + 1], list(range(runs))
    fns = [subjects.SUBJECTS[name] for name in tramer_cfg["implementations"]]
    device = "cuda" if gpu_count() else "cpu"  # the default device's kind

    def apart():
        for fn in fns:
            fn(Xs, ys, seeds, spec)(Xs[:1])
        _sync(device)

    def columns():
        subjects.train_columns(fns, Xs, ys, seeds, spec)[0](Xs[:1])
        _sync(device)

    best = {}
    for name, fn in (("apart", apart), ("columns", columns)):
        fn()
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        best[name] = len(fns) * runs / min(times)
    print(f"Tramer case study ({_where(device)}, {runs} runs per call, {len(fns)} subjects): "
          f"apart {best['apart']:.0f} runs/s, as columns {best['columns']:.0f} runs/s "
          f"({best['columns'] / best['apart']:.2f}x)")
    return best["columns"]


def rates(fns, X, y, epochs, repeats):
    """Best model-steps per second of each fn over ``repeats`` rounds (after a warm-up run);
    the fns take turns within a round, so that load from other processes hits them alike."""
    best = {name: 0.0 for name in fns}
    for name, fn in fns.items():
        fn(X, y, 1)
    for _ in range(repeats):
        for name, fn in fns.items():
            t = time.perf_counter()
            steps = fn(X, y, epochs)
            best[name] = max(best[name], steps / (time.perf_counter() - t))
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, nargs="+",
                    default=sorted({torch.get_num_threads(), 2}, reverse=True))
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--repeats", type=int, help="rounds of the CPU rows (default 3; --tiny 1)")
    ap.add_argument("--table2-seeds", type=int, default=2,
                    help="seeds (trials) per wide call of the grids on the CPU")
    ap.add_argument("--config", type=Path, default=ROOT / "config" / "config.yaml",
                    help="config whose grids to time and project (default: the full config)")
    ap.add_argument("--cuda-only", action="store_true",
                    help="time and project only on CUDA (no CPU rows, no Opacus)")
    ap.add_argument("--skip-levers", action="store_true",
                    help="leave out the K sizing, several-jobs, TF32 and Tramer lines")
    ap.add_argument("--tiny", action="store_true",
                    help=f"every line at a small scale, {TINY.n} examples and --config with "
                         f"TINY_CONFIG over it (a short dry run under {FORCE_GPU_VAR})")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(json.loads(args.worker))
    if args.cuda_only and not gpu_count():
        ap.error(f"--cuda-only: torch sees no CUDA device (set {FORCE_GPU_VAR} to a GPU "
                 "description for a dry run on the CPU: dpaudit.device)")
    warnings.filterwarnings("ignore")
    scale = TINY if args.tiny else Scale()
    args.repeats = args.repeats or (1 if args.tiny else 3)
    cfg = yaml.safe_load(args.config.read_text())
    if args.tiny:
        cfg = merged(cfg, TINY_CONFIG)
    jag = cfg["jagielski"]
    one = cfg["onerun"] if cfg["onerun"]["compare_many_model"] else None
    grid = groups(grid_cells(jag, one)["all"])
    table2 = grid[(jag["table2"]["dataset"], jag["table2"]["arch"], "clipbkd")]
    fig2 = min(grid.values(), key=len)
    X, y, source = load_data(scale.n)
    print(f"data: {source} n={len(X)} d={D}; fnn 784-32-2, batch {B}, {args.epochs} epochs x "
          f"{len(X) // B} steps; torch {torch.__version__}; best of {args.repeats}")
    speeds = {}
    try:
        import opacus  # noqa: F401
        baselines = {"Opacus GradSampleModule+DPOptimizer": opacus_index_batches,
                     "Opacus PrivacyEngine+DataLoader": opacus_privacy_engine}
    except ImportError:
        print("opacus is not installed: no Opacus rows")
        baselines = {}
    for threads in [] if args.cuda_only else args.threads:
        torch.set_num_threads(threads)
        fns = {"plain SGD (nn.Module)": plain_sgd, **baselines,
               "dpaudit one cell, K=32": ours(32),
               f"dpaudit Figure 2 group ({len(fig2)} cells)": wide(jag, fig2,
                                                                   args.table2_seeds * 6),
               f"dpaudit Table 2 group ({len(table2)} cells)": wide(jag, table2,
                                                                    args.table2_seeds)}
        rows = rates(fns, X, y, args.epochs, args.repeats)
        plain = rows["plain SGD (nn.Module)"]
        opacus = max((rows[name] for name in baselines), default=None)
        print(f"\nCPU, {threads} threads: model-steps/s ("
              + ("x faster than the faster Opacus; " if opacus else "") + "x plain SGD's speed)")
        for name, r in rows.items():
            vs = f"{r / opacus:6.2f}x Opacus   " if opacus else ""
            print(f"  {name:40s} {r:9.1f}   {vs}{r / plain:5.2f}x plain")
        t2 = rows[f"dpaudit Table 2 group ({len(table2)} cells)"]
        print(f"table2 grid: {t2:.0f} model-steps/s, {t2 / plain:.1f} x plain SGD"
              + (f", {t2 / opacus:.1f} x Opacus" if opacus else ""))
        for m, name in ((1, "dpaudit one cell, K=32"),
                        (len(fig2), f"dpaudit Figure 2 group ({len(fig2)} cells)"),
                        (len(table2), f"dpaudit Table 2 group ({len(table2)} cells)")):
            speeds[m] = max(speeds.get(m, 0.0), rows[name])
    if speeds:
        project(grid, jag, "CPU (2 cores)" if torch.get_num_threads() <= 2 else "CPU", speeds)
    if not args.cuda_only and not args.skip_levers:
        torch.set_num_threads(max(args.threads))
        print()
        fig2_ks, table2_ks = scale.cpu_ks
        k_sizing(jag, {"fig2": (fig2, list(fig2_ks)), "table2": (table2, list(table2_ks))},
                 X, y, "cpu", args.epochs, args.repeats)
        several_jobs(jag, fig2, "cpu", [1, 2], args.epochs, 2, len(X))
        tramer_rate(cfg["tramer"], X, y, scale.tramer_runs, args.repeats)
    if gpu_count():
        cuda(args, cfg, scale, grid, fig2, table2, X, y)


def cuda(args, cfg, scale, grid, fig2, table2, X, y):
    """The CUDA lines at ``scale``: each group at the K a workflow job takes (with its
    memory), K sizing, several jobs on the card, TF32, the Tramer et al. audit's subjects,
    and the projections of the paper-scale run."""
    jag, jobs, n, epochs = cfg["jagielski"], cfg["jobs_per_gpu"], len(X), scale.cuda_epochs
    name = _gpu_name()
    cuda_speeds = {}
    model = dpsgd.ModelSpec("fnn", D, hidden=H)
    for cells in (fig2, table2):
        cfgs = group_cells(jag, cells, epochs)
        K = sized_k(jag, cells, "cuda", n, jobs)
        run = wide(jag, cells, K, "cuda")
        run(X, y, 1)  # CUDA warm-up
        start = _peak_start()
        t = time.perf_counter()
        steps = run(X, y, epochs)
        cuda_speeds[len(cells)] = steps / (time.perf_counter() - t)
        est = K * dpsgd.step_bytes(model, n, cfgs[0], len(cells))
        print(f"\n{name}: {len(cells)} cells x K={K} seeds ({jobs} jobs per GPU), {epochs} "
              f"epochs: {cuda_speeds[len(cells)]:.0f} model-steps/s "
              f"({cuda_speeds[len(cells)] / cfgs[0].steps(n):.1f} models/s); memory: "
              f"estimated {est / 2**20:.0f} MiB, measured peak {_peak_since(start)}")
        del run
        _empty_cache("cuda")
    print(f"table2 grid (CUDA): {cuda_speeds[len(table2)]:.0f} model-steps/s")
    project(grid, jag, name, cuda_speeds)
    if args.skip_levers:
        return
    print()
    # The K a job takes alone and with jobs_per_gpu jobs on its card, by group name (a
    # group's cells, a list, cannot key a dict).
    named = {"fig2": fig2, "table2": table2}
    sized = {g: {sized_k(jag, cells, "cuda", n, j) for j in (1, jobs)}
             for g, cells in named.items()}
    fig2_ks, table2_ks = scale.cuda_ks
    attempt("K sizing", k_sizing, jag, {"fig2": (fig2, sorted({*fig2_ks, *sized["fig2"]})),
                                        "table2": (table2, sorted({*table2_ks,
                                                                   *sized["table2"]}))},
            X, y, "cuda", scale.lever_epochs, scale.lever_repeats)
    speedup = attempt("jobs at once", several_jobs, jag, fig2, "cuda",
                      sorted({*scale.cuda_jobs, jobs}), scale.lever_epochs, 3, n)
    tf32 = attempt("TF32", tf32_rates, jag, named, X, y, scale.lever_epochs,
                   scale.lever_repeats)
    tramer = attempt("Tramer", tramer_rate, cfg["tramer"], X, y, cfg["tramer"]["batch_runs"],
                     scale.lever_repeats)
    if speedup and tramer:
        factors = {"fp32": {len(fig2): 1.0, len(table2): 1.0}}
        if tf32:
            factors["tf32"] = {len(fig2): tf32["fig2"], len(table2): tf32["table2"]}
        for label, factor in factors.items():
            project_run(grid, jag, cfg["tramer"], f"{name}, {label}",
                        {m: v * factor[m] for m, v in cuda_speeds.items()}, speedup, tramer,
                        jobs)


def attempt(what, fn, *args):
    """``fn(*args)``, or None after printing why it failed: a GPU session's time is short,
    and one failing line should not cost the others."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 (any failure: report it, measure the rest)
        print(f"{what}: failed: {type(exc).__name__}: {exc}")
        return None


def project(grid: dict, jag: dict, device: str, speeds: dict) -> None:
    """Projected wall time of every training group of the config at the measured
    model-steps/s of a group of as many cells (the largest measured size not above it)."""
    steps = dpsgd.DPSGDConfig(epochs=24, batch_size=B, lr=LR, clip=CLIP,
                              noise_multiplier=SIGMA).steps(N)
    total_h, models = 0.0, 0
    for (dataset, arch, attack), cells in grid.items():
        n = len(cells) * jag["trials"] * (2 if attack == "mi" else 1 + len(jag["ks"]))
        speed = speeds[max(m for m in speeds if m <= len(cells))]
        total_h += n * steps / speed / 3600
        models += n
    print(f"\nProjection on {device}: Figure 2 + Table 2, {len(grid)} jobs, {models} models: "
          f"{total_h:.1f} h")


#: Measured in the paper-scale run on one H100 (reference/README.md, its snakemake logs),
#: outside the training jobs: before the first (data 15 s, FMNIST task 14 s, fixed init
#: 8 s), CIFAR-10's task with its pretraining (59 s, beside FMNIST's training), and after
#: the last (Figure 2's and Table 2's audit tables, 126 s side by side, then plots 14 s).
HEAD_S, CIFAR_TASK_S, TAIL_S = 37, 59, 140


def makespan(alone_s: list[float], jobs: int, speedup: dict) -> float:
    """Wall time of jobs that take ``alone_s`` seconds each alone, longest first, at most
    ``jobs`` at once, k running together moving ``speedup[k]`` times as fast in total as
    one alone (the largest measured k' <= k for an unmeasured k; 1 for one)."""
    def total(k):
        return max([1.0] + [v for m, v in speedup.items() if m <= k])
    left, queue, now = [], sorted(alone_s, reverse=True), 0.0
    while queue or left:
        while queue and len(left) < jobs:
            left.append(queue.pop(0))
        rate = total(len(left)) / len(left)  # alone-seconds done per second, each job
        step = min(left) / rate
        now += step
        left = [t - step * rate for t in left if t - step * rate > 1e-9]
    return now


def project_run(grid, jag, tramer_cfg, device, speeds, speedup, tramer_runs_s, jobs):
    """Projected wall time of the whole paper-scale run on one GPU: each training job's
    time alone from the measured speeds (Jagielski groups as in :func:`project`; Tramer et
    al.'s audit, every run of both subjects, at the measured runs/s as columns; CIFAR-10's
    task as measured), ``jobs`` at once at the measured speed-ups of several jobs, between
    the reference run's measured head and tail."""
    steps = dpsgd.DPSGDConfig(epochs=24, batch_size=B, lr=LR, clip=CLIP,
                              noise_multiplier=SIGMA).steps(N)
    alone = [CIFAR_TASK_S]
    for (dataset, arch, attack), cells in grid.items():
        n = len(cells) * jag["trials"] * (2 if attack == "mi" else 1 + len(jag["ks"]))
        alone.append(n * steps / speeds[max(m for m in speeds if m <= len(cells))])
    runs = 2 * len(tramer_cfg["implementations"]) * (tramer_cfg["runs"] + tramer_cfg["val_runs"])
    alone.append(runs / tramer_runs_s)
    one, many = makespan(alone, 1, {}), makespan(alone, jobs, speedup)
    print(f"Projection of the whole run on {device}: training jobs {one:.0f} s one at a time,"
          f" {many:.0f} s {jobs} at once (the longest alone: {max(alone):.0f} s); with the "
          f"reference run's {HEAD_S} s before and {TAIL_S} s after: "
          f"{(HEAD_S + many + TAIL_S) / 60:.1f} min")


if __name__ == "__main__":
    main()
