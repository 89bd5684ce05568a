"""Users' own Opacus loops in the contract of ``dpaudit audit-impl --opacus-loop``
(``train(X, y, seed) -> (model, reported_eps)``, tests/test_opacus_loop.py): small and
fast, the RDP accountant, a claim near 1 at n = 20 rows of 10 features."""

from __future__ import annotations

import functools
import os
import warnings

import torch
from opacus import PrivacyEngine
from opacus.accountants import RDPAccountant
from torch import nn

DELTA, B, EPOCHS, SIGMA, CLIP, LR = 1e-5, 5, 2, 3.0, 1.0, 0.5

warnings.filterwarnings("ignore", message=".*[Ff]ull backward hook")
warnings.filterwarnings("ignore", message=".*[Ss]ecure RNG")


def _loop(X, y, seed, sigma=SIGMA, **private):
    torch.manual_seed(seed)
    model = nn.Linear(X.shape[1], 2)
    engine = PrivacyEngine(accountant="rdp")
    model, opt, dl = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=LR),
        data_loader=torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, y),
                                                batch_size=B, shuffle=True),
        noise_multiplier=sigma, max_grad_norm=CLIP, **private)
    for _ in range(EPOCHS):
        for xb, yb in dl:
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
    return model, _eps(tuple(engine.accountant.history))


@functools.lru_cache(maxsize=None)
def _eps(history) -> float:
    """Opacus' RDP eps of an accountant's history (seconds each: kept per history, as a
    user who reports it for every run would)."""
    acc = RDPAccountant()
    acc.history = list(history)
    return acc.get_epsilon(DELTA)


def correct(X, y, seed):
    """The make_private loop of Opacus' tutorials, with its RDP accountant's eps."""
    return _loop(X, y, seed)


def shuffled(X, y, seed):
    """make_private(poisson_sampling=False): Opacus keeps the shuffled DataLoader."""
    return _loop(X, y, seed, poisson_sampling=False)


def tiny_noise(X, y, seed):
    """Noise divided by a hundred, the eps of the declared noise reported."""
    model, _ = _loop(X, y, seed, sigma=SIGMA / 100)
    batches = -(-len(X) // B)
    return model, _eps(((SIGMA, 1 / batches, EPOCHS * batches),))


def exits(X, y, seed):
    """Ends its process, as no training function may."""
    os._exit(3)


def no_step(X, y, seed):
    """Returns a model without a DPOptimizer step."""
    return nn.Linear(X.shape[1], 2), 1.0


def zero_eps(X, y, seed):
    """Reports eps 0."""
    return correct(X, y, seed)[0], 0.0


def deep(X, y, seed):
    """A module of two hidden layers: none of the tight modes' layouts."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(X.shape[1], 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU(),
                          nn.Linear(4, 2))
    engine = PrivacyEngine(accountant="rdp")
    model, opt, dl = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=LR),
        data_loader=torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, y),
                                                batch_size=B), noise_multiplier=SIGMA,
        max_grad_norm=CLIP)
    for xb, yb in dl:
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
    return model, _eps(tuple(engine.accountant.history))


def one_batch(X, y, seed, lr=1.0, clip=2.0):
    """A full batch of the shuffled loader, two epochs (two steps), no noise: each step is
    lr / len(X) times the clipped sum."""
    torch.manual_seed(seed)
    model = nn.Linear(X.shape[1], 2)
    engine = PrivacyEngine(accountant="rdp")
    model, opt, dl = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=lr),
        data_loader=torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, y),
                                                batch_size=len(X), shuffle=True),
        noise_multiplier=0.0, max_grad_norm=clip, poisson_sampling=False)
    for _ in range(2):
        for xb, yb in dl:
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
    return model, 1.0


def frozen(X, y, seed):
    """lr 0: the model stays where Opacus wrapped it."""
    return one_batch(X, y, seed, lr=0.0)
