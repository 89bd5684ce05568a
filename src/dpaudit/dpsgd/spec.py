"""What DP-SGD trains, without torch: the architecture (:class:`ModelSpec`) and the
hyper-parameters (:class:`DPSGDConfig`). The workflow's start-up reads them (the shapes a
config asks for) in Snakemake's own process."""

from __future__ import annotations

import math
from dataclasses import dataclass

ARCHS = ("lr", "fnn")
SAMPLINGS = ("shuffle", "shuffle-once", "poisson")
INITS = ("glorot", "fixed")
#: How a step divides the noisy clipped sum (the normaliser), by name (Rethinking the
#: Security of DP-SGD, 2026, names the three): "sgm" a constant, ``batch_size`` (the
#: expected Poisson batch size q n, or the fixed shuffled one): correct; "easgm" the
#: expected batch size as Opacus' ``make_private`` computes it from the data set's size,
#: ``int(n * (1 / ceil(n / batch_size)))`` (:func:`floored_expected_batch`), which changes
#: with n (meta-pytorch/opacus#819); "asgm" each run's sampled batch size (at least 1).
NORMALISATIONS = {
    "sgm": "the noisy sum over batch_size, a constant",
    "easgm": "over int(n * (1 / ceil(n / batch_size))), Opacus' expected batch size of n rows",
    "asgm": "over the step's sampled batch size (at least 1)",
}

_MIN_CHUNK_STEPS = 64


@dataclass(frozen=True)
class ModelSpec:
    """A dense classifier: 'lr' (in_dim -> n_classes) or 'fnn' (in_dim -> hidden ReLU ->
    n_classes); ``hidden`` a sequence of widths (e.g. ``(384, 384)``) stacks several ReLU
    layers (a list is stored as a tuple).

    Every layer has a bias. Softmax cross-entropy loss on the logits.
    """

    arch: str
    in_dim: int
    hidden: int | tuple[int, ...] = 32
    n_classes: int = 2

    def __post_init__(self):
        if self.arch not in ARCHS:
            raise ValueError(f"ModelSpec.arch={self.arch!r}: must be one of {ARCHS}")
        if isinstance(self.hidden, (list, tuple)):
            object.__setattr__(self, "hidden", tuple(self.hidden))
        if not self._widths or any(int(w) < 1 for w in self._widths) or int(self.in_dim) < 1:
            raise ValueError(f"ModelSpec: in_dim={self.in_dim} and every hidden width "
                             f"(hidden={self.hidden}) must be >= 1")
        if int(self.n_classes) < 2:
            raise ValueError(f"ModelSpec.n_classes={self.n_classes}: must be >= 2")

    @property
    def _widths(self) -> tuple:
        """The hidden widths as a tuple (one int ``hidden`` is one layer)."""
        return self.hidden if isinstance(self.hidden, tuple) else (self.hidden,)

    @property
    def shapes(self) -> list[tuple[int, int]]:
        """(fan_in, fan_out) of each dense layer."""
        if self.arch == "lr":
            return [(self.in_dim, self.n_classes)]
        dims = [self.in_dim, *self._widths, self.n_classes]
        return list(zip(dims[:-1], dims[1:]))

    @property
    def n_params(self) -> int:
        return sum((i + 1) * o for i, o in self.shapes)


