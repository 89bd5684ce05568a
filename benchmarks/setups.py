"""What the benchmarks share: the FMNIST 0/1 data of Jagielski et al.'s 2-layer set-up and
the configs of a Jagielski group's cells. Imports only what every dpaudit version has, so
that benchmarks/bench_step.py can time an older checkout with it."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import torch

FMNIST = Path("/usr/share/datasets/fashion-mnist")
N, D, H, B, LR, CLIP, SIGMA = 6000, 784, 32, 250, 0.15, 1.0, 1.01


def load_data(n: int = N):
    """``n`` seeded FMNIST images of classes 0/1 (``N``: a random half, as make_new.py), or
    random data of that shape."""
    try:
        with gzip.open(FMNIST / "train-images-idx3-ubyte.gz") as f:
            x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, D)
        with gzip.open(FMNIST / "train-labels-idx1-ubyte.gz") as f:
            y = np.frombuffer(f.read(), np.uint8, offset=8)
        keep = np.flatnonzero(y < 2)
        keep = keep[np.random.default_rng(0).choice(len(keep), n, replace=False)]
        return (torch.tensor(x[keep] / 255.0, dtype=torch.float32),
                torch.tensor(y[keep].astype(np.int64)), "FMNIST 0/1")
    except FileNotFoundError:
        g = torch.Generator().manual_seed(0)
        return torch.rand(n, D, generator=g), torch.randint(0, 2, (n,), generator=g), "random"


def group_cells(jag, cells, epochs):
    """The DPSGDConfigs of a group's cells (clip, init label, eps label), FMNIST set-up."""
    from dpaudit import dpsgd

    noise = jag["datasets"]["fmnist"]["noise"]
    out = []
    for clip, init, eps in cells:
        kw = dict(epochs=epochs, batch_size=B, lr=LR, clip=clip, noise_multiplier=noise[eps])
        out.append(dpsgd.DPSGDConfig(**kw, init="fixed") if init == "fixed" else
                   dpsgd.DPSGDConfig(**kw, init_scale=float(init[1:])))
    return out
