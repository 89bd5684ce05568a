"""Users' own Opacus training functions, correct and flawed, for ``dpaudit opacus-check``
(tests/test_opacus_probe.py): ``train(X, y, seed) -> (model, reported_eps)`` at delta
:data:`DELTA`, batch size :data:`B`, :data:`EPOCHS` epochs, as a user writes them."""

from __future__ import annotations

import warnings

import torch
from opacus import GradSampleModule, PrivacyEngine
from opacus.accountants import RDPAccountant
from opacus.accountants.utils import get_noise_multiplier
from opacus.data_loader import DPDataLoader
from opacus.optimizers.optimizer import (DPOptimizer, _check_processed_flag,
                                         _generate_noise, _mark_as_processed)
from torch import nn

DELTA, B, EPOCHS, SIGMA, CLIP, LR = 1e-5, 5, 5, 1.0, 1.0, 0.1

warnings.filterwarnings("ignore", message=".*[Ff]ull backward hook")
warnings.filterwarnings("ignore", message=".*[Ss]ecure RNG")


def _setup(X, y, seed, accountant="rdp", **private):
    """make_private on a DataLoader(batch_size=B): (engine, model, optimizer, loader); the
    RDP accountant (seconds faster than Opacus' default PRV) unless ``accountant``."""
    torch.manual_seed(seed)
    model = nn.Linear(X.shape[1], 2)
    engine = PrivacyEngine(accountant=accountant)
    model, opt, dl = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=LR),
        data_loader=torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, y),
                                                batch_size=B, shuffle=True),
        **{"noise_multiplier": SIGMA, "max_grad_norm": CLIP, **private})
    return engine, model, opt, dl


def _epoch(model, opt, dl):
    for xb, yb in dl:
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()


def correct(X, y, seed):
    """The make_private loop of Opacus' tutorials; eps from its engine (PRV, its default)."""
    engine, model, opt, dl = _setup(X, y, seed, accountant="prv")
    for _ in range(EPOCHS):
        _epoch(model, opt, dl)
    return model, engine.get_epsilon(DELTA)


def wrong_rate(X, y, seed):
    """Sigma calibrated to eps 2 for the sample rate of ten times the data (q / 10), the
    target reported: the rate's n taken from a config, not the data."""
    q = 1 / ((len(X) + B - 1) // B)
    sigma = get_noise_multiplier(target_epsilon=2.0, target_delta=DELTA, sample_rate=q / 10,
                                 steps=EPOCHS * int(1 / q), accountant="rdp")
    engine, model, opt, dl = _setup(X, y, seed, noise_multiplier=sigma)
    for _ in range(EPOCHS):
        _epoch(model, opt, dl)
    return model, 2.0


def one_epoch(X, y, seed):
    """Eps read after the first of EPOCHS epochs and reported for the training."""
    engine, model, opt, dl = _setup(X, y, seed)
    eps = None
    for _ in range(EPOCHS):
        _epoch(model, opt, dl)
        eps = engine.get_epsilon(DELTA) if eps is None else eps
    return model, eps


class UnscaledNoise(DPOptimizer):
    """add_noise with std noise_multiplier: not scaled by the clipping norm."""

    def add_noise(self):
        for p in self.params:
            _check_processed_flag(p.summed_grad)
            noise = _generate_noise(std=self.noise_multiplier, reference=p.summed_grad,
                                    generator=self.generator)
            p.grad = (p.summed_grad + noise).view_as(p)
            _mark_as_processed(p.summed_grad)


def unscaled_noise(X, y, seed, clip=4.0):
    """Opacus' low-level API with UnscaledNoise at clip 4: noise multiplier 1 / 4, the
    RDP accountant told 1."""
    torch.manual_seed(seed)
    model = GradSampleModule(nn.Linear(X.shape[1], 2))
    dl = DPDataLoader.from_data_loader(torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(X, y), batch_size=B))
    opt = UnscaledNoise(torch.optim.SGD(model.parameters(), lr=LR), noise_multiplier=SIGMA,
                        max_grad_norm=clip, expected_batch_size=B)
    accountant = RDPAccountant()
    opt.attach_step_hook(accountant.get_optimizer_hook_fn(sample_rate=dl.sample_rate))
    for _ in range(EPOCHS):
        _epoch(model, opt, dl)
    return model, accountant.get_epsilon(DELTA)


def shuffled(X, y, seed):
    """make_private(poisson_sampling=False): shuffled batches of B, Poisson accounting."""
    engine, model, opt, dl = _setup(X, y, seed, poisson_sampling=False)
    for _ in range(EPOCHS):
        _epoch(model, opt, dl)
    return model, engine.get_epsilon(DELTA)


class SampledMean(DPOptimizer):
    """scale_grad over the sampled batch size (ASGM) instead of expected_batch_size."""

    def scale_grad(self):
        rows = len(self.grad_samples[0])
        for p in self.params:
            p.grad /= max(rows, 1)


def sampled_mean(X, y, seed):
    """The correct loop, but the noisy sum divided by the batch actually drawn."""
    torch.manual_seed(seed)
    model = GradSampleModule(nn.Linear(X.shape[1], 2))
    dl = DPDataLoader.from_data_loader(torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(X, y), batch_size=B))
    opt = SampledMean(torch.optim.SGD(model.parameters(), lr=LR), noise_multiplier=SIGMA,
                      max_grad_norm=CLIP, expected_batch_size=B)
    accountant = RDPAccountant()
    opt.attach_step_hook(accountant.get_optimizer_hook_fn(sample_rate=dl.sample_rate))
    for _ in range(EPOCHS):
        _epoch(model, opt, dl)
    return model, accountant.get_epsilon(DELTA)


class BatchClipping(DPOptimizer):
    """Clips the batch's summed gradient to max_grad_norm, not each example's."""

    def clip_and_accumulate(self):
        grads = [self._get_flat_grad_sample(p).sum(0) for p in self.params]
        norm = torch.sqrt(sum(g.square().sum() for g in grads))
        factor = min(1.0, self.max_grad_norm / (float(norm) + 1e-6))
        for p, g in zip(self.params, grads):
            p.summed_grad = g * factor if p.summed_grad is None else p.summed_grad + g * factor
            _mark_as_processed(p.grad_sample)


def batch_clipping(X, y, seed):
    """The low-level loop with BatchClipping: one example can move the sum by far more
    than the clip when the others cancel it."""
    torch.manual_seed(seed)
    model = GradSampleModule(nn.Linear(X.shape[1], 2))
    dl = DPDataLoader.from_data_loader(torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(X, y), batch_size=B))
    opt = BatchClipping(torch.optim.SGD(model.parameters(), lr=LR), noise_multiplier=SIGMA,
                        max_grad_norm=CLIP, expected_batch_size=B)
    accountant = RDPAccountant()
    opt.attach_step_hook(accountant.get_optimizer_hook_fn(sample_rate=dl.sample_rate))
    for _ in range(EPOCHS):
        _epoch(model, opt, dl)
    return model, accountant.get_epsilon(DELTA)
