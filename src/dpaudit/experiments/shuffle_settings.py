"""The settings of the shuffle audit (:mod:`dpaudit.experiments.shuffle`) and which subjects
each one trains: torch-free, as the workflow's start-up, the command line's checks and the
audit all read them."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import dpsgd

#: Subject name (as in :mod:`dpaudit.subjects`) -> the trainer's sampling.
SUBJECTS = {"fixed": "poisson", "shuffle": "shuffle", "shuffle-once": "shuffle-once"}
#: Chua et al.'s shuffling of each shuffled subject.
SHUFFLING = {"shuffle": "dynamic", "shuffle-once": "persistent"}
RELATION = "zero-out"
#: What every subject reports: Poisson subsampling at q = B / n, PLD.
ACCOUNTING = "poisson-pld"


@dataclass(frozen=True)
class Setting:
    """One setting of the audit (module docstring); ``n = batch_size * steps_per_epoch``."""

    arch: str
    batch_size: int
    steps_per_epoch: int
    epochs: int
    eps: float

    def __post_init__(self):
        for name in ("batch_size", "steps_per_epoch", "epochs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
                    or value < 1:
                raise ValueError(f"{name}={value!r}: must be an integer >= 1")
        if self.arch not in dpsgd.ARCHS:
            raise ValueError(f"arch={self.arch!r}: must be one of {list(dpsgd.ARCHS)}")
        if isinstance(self.eps, bool) or not isinstance(self.eps, (int, float)) \
                or not 0 < self.eps < math.inf:
            raise ValueError(f"eps={self.eps!r}: must be a finite number > 0")

    @property
    def n(self) -> int:
        return self.batch_size * self.steps_per_epoch

    def label(self) -> str:
        return (f"{self.arch} B={self.batch_size} S={self.steps_per_epoch} "
                f"E={self.epochs} eps={self.eps:g}")


def trains(subject: str, epochs: int) -> bool:
    """Whether a setting of ``epochs`` trains ``subject``: at one epoch ``shuffle-once`` is
    ``shuffle`` (one permutation either way), so it is not trained again."""
    return not (subject == "shuffle-once" and epochs == 1)


__all__ = ["SUBJECTS", "SHUFFLING", "RELATION", "ACCOUNTING", "Setting", "trains"]
