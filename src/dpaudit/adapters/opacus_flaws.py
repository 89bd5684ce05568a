"""Opacus trainings as users write them, flawed and corrected: the subjects of ``dpaudit
opacus-check`` and of the flaws table (:mod:`dpaudit.experiments.flaws`, docs/flaws.md).

Each is ``train(X, y, seed) -> (model, reported_eps)``, the contract of
:func:`dpaudit.adapters.opacus_probe.check`: its own DataLoader over ``(X, y)``, its own
``make_private`` (or Opacus' low-level objects) and loop, at delta :data:`DELTA`, batch
size :data:`B`, :data:`EPOCHS` epochs, returning the model and the epsilon it reports.
:data:`TRAININGS` names them (``dpaudit opacus-check --train
dpaudit.adapters.opacus_flaws:wrong_rate`` runs one); :data:`FIX` names each flawed one's
corrected training. Importing this module needs Opacus."""

from __future__ import annotations

import functools

import torch
from opacus import GradSampleModule, PrivacyEngine
from opacus.accountants import RDPAccountant
from opacus.accountants.utils import get_noise_multiplier
from opacus.data_loader import DPDataLoader
from opacus.optimizers.optimizer import (DPOptimizer, _check_processed_flag,
                                         _generate_noise, _mark_as_processed)
from torch import nn

DELTA, B, EPOCHS, SIGMA, CLIP, LR = 1e-5, 5, 5, 1.0, 1.0, 0.1
#: The data set's size as fixed in advance (public), which :func:`fixed_rate` takes its
#: sample rate from: B / N_PUBLIC whatever the rows handed over.
N_PUBLIC = 20


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


@functools.lru_cache(maxsize=None)
def _sigma_for_eps2(q: float, steps: int) -> float:
    """RDP's sigma for eps 2 at (q, steps), computed once per setting (a search of seconds),
    as a script calibrates once before it trains."""
    return get_noise_multiplier(target_epsilon=2.0, target_delta=DELTA, sample_rate=q,
                                steps=steps, accountant="rdp")


def wrong_rate(X, y, seed):
    """Sigma calibrated to eps 2 for the sample rate of ten times the data (q / 10), the
    target reported: the rate's n taken from a config, not the data."""
    return _calibrated_to_eps2(X, y, seed, rate_divisor=10)


def _calibrated_to_eps2(X, y, seed, rate_divisor: int):
    """A training at RDP's sigma for eps 2 at the training's sample rate over
    ``rate_divisor`` (its steps as they are), reporting the target, eps 2."""
    q = 1 / ((len(X) + B - 1) // B)
    sigma = _sigma_for_eps2(q / rate_divisor, EPOCHS * int(1 / q))
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


def _low_level(X, y, seed, optimizer=DPOptimizer, clip=CLIP, sample_rate=None):
    """Opacus' low-level API: GradSampleModule, a DPDataLoader (at ``sample_rate``, else
    make_private's 1 / len(loader)), ``optimizer`` with expected_batch_size B, an RDP
    accountant hooked to its steps; the eps it reports after EPOCHS epochs."""
    torch.manual_seed(seed)
    model = GradSampleModule(nn.Linear(X.shape[1], 2))
    data = torch.utils.data.TensorDataset(X, y)
    dl = (DPDataLoader.from_data_loader(torch.utils.data.DataLoader(data, batch_size=B))
          if sample_rate is None else DPDataLoader(data, sample_rate=sample_rate))
    opt = optimizer(torch.optim.SGD(model.parameters(), lr=LR), noise_multiplier=SIGMA,
                    max_grad_norm=clip, expected_batch_size=B)
    accountant = RDPAccountant()
    opt.attach_step_hook(accountant.get_optimizer_hook_fn(sample_rate=dl.sample_rate))
    for _ in range(EPOCHS):
        _epoch(model, opt, dl)
    return model, accountant.get_epsilon(DELTA)


def unscaled_noise(X, y, seed):
    """Opacus' low-level API with UnscaledNoise at clip 4: noise multiplier 1 / 4, the
    RDP accountant told 1."""
    return _low_level(X, y, seed, UnscaledNoise, clip=4.0)


def scaled_noise(X, y, seed):
    """The fix of :func:`unscaled_noise`: Opacus' own DPOptimizer at clip 4 (noise std
    noise_multiplier * max_grad_norm)."""
    return _low_level(X, y, seed, clip=4.0)


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
    return _low_level(X, y, seed, SampledMean)


def low_level(X, y, seed):
    """The fix of :func:`sampled_mean` and :func:`batch_clipping`: Opacus' own DPOptimizer
    (per-example clipping, the noisy sum over the constant expected_batch_size)."""
    return _low_level(X, y, seed)


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
    return _low_level(X, y, seed, BatchClipping)


def fixed_rate(X, y, seed):
    """The fix of make_private's size-dependent sampling (meta-pytorch/opacus#571, #819)
    and of :func:`shuffled`: Poisson batches at a sample rate fixed in advance, B /
    :data:`N_PUBLIC`, whatever the rows handed over (int(N_PUBLIC / B) steps per epoch),
    and Opacus' DPOptimizer dividing by the constant B, so that add/remove neighbours are
    trained by the same mechanism."""
    return _low_level(X, y, seed, sample_rate=B / N_PUBLIC)


def right_rate(X, y, seed):
    """The fix of :func:`wrong_rate`: sigma calibrated to eps 2 at the sample rate and steps
    the training runs, the target reported."""
    return _calibrated_to_eps2(X, y, seed, rate_divisor=1)


def all_epochs(X, y, seed):
    """The fix of :func:`one_epoch`: eps read after the last epoch."""
    engine, model, opt, dl = _setup(X, y, seed)
    for _ in range(EPOCHS):
        _epoch(model, opt, dl)
    return model, engine.get_epsilon(DELTA)


#: Every training here by name.
TRAININGS = {f.__name__: f for f in (correct, wrong_rate, right_rate, one_epoch, all_epochs,
                                     unscaled_noise, scaled_noise, shuffled, sampled_mean,
                                     batch_clipping, low_level, fixed_rate)}
#: Each flawed training's corrected one.
FIX = {"wrong_rate": "right_rate", "one_epoch": "all_epochs",
       "unscaled_noise": "scaled_noise", "shuffled": "fixed_rate",
       "sampled_mean": "low_level", "batch_clipping": "low_level", "correct": "fixed_rate"}

__all__ = ["DELTA", "B", "EPOCHS", "SIGMA", "CLIP", "LR", "N_PUBLIC", "TRAININGS", "FIX",
           *TRAININGS, "UnscaledNoise", "SampledMean", "BatchClipping"]
