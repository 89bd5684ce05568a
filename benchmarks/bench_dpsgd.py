"""Speed of the batched DP-SGD trainer against Opacus and plain SGD.

The FMNIST 2-layer setup of Jagielski et al. (2020): classes 0/1, a random half (n=6000,
d=784), 784 -> 32 ReLU -> 2, batch 250, lr 0.15, clip 1, noise multiplier 1.01. Times, in
model-steps per second (one SGD step of one model):

  (a) dpaudit.dpsgd.train at K=1 and at K models at once (pick_k, or --ks),
  (b) Opacus 1.6 per-sample gradients (hooks, its default): GradSampleModule + DPOptimizer on
      the same index-gathered batches, and PrivacyEngine.make_private with its DataLoader,
  (c) plain non-private SGD (nn.Sequential, torch.optim.SGD, same batches),

at each thread count of --threads (default: the machine's default and 2). Best of --repeats
rounds of --epochs epochs each (methods interleaved). Then the projection a user needs
before starting: models per second of the paper's FMNIST setup (24 epochs) at the K that
pick_k chooses, on the CPU (from the fastest thread count) and on CUDA when present, and
the projected wall time of the config's Jagielski grids (Figure 2, Table 2, both; cells
shared between them train once) and of its Tramer audit, as if every model cost one FMNIST
2-layer model (CIFAR heads train on 1024-d features for 20 epochs of 20 steps: about as
costly; the Tramer models are smaller: an upper estimate), and the start-up of the
Jagielski training jobs (a fresh process importing the trainer, with the CUDA context on
a GPU), paid once per job (one data set, model, clip, init and attack at every eps label).

    python benchmarks/bench_dpsgd.py [--threads 2 1] [--epochs 2] [--ks 1 4 8 16]
"""

from __future__ import annotations

import argparse
import gzip
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

import yaml

from dpaudit import dpsgd
from dpaudit.experiments.jagielski import grid_cells, grid_models, train_jobs

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
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ks", type=int, nargs="*", help="extra K values to time (CPU)")
    ap.add_argument("--config", type=Path, default=ROOT / "config" / "config.yaml",
                    help="config whose grids to project (default: the full config)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    X, y, source = load_data()
    k_cpu = dpsgd.pick_k(dpsgd.ModelSpec("fnn", D, hidden=H), N, "cpu")
    print(f"data: {source} n={N} d={D}; fnn 784-32-2, batch {B}, {args.epochs} epochs x "
          f"{N // B} steps; torch {torch.__version__}; best of {args.repeats}")
    cpu_models_s = 0.0
    steps_24 = dpsgd.DPSGDConfig(epochs=24, batch_size=B, lr=LR, clip=CLIP,
                                 noise_multiplier=SIGMA).steps(N)
    for threads in args.threads:
        torch.set_num_threads(threads)
        fns = {"plain SGD (nn.Module)": plain_sgd,
               "Opacus GradSampleModule+DPOptimizer": opacus_index_batches,
               "Opacus PrivacyEngine+DataLoader": opacus_privacy_engine}
        for K in sorted({1, k_cpu, *(args.ks or [])}):
            fns[f"dpaudit K={K}" + (" (pick_k)" if K == k_cpu else "")] = ours(K)
        rows = rates(fns, X, y, args.epochs, args.repeats)
        plain = rows["plain SGD (nn.Module)"]
        opacus = max(rows["Opacus GradSampleModule+DPOptimizer"],
                     rows["Opacus PrivacyEngine+DataLoader"])
        print(f"\nCPU, {threads} threads: model-steps/s (x faster than the faster Opacus; "
              f"x plain SGD's speed)")
        for name, r in rows.items():
            print(f"  {name:40s} {r:9.1f}   {r / opacus:6.2f}x Opacus   {r / plain:5.2f}x plain")
        cpu_models_s = max(cpu_models_s, rows[f"dpaudit K={k_cpu} (pick_k)"] / steps_24)
    project(args.config, "CPU", cpu_models_s)
    if torch.cuda.is_available():
        model = dpsgd.ModelSpec("fnn", D, hidden=H)
        cfg = dpsgd.DPSGDConfig(epochs=24, batch_size=B, lr=LR, clip=CLIP,
                                noise_multiplier=SIGMA)
        K = dpsgd.pick_k(model, N, "cuda", cfg)
        speeds = []
        for rep in range(2):  # the first run includes CUDA warm-up
            t = time.perf_counter()
            dpsgd.train(X, y, model, cfg, list(range(rep * K, (rep + 1) * K)), device="cuda")
            torch.cuda.synchronize()
            speeds.append(K / (time.perf_counter() - t))
        print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}: the FMNIST setup "
              f"(24 epochs, {cfg.steps(N)} steps) at K={K} (pick_k): {speeds[-1]:.1f} models/s")
        project(args.config, torch.cuda.get_device_name(), speeds[-1])


def job_startup(cuda: bool) -> float:
    """Seconds a training job spends before it trains, best of 3: a fresh Python importing
    the trainer and, on a GPU, creating the CUDA context."""
    code = ("import torch, dpaudit.cli, dpaudit.dpsgd, dpaudit.experiments.jagielski; "
            + ("torch.zeros(1, device='cuda').sum().item()" if cuda else "pass"))
    times = []
    for _ in range(3):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        times.append(time.perf_counter() - t)
    return min(times)


def project(config: Path, device: str, models_s: float) -> None:
    """Projected wall time of the config's grids at ``models_s`` models per second, and
    the start-up of its Jagielski training jobs."""
    cfg = yaml.safe_load(config.read_text())
    one = cfg["onerun"]
    onerun = one if one["compare_many_model"] else None
    models = grid_models(cfg["jagielski"], onerun)
    tr = cfg["tramer"]
    models["tramer"] = 2 * (tr["runs"] + tr["val_runs"]) * len(tr["implementations"])
    print(f"\nProjection on {device} at {models_s:.2f} models/s ({config.name}):")
    for name, n in models.items():
        print(f"  {name:8s} {n:9d} models  {n / models_s / 3600:8.2f} h")
    cells = grid_cells(cfg["jagielski"], onerun)["all"]
    jobs = len(train_jobs(cfg["jagielski"], onerun))
    start = job_startup(device != "CPU")
    print(f"  start-up {jobs} jobs x {start:.1f} s = {jobs * start / 60:.1f} min "
          f"(one job per cell: {len(cells)} x {start:.1f} s = {len(cells) * start / 60:.1f} min)")


if __name__ == "__main__":
    main()
