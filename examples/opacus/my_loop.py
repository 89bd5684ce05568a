"""A user's own Opacus training, as the Opacus tutorials write it, and the few lines that
make it auditable by ``dpaudit audit-impl --opacus-loop`` (docs/audit_your_implementation.md,
"Opacus trainings"): ``train(X, y, seed) -> (model, reported_eps)``.

    PYTHONPATH=examples/opacus dpaudit audit-impl --train my_loop:train --opacus-loop \\
        --delta 1e-5 --runs 200 --val-runs 100 --seed 0 --out results/my_loop.csv

``train_model`` is the user's code, unmodified: their DataLoader, their ``make_private``,
their loop, their accountant. dpaudit hands it Fashion-MNIST classes 0/1 (n rows, or n +
1 with the canary) and instruments the Opacus objects it makes.
"""

from __future__ import annotations

import functools
import warnings

import torch
from opacus import PrivacyEngine
from torch import nn

DELTA = 1e-5

warnings.filterwarnings("ignore", message=".*[Ff]ull backward hook")
warnings.filterwarnings("ignore", message=".*[Ss]ecure RNG")


# ---- the user's training, as it is ---------------------------------------------------------

def train_model(X, y, seed, epochs=20, batch_size=100, noise_multiplier=7.734,
                max_grad_norm=1.0, lr=0.5):
    torch.manual_seed(seed)
    model = nn.Linear(X.shape[1], 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    data_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, y),
                                              batch_size=batch_size, shuffle=True)
    engine = PrivacyEngine(accountant="rdp")
    model, optimizer, data_loader = engine.make_private(
        module=model, optimizer=optimizer, data_loader=data_loader,
        noise_multiplier=noise_multiplier, max_grad_norm=max_grad_norm)
    for _ in range(epochs):
        for xb, yb in data_loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            optimizer.step()
    return model, engine


# ---- the wrapper dpaudit calls ---------------------------------------------------------------

def train(X, y, seed):
    """The model and the eps the user's engine reports at DELTA."""
    model, engine = train_model(X, y, seed)
    return model, _epsilon(type(engine.accountant), tuple(engine.accountant.history))


@functools.lru_cache(maxsize=None)
def _epsilon(accountant, history) -> float:
    """The engine's get_epsilon, once per history: the same for every run of a data set's
    size, and seconds each with Opacus' accountants."""
    acc = accountant()
    acc.history = list(history)
    return acc.get_epsilon(DELTA)


if __name__ == "__main__":
    from dpaudit.data import load_fmnist

    X, y = load_fmnist(None, classes=[0, 1])
    model, eps = train(torch.as_tensor(X[:500]), torch.as_tensor(y[:500]), 0)
    print(f"trained on 500 rows; reported eps {eps:.4g} at delta {DELTA:g}")
