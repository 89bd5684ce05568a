"""Speed of the worst-case-init black-box audit (Annamalai and De Cristofaro 2024) on the
wide trainer, in models per second (one full DP-SGD training of one model).

The paper's logistic-regression setting on FMNIST classes 0/1 (a random half, as
``benchmarks/bench_dpsgd.py``): the 1,000 audited rows after the 3,000 pre-training rows,
100 full-batch steps, step size 1e-4 on the clipped sum, clip 1, noise multiplier 5
(eps 10 at delta 1e-5 by PLD). For each seeds-per-call K of ``--ks``, one call of K seeds
trains the worst-case init alone, then both inits (worst case and Glorot) as columns; the
line per K

  K=16: worst-case alone N models/s, both inits as columns M models/s

counts every column's model. Random data of that shape where FMNIST is not installed.

    python benchmarks/bench_tight_blackbox.py [--threads 2] [--ks 8 16 32] [--arch lr]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from dpaudit import dpsgd
from dpaudit.experiments import jagielski
from dpaudit.experiments.tight import blackbox

sys.path.insert(0, str(Path(__file__).resolve().parent))
from setups import load_data  # noqa: E402  (the FMNIST 0/1 images, or random data)

N_AUX, N, D, STEPS, LR, CLIP, SIGMA = 3000, 1000, 784, 100, 1e-4, 1.0, 5.0


def load_task() -> tuple[jagielski.Task, str]:
    """FMNIST classes 0/1, a seeded random order (only X and y are used), or random data."""
    X, y, source = load_data(N_AUX + N)
    X, y = X.numpy(), y.numpy()
    empty = np.zeros((0, D), np.float32)
    none = np.zeros(0, np.int64)
    return jagielski.Task(X, y, empty, none, empty, none, empty, none,
                          np.zeros(D, np.float32), 0), source


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ks", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--arch", choices=dpsgd.ARCHS, default="lr")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    task, source = load_task()
    model = dpsgd.ModelSpec(args.arch, D, 32)
    setting = blackbox.FullBatch(STEPS, LR, CLIP, SIGMA)
    start = blackbox.worst_case_init(task, model, 0, N_AUX, device="cpu")
    x_c, y_c = blackbox.canary(task, model, start)
    _, (X, y) = blackbox.split(task, N_AUX, N)
    print(f"{source}, {args.arch}, n={N}, {STEPS} full-batch steps, {args.threads} threads")
    for K in args.ks:
        speeds = []
        for inits in (("worst-case",), blackbox.INITS):
            t0 = time.perf_counter()
            blackbox.train_scores(X, y, model, setting, inits, start, x_c, y_c,
                                  list(range(K)), K, "cpu")
            speeds.append(K * len(inits) / (time.perf_counter() - t0))
        print(f"K={K}: worst-case alone {speeds[0]:.2f} models/s, both inits as columns "
              f"{speeds[1]:.2f} models/s", flush=True)


if __name__ == "__main__":
    main()