@dataclass(frozen=True)
class DPSGDConfig:
    """Hyper-parameters of DP-SGD.

    sampling: "shuffle" = each epoch a fresh random permutation cut into consecutive batches
    of ``batch_size`` (the last one smaller if batch_size does not divide n; its update is
    still divided by batch_size, so every example moves it by at most lr*C/batch_size), as
    Keras' ``fit`` in the reference code; "shuffle-once" = one permutation (epoch 0's) cut
    the same way every epoch (persistent shuffling, Chua et al. 2024: the batches never
    change); "poisson" = each example independently with rate
    q = batch_size / n, ``round(epochs / q)`` steps (the sampling the accountants assume).
    normalisation: what the noisy clipped sum is divided by (:data:`NORMALISATIONS`):
    "sgm" ``batch_size`` (the default), "easgm" Opacus' floored expected batch size of the
    data's n rows, "asgm" each run's sampled batch size.
    init: "glorot" = Keras glorot_normal (normal truncated at 2 std, variance
    2/(fan_in+fan_out)), times ``init_scale``, zero biases, drawn from each model's seed;
    "fixed" = the same given initial weights for every model (``init=`` of :func:`train`).
    """

    epochs: float
    batch_size: int
    lr: float
    clip: float
    noise_multiplier: float
    sampling: str = "shuffle"
    init: str = "glorot"
    init_scale: float = 1.0
    normalisation: str = "sgm"

    def __post_init__(self):
        if self.sampling not in SAMPLINGS:
            raise ValueError(f"DPSGDConfig.sampling={self.sampling!r}: must be one of {SAMPLINGS}")
        if self.normalisation not in NORMALISATIONS:
            raise ValueError(f"DPSGDConfig.normalisation={self.normalisation!r}: must be one "
                             f"of {tuple(NORMALISATIONS)}")
        if self.init not in INITS:
            raise ValueError(f"DPSGDConfig.init={self.init!r}: must be one of {INITS}")
        if not self.epochs > 0:
            raise ValueError(f"DPSGDConfig.epochs={self.epochs}: must be > 0")
        if self.shuffled and self.epochs != int(self.epochs):
            raise ValueError(f"DPSGDConfig.epochs={self.epochs}: must be an integer with "
                             f"sampling={self.sampling!r}")
        if int(self.batch_size) != self.batch_size or self.batch_size < 1:
            raise ValueError(f"DPSGDConfig.batch_size={self.batch_size}: must be an integer >= 1")
        for name in ("lr", "clip", "init_scale"):
            if not getattr(self, name) > 0:
                raise ValueError(f"DPSGDConfig.{name}={getattr(self, name)}: must be > 0")
        if not self.noise_multiplier >= 0:
            raise ValueError(f"DPSGDConfig.noise_multiplier={self.noise_multiplier}: must be >= 0")
        if self.init == "fixed" and self.init_scale != 1.0:
            raise ValueError(f"DPSGDConfig.init_scale={self.init_scale}: must be 1.0 with "
                             f"init='fixed' (it scales the Glorot draw only)")

    @property
    def shuffled(self) -> bool:
        """Batches cut from a permutation ("shuffle", "shuffle-once"): each example in
        exactly one batch per epoch."""
        return self.sampling != "poisson"

    def steps_per_epoch(self, n: int) -> int:
        return math.ceil(n / self.batch_size)

    def chunk_steps(self, n: int) -> int:
        """Steps between two progress reports of the trainer: whole epochs, at least 64
        steps (a function of the config only)."""
        spe = self.steps_per_epoch(n)
        return spe * math.ceil(_MIN_CHUNK_STEPS / spe)

    def divisor(self, n: int) -> int:
        """The constant the noisy sum is divided by on n rows: ``batch_size`` ("sgm", and
        "asgm", whose trainer rescales each run's step to its sampled batch size) or
        :func:`floored_expected_batch` ("easgm")."""
        if self.normalisation == "easgm":
            return floored_expected_batch(n, self.batch_size)
        return self.batch_size

    def steps(self, n: int) -> int:
        """Number of DP-SGD steps T on n examples."""
        if self.shuffled:
            return int(self.epochs) * self.steps_per_epoch(n)
        return max(1, round(self.epochs * n / self.batch_size))


def floored_expected_batch(n: int, batch_size: int) -> int:
    """Opacus' ``make_private`` expected batch size on n rows with a DataLoader of
    ``batch_size``: ``int(len(dataset) * sample_rate)``, ``sample_rate = 1 /
    len(data_loader)`` = 1 / ceil(n / batch_size), in its float arithmetic (at least 1)."""
    return max(1, int(n * (1 / math.ceil(n / batch_size))))
