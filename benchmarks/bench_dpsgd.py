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
of 24 epochs: CIFAR heads train on 1024-d features for 20 epochs of 20 steps, about as
costly), on the CPU and on CUDA when present (with the seeds per call that
dpsgd.seeds_per_call picks there, and the estimated bytes per seed against the measured peak).
--cuda-only skips the CPU timings (a GPU session's device time is short).

    python benchmarks/bench_dpsgd.py [--threads 2] [--epochs 1] [--table2-seeds 2] [--cuda-only]
"""

from __future__ import annotations

import argparse
import gzip
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

import yaml

from dpaudit import dpsgd
from dpaudit.experiments.jagielski import grid_cells, groups

ROOT = Path(__file__).resolve().parents[1]

FMNIST = Path("/usr/share/datasets/fashion-mnist")
N, D, H, B, LR, CLIP, SIGMA = 6000, 784, 32, 250, 0.15, 1.0, 1.01


def load_data():
    """FMNIST classes 0/1, a random half (as make_new.py), or random data of that shape."""
    try:
        with gzip.open(FMNIST / "train-images-idx3-ubyte.gz") as f:
            x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, D)
        with gzip.open(FMNIST / "train-labels-idx1-ubyte.gz") as f:
            y = np.frombuffer(f.read(), np.uint8, offset=8)
        keep = np.flatnonzero(y < 2)
        keep = keep[np.random.default_rng(0).choice(len(keep), N, replace=False)]
        return (torch.tensor(x[keep] / 255.0, dtype=torch.float32),
                torch.tensor(y[keep].astype(np.int64)), "FMNIST 0/1")
    except FileNotFoundError:
        g = torch.Generator().manual_seed(0)
        return torch.rand(N, D, generator=g), torch.randint(0, 2, (N,), generator=g), "random"


def _module():
    return nn.Sequential(nn.Linear(D, H), nn.ReLU(), nn.Linear(H, 2))


def _batches(epochs, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [idx for _ in range(epochs) for idx in torch.randperm(N, generator=g).split(B)]


def plain_sgd(X, y, epochs):
    module = _module()
    opt = torch.optim.SGD(module.parameters(), lr=LR)
    for idx in _batches(epochs):
        opt.zero_grad()
        nn.functional.cross_entropy(module(X[idx]), y[idx]).backward()
        opt.step()
    return epochs * (N // B)


def opacus_index_batches(X, y, epochs):
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    module = GradSampleModule(_module())
    opt = DPOptimizer(torch.optim.SGD(module.parameters(), lr=LR), noise_multiplier=SIGMA,
                      max_grad_norm=CLIP, expected_batch_size=B)
    for idx in _batches(epochs):
        opt.zero_grad()
        nn.functional.cross_entropy(module(X[idx]), y[idx]).backward()
        opt.step()
    return epochs * (N // B)


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
    return epochs * (N // B)


def ours(K, device="cpu"):
    model = dpsgd.ModelSpec("fnn", D, hidden=H)

    def run(X, y, epochs):
        cfg = dpsgd.DPSGDConfig(epochs=epochs, batch_size=B, lr=LR, clip=CLIP,
                                noise_multiplier=SIGMA)
        dpsgd.train(X, y, model, cfg, list(range(K)), device=device)
        if device != "cpu":
            torch.cuda.synchronize()
        return K * cfg.steps(N)
    return run


def group_cells(jag, cells, epochs):
    """The DPSGDConfigs of a group's cells (clip, init label, eps label), FMNIST set-up."""
    noise = jag["datasets"]["fmnist"]["noise"]
    out = []
    for clip, init, eps in cells:
        kw = dict(epochs=epochs, batch_size=B, lr=LR, clip=clip, noise_multiplier=noise[eps])
        out.append(dpsgd.DPSGDConfig(**kw, init="fixed") if init == "fixed" else
                   dpsgd.DPSGDConfig(**kw, init_scale=float(init[1:])))
    return out


def wide(jag, cells, K, device="cpu"):
    """The real training of a group: its cells as columns of one call of K seeds."""
    model = dpsgd.ModelSpec("fnn", D, hidden=H)
    init = dpsgd.init_params(model, 1, [0], device="cpu")

    def run(X, y, epochs):
        cfgs = group_cells(jag, cells, epochs)
        fixed = init if any(c.init == "fixed" for c in cfgs) else None
        dpsgd.train(X, y, model, cfgs, list(range(K)), init=fixed, device=device)
        if device != "cpu":
            torch.cuda.synchronize()
        return K * len(cfgs) * cfgs[0].steps(N)
    return run


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
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--table2-seeds", type=int, default=2,
                    help="seeds (trials) per wide call of the grids on the CPU")
    ap.add_argument("--config", type=Path, default=ROOT / "config" / "config.yaml",
                    help="config whose grids to time and project (default: the full config)")
    ap.add_argument("--cuda-only", action="store_true",
                    help="time and project only on CUDA (no CPU rows, no Opacus)")
    args = ap.parse_args()
    if args.cuda_only and not torch.cuda.is_available():
        ap.error("--cuda-only: torch sees no CUDA device")
    warnings.filterwarnings("ignore")
    cfg = yaml.safe_load(args.config.read_text())
    jag = cfg["jagielski"]
    one = cfg["onerun"] if cfg["onerun"]["compare_many_model"] else None
    grid = groups(grid_cells(jag, one)["all"])
    table2 = grid[(jag["table2"]["dataset"], jag["table2"]["arch"], "clipbkd")]
    fig2 = min(grid.values(), key=len)
    X, y, source = load_data()
    print(f"data: {source} n={N} d={D}; fnn 784-32-2, batch {B}, {args.epochs} epochs x "
          f"{N // B} steps; torch {torch.__version__}; best of {args.repeats}")
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
    if torch.cuda.is_available():
        cuda_speeds = {}
        model = dpsgd.ModelSpec("fnn", D, hidden=H)
        for cells in (fig2, table2):
            cfgs = group_cells(jag, cells, 24)
            K = dpsgd.seeds_per_call(model, N, cfgs[0], len(cells), "cuda",
                                     limit=jag["block_trials"])
            run = wide(jag, cells, K, "cuda")
            run(X, y, 1)  # CUDA warm-up
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            t = time.perf_counter()
            steps = run(X, y, 24)
            cuda_speeds[len(cells)] = steps / (time.perf_counter() - t)
            peak = torch.cuda.max_memory_allocated() - base
            est = K * dpsgd.step_bytes(model, N, cfgs[0], len(cells))
            print(f"\n{torch.cuda.get_device_name()}: {len(cells)} cells x K={K} seeds, 24 "
                  f"epochs: {cuda_speeds[len(cells)]:.0f} model-steps/s "
                  f"({cuda_speeds[len(cells)] / cfgs[0].steps(N):.1f} models/s); memory: "
                  f"estimated {est / 2**20:.0f} MiB, measured peak {peak / 2**20:.0f} MiB")
        t2 = cuda_speeds[len(table2)]
        print(f"table2 grid (CUDA): {t2:.0f} model-steps/s")
        project(grid, jag, torch.cuda.get_device_name(), cuda_speeds)


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


if __name__ == "__main__":
    main()
