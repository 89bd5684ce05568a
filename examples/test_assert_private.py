"""A privacy test in a project's own test suite: `dpaudit.testing.assert_private` audits a
DP-SGD training function against the (eps, delta) it claims, and fails the test on a
certified violation. Run it with `python -m pytest examples/test_assert_private.py`.

Both functions below are a full-batch DP-SGD of a softmax regression, their noise
multiplier calibrated to the claim by dpaudit's accountant; the broken one divides the
noise by the batch size (the Backpropagation-Clipping bug of Tramer et al. 2022's case
study), so it is far less private than it claims and the audit says so within a few
dozen runs. Settings are tiny so that the file runs in seconds; a real privacy test
would use the defaults (more runs, a smaller alpha) and the data the code trains on.
"""

import pytest
import torch

from dpaudit import accounting
from dpaudit.testing import Options, assert_private

EPS, DELTA = 1.0, 1e-5
SPEC = {"epochs": 4, "lr": 2000.0, "clip": 0.01}
#: cheap settings: at most 40 evaluation runs per side, 20 validation runs, 95% confidence
CHEAP = {"runs": 40, "alpha": 0.05, "budget_s": 60, "seed": 3, "options": Options(val_runs=20)}


def _data(n=100, informative=4, blank=12):
    g = torch.Generator().manual_seed(2)
    y = torch.arange(n) % 2
    X = torch.randn(n, informative, generator=g) + 1.5 * (2 * y[:, None] - 1) / informative**0.5
    return torch.cat([X, torch.zeros(n, blank)], 1), y


def dp_sgd(X, y, seeds, spec, noise_divisor=1.0):
    """One model per seed (all of its randomness from its seed): full batches (q = 1),
    per-example gradients clipped to `clip`, Gaussian noise of std sigma * clip on their
    sum, sigma calibrated to (EPS, DELTA) over `epochs` steps."""
    steps, clip, classes = spec["epochs"], spec["clip"], int(y.max()) + 1
    sigma = accounting.noise_multiplier(EPS, 1.0, steps, DELTA, "rdp")
    onehot = torch.nn.functional.one_hot(y, classes).double()
    Xd, weights = X.double(), []
    for seed in seeds:
        gen = torch.Generator().manual_seed(int(seed))
        w = torch.zeros(X.shape[1], classes, dtype=torch.float64)
        for _ in range(steps):
            p = torch.softmax(Xd @ w, dim=1)
            grads = Xd[:, :, None] * (p - onehot)[:, None, :]  # per example (n, d, C)
            norms = grads.flatten(1).norm(dim=1).clamp_min(1e-12)
            clipped = grads * (clip / norms).clamp(max=1.0)[:, None, None]
            noise = torch.randn(w.shape, generator=gen, dtype=torch.float64) * sigma * clip
            w = w - spec["lr"] * (clipped.sum(0) + noise / noise_divisor) / len(X)
        weights.append(w)
    W = torch.stack(weights)

    def predict(x):
        return torch.einsum("nd,rdc->rnc", torch.as_tensor(x).double(), W).float()

    return predict


def broken_dp_sgd(X, y, seeds, spec):
    """The noise divided by the batch size: the claim no longer holds."""
    return dp_sgd(X, y, seeds, spec, noise_divisor=len(X))


def test_dp_sgd_is_not_caught_violating_its_claim():
    X, y = _data()
    check = assert_private(dp_sgd, EPS, DELTA, SPEC, X, y, **CHEAP)
    assert "not a proof" in check.message  # passing is only "no violation detected"


def test_broken_dp_sgd_is_caught():
    X, y = _data()
    with pytest.raises(AssertionError, match="certified eps_LB"):
        assert_private(broken_dp_sgd, EPS, DELTA, SPEC, X, y, **CHEAP)
