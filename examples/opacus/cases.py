"""Three Opacus DP-SGD trainings of logistic regression on Fashion-MNIST classes 0/1 (n =
500 rows, batch 100, 20 epochs: q = 0.2, T = 100 steps, clip 1, lr 0.5, Opacus' noise
multiplier for (1, 1e-5) by its default accountant "prv"), as ``dpaudit audit-impl``
training functions (``--train cases:correct``, with this folder on PYTHONPATH):

- ``correct``: Opacus as documented (``make_private``'s Poisson sampling);
- ``shuffled``: ``poisson_sampling=False`` with a shuffled DataLoader, while Opacus still
  reports the Poisson epsilon;
- ``noise_on_mean``: a DPOptimizer that adds the noise after averaging, so its std is
  sigma C / B on the clipped sum instead of sigma C: the bug Tramer et al. 2022 found in
  Backpropagation Clipping ("noise calibrated to the batch mean").
"""

import torch
from torch import nn

from dpaudit.adapters.opacus import OpacusTrainer, Target, require_opacus

# Through the adapter: without Opacus, an ImportError that says how to install it.
DPOptimizer = require_opacus().optimizers.DPOptimizer

N, BATCH, EPOCHS, CLIP, LR, EPS, DELTA = 500, 100, 20, 1.0, 0.5, 1.0, 1e-5


class NoiseOnTheMean(DPOptimizer):
    """The bug: the noise of std sigma C is added to the averaged gradient."""

    def add_noise(self):
        super().add_noise()
        for p in self.params:  # p.grad = clipped sum + noise: shrink the noise by B
            p.grad = p.summed_grad + (p.grad - p.summed_grad) / self.expected_batch_size


def _trainer(**kw) -> OpacusTrainer:
    return OpacusTrainer(lambda: nn.Linear(784, 2), lambda p: torch.optim.SGD(p, lr=LR),
                         max_grad_norm=CLIP, batch_size=BATCH, epochs=EPOCHS, n=N, **kw)


correct = _trainer(target=Target(EPS, DELTA))
# The same noise multiplier (Opacus' rate for the shuffled loader is 1 / 5 as well).
shuffled = _trainer(noise_multiplier=correct.noise_multiplier, poisson_sampling=False)
noise_on_mean = _trainer(noise_multiplier=correct.noise_multiplier,
                         optimizer_class=NoiseOnTheMean)
