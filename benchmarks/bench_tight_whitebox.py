"""Speed of the white-box multi-run audit (Nasr et al. 2023): models per second of
:func:`dpaudit.experiments.tight.whitebox.whitebox_scores`, both sides' runs trained as
the columns-of-seeds of one wide DP-SGD call with the Dirac gradient canary and its
per-step scores.

The FMNIST 2-layer setup of Jagielski et al. (2020) (classes 0/1, n = 6000, 784 -> 32 ReLU
-> 2, batch 250, lr 0.15, clip 1, Poisson batches, noise multiplier 2.68), or random data of
that shape where FMNIST is not installed, for --epochs epochs at each K of --per-call
(models per call, half of them per side). Prints per K the line

  K=N: M models/s (E epochs), projected P models/s at 24 epochs

where the projection divides by 24 / E (the cost is linear in the steps). The audit's own
bounds cost milliseconds. On 2 CPU cores shared with other jobs (load average ~16), FMNIST,
1 epoch: K=32 1.90 models/s (0.079 projected at 24 epochs), K=128 4.21 (0.175); the whole
FMNIST audit of 200 runs per side at 24 epochs, K=200, took 1282 s (0.31 models/s, the load
falling during the run). Rerun on an idle machine before comparing.

    python benchmarks/bench_tight_whitebox.py [--threads 2] [--epochs 2] [--per-call 32 128]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from dpaudit import dpsgd, trials
from dpaudit.experiments.tight import whitebox

sys.path.insert(0, str(Path(__file__).resolve().parent))
from setups import load_data  # noqa: E402  (the FMNIST 0/1 half, or random data)

EPOCHS_FULL, B, LR, CLIP, SIGMA, H = 24, 250, 0.15, 1.0, 2.68, 32


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--per-call", type=int, nargs="+", default=[32, 128])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    X, y, source = load_data()
    model = dpsgd.ModelSpec("fnn", X.shape[1], H)
    cfg = dpsgd.DPSGDConfig(args.epochs, B, LR, CLIP, SIGMA, "poisson")
    print(f"{source}: n={len(X)}, {cfg.steps(len(X))} steps, {args.threads} threads")
    for K in args.per_call:
        start = time.perf_counter()
        whitebox.whitebox_scores(X, y, model, cfg, K // 2, 0,
                                 execution=trials.Execution("cpu", K))
        rate = 2 * (K // 2) / (time.perf_counter() - start)
        print(f"K={K}: {rate:.2f} models/s ({args.epochs} epochs), projected "
              f"{rate * args.epochs / EPOCHS_FULL:.3f} models/s at {EPOCHS_FULL} epochs",
              flush=True)


if __name__ == "__main__":
    main()
