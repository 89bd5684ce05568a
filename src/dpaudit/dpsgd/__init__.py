"""Batched DP-SGD: K independent models trained at once, with exact per-example clipping.

One concept per module:

- :mod:`.model`              the models: architecture, hyper-parameters, weights and their
                             flat layout, seeded initialisation, files
- :mod:`.philox`             the counter-based generator of every random draw (Philox-4x32-10)
- :mod:`.wide`               the wide step's forward and backward passes and per-example
                             gradient norms; logits, losses and gradient norms of models
- :mod:`.sampling`           each step's batches, epoch ends, shared data or gathered batches
- :mod:`.precision`          float32 matmul precision (fp32 or TF32) and the TF32 clip margin
- :mod:`.gradient_canaries`  gradient canaries of white-box one-run audits and their scores
- :mod:`.training`           the DP-SGD update: :func:`train`, :func:`train_with_noise_std`
- :mod:`.memory`             how many seeds one training call holds, and one kept block
"""

from .gradient_canaries import (CanaryRun, CanaryScores, GradientCanaries, Insertions,
                                dirac_canaries, last_iterate_scores)
from .memory import seeds_per_block, seeds_per_call, step_bytes
from .model import (ARCHS, INITS, SAMPLINGS, DPSGDConfig, ModelSpec, Params, flatten,
                    init_params, load_params, save_params)
from .precision import PRECISIONS, TF32_REL, matmul_precision
from .sampling import epoch_ends
from .training import train, train_with_noise_std
from .wide import grad_norms, logits, losses

__all__ = ["ModelSpec", "DPSGDConfig", "Params", "init_params", "save_params", "load_params",
           "logits", "losses", "grad_norms", "train", "train_with_noise_std", "seeds_per_call",
           "seeds_per_block", "step_bytes", "epoch_ends", "GradientCanaries", "CanaryRun",
           "CanaryScores", "Insertions",
           "flatten", "last_iterate_scores", "dirac_canaries", "matmul_precision", "ARCHS",
           "SAMPLINGS", "INITS", "PRECISIONS", "TF32_REL"]
