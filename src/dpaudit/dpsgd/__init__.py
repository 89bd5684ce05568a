"""Batched DP-SGD: K independent models trained at once, with exact per-example clipping.

One concept per module:

- :mod:`.spec`               what is trained: architecture and hyper-parameters (no torch)
- :mod:`.model`              the models' weights and their flat layout, seeded
                             initialisation, files
- :mod:`.philox`             the counter-based generator of every random draw (Philox-4x32-10)
- :mod:`.cpu_draws`          its bulk CPU draws, compiled (numba)
- :mod:`.wide`               the wide step's forward and backward passes and per-example
                             gradient norms; logits, losses and gradient norms of models
- :mod:`.sampling`           each step's batches, epoch ends, shared data or gathered batches
- :mod:`.precision`          float32 matmul precision (fp32 or TF32) and the TF32 clip margin
- :mod:`.gradient_canaries`  gradient canaries of white-box one-run audits and their scores
- :mod:`.training`           the DP-SGD update: :func:`train`, :func:`train_with_noise_std`
- :mod:`.memory`             how many seeds one training call holds, and one kept block

Each name below is imported from its module when first used (:mod:`dpaudit.lazy`), so that
reading a :class:`ModelSpec` does not import torch.
"""

from typing import TYPE_CHECKING

from ..lazy import lazy_attributes

if TYPE_CHECKING:
    from . import philox
    from .gradient_canaries import (CanaryRun, CanaryScores, GradientCanaries, Insertions,
                                    dirac_canaries, last_iterate_scores)
    from .memory import seeds_per_block, seeds_per_call, step_bytes
    from .model import Params, flatten, init_params, load_params, save_params
    from .precision import PRECISIONS, TF32_REL, matmul_precision
    from .sampling import epoch_ends
    from .spec import (ARCHS, INITS, NORMALISATIONS, SAMPLINGS, DPSGDConfig, ModelSpec,
                       floored_expected_batch)
    from .training import train, train_with_noise_std
    from .wide import grad_norms, logits, losses

__getattr__, __dir__, __all__ = lazy_attributes(globals())
