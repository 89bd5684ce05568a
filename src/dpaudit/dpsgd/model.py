"""The models DP-SGD trains: architecture (:class:`ModelSpec`), hyper-parameters
(:class:`DPSGDConfig`), weights (:class:`Params`) and their flat layout, the seeded
initialisation, saving and loading.

Randomness. Model k's randomness depends only on its seed ``seeds[k]``: it is the Philox
key of every draw of that model (:mod:`dpaudit.dpsgd.philox`), and each draw a pure function of
(seed, stream, step, index), with one stream each for the initialisation, the batches, the
noise and the canaries (a new stream leaves the others unchanged). So a model's result
does not depend on which other models are trained beside it, nor on the device (to float
rounding), and the batches of a given seed are the same for every noise level and
initialisation (paired comparisons).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from . import philox
from ..device import resolve
from ..io import BadInputFile, read_torch, save_torch

ARCHS = ("lr", "fnn")
SAMPLINGS = ("shuffle", "shuffle-once", "poisson")
INITS = ("glorot", "fixed")

# Std of the standard normal truncated to [-2, 2] (scipy.stats.truncnorm(-2, 2).std()):
# Keras' glorot_normal divides by it so that the truncated draw has variance 2/(in+out).
_TRUNC2_STD = 0.87962566103423978
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

    def __post_init__(self):
        if self.sampling not in SAMPLINGS:
            raise ValueError(f"DPSGDConfig.sampling={self.sampling!r}: must be one of {SAMPLINGS}")
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

    def steps(self, n: int) -> int:
        """Number of DP-SGD steps T on n examples."""
        if self.shuffled:
            return int(self.epochs) * self.steps_per_epoch(n)
        return max(1, round(self.epochs * n / self.batch_size))


@dataclass
class Params:
    """Weights of K models of one :class:`ModelSpec`: layer l maps a -> a @ W[l] + b[l].

    ``W[l]`` has shape (K, fan_in, fan_out) (Keras' kernel layout), ``b[l]`` (K, fan_out).
    """

    W: list[torch.Tensor]
    b: list[torch.Tensor]

    @property
    def K(self) -> int:
        return self.W[0].shape[0]

    def to(self, device=None, dtype=None) -> "Params":
        return Params([w.to(device, dtype) for w in self.W], [b.to(device, dtype) for b in self.b])

    def digest(self) -> str:
        """SHA-256 of the weights and biases (:func:`dpaudit.io.array_digest`, on the CPU):
        what a restore key records of an initial model."""
        from ..io import array_digest

        return array_digest({f"{name}{i}": t.detach().cpu() for name, ts in
                             (("W", self.W), ("b", self.b)) for i, t in enumerate(ts)})

    def select(self, index) -> "Params":
        """The models ``index`` (an int, a slice or a sequence of ints), as a new Params."""
        if isinstance(index, int):
            index = [index]
        return Params([w[index].clone() for w in self.W], [b[index].clone() for b in self.b])

    def check(self, model: ModelSpec) -> None:
        got = [tuple(w.shape[1:]) for w in self.W], [tuple(b.shape[1:]) for b in self.b]
        want = model.shapes, [(o,) for _, o in model.shapes]
        if got != want:
            raise ValueError(f"Params of layer shapes {got} do not match {model}")


def _noise_views(noise: torch.Tensor, params: "Params | ModelSpec"):
    """Per-layer views (W_0, b_0, W_1, b_1, ...) of a (K, P) noise row, laid out row-major,
    for the layer shapes of ``params`` (or of a ModelSpec)."""
    shapes = params.shapes if isinstance(params, ModelSpec) else [w.shape[1:] for w in params.W]
    views, off = [], 0
    for i, o in shapes:
        views += [noise[:, off:off + i * o].unflatten(1, (i, o)),
                  noise[:, off + i * o:off + (i + 1) * o]]
        off += (i + 1) * o
    return views


def _tensors(params: Params) -> list[torch.Tensor]:
    """The parameter tensors in the flattened layout's order: W_0, b_0, W_1, b_1, ..."""
    return [t for pair in zip(params.W, params.b) for t in pair]


def flatten(params: Params) -> torch.Tensor:
    """The K models' parameters as one (K, P) tensor, in the trainer's layout: W_0, b_0, W_1,
    b_1, ..., each row-major (W_l of shape (fan_in, fan_out)); the layout of the noise
    (``_noise_views``) and of :attr:`GradientCanaries.directions`. A new tensor."""
    return torch.cat([t.reshape(params.K, -1) for t in _tensors(params)], dim=1)


def _check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed={seed!r}: must be an integer >= 0")
    return int(seed)


# Phi(-2) and Phi(2) - Phi(-2), the standard normal's mass below -2 and within [-2, 2].
_PHI_M2 = 0.022750131948179195
_PHI_MASS = 0.9544997361036416


def _glorot_draw(model: "ModelSpec", key: torch.Tensor, steps, dtype) -> list[torch.Tensor]:
    """Glorot-normal weights (scale 1) of the runs of ``key`` ((K, 2), :func:`philox.keys`)
    at init-stream steps ``steps`` (an int: (K, fan_in, fan_out) per layer; a tensor of S
    steps of one key: (S, fan_in, fan_out)), one draw for all layers, on the key's device.

    Inverse CDF: u ~ U(0, 1), z = Phi^-1(Phi(-2) + u (Phi(2) - Phi(-2))) is exactly N(0, 1)
    truncated to [-2, 2]; in float64 (no rejection loop, and no dependence on torch's
    truncated-normal algorithm, which changed between versions)."""
    sizes = [i * o for i, o in model.shapes]
    u = philox.draw("uniform", key, philox.INIT, steps, sum(sizes)).reshape(-1, sum(sizes))
    z = u.mul_(_PHI_MASS).add_(_PHI_M2).mul_(2).sub_(1).erfinv_().mul_(math.sqrt(2)).clamp_(-2, 2)
    return [part.mul(math.sqrt(2.0 / (i + o)) / _TRUNC2_STD).to(dtype).view(-1, i, o)
            for part, (i, o) in zip(z.split(sizes, dim=1), model.shapes)]


def init_params(model: ModelSpec, K: int, seed, scale: float = 1.0, *, device=None,
                dtype: torch.dtype = torch.float32) -> Params:
    """Glorot-normal initial weights of K models, times ``scale``; zero biases.

    Keras ``glorot_normal`` (used by the reference code): N(0, s'^2) truncated to
    [-2 s', 2 s'] with s' = sqrt(2 / (fan_in + fan_out)) / 0.8796..., so that the weights
    have variance 2 / (fan_in + fan_out) (Glorot & Bengio 2010).

    ``seed``: an int (the K models at steps 0, ..., K - 1 of its init stream), or a sequence
    of K ints, model k the initialisation of the model :func:`train` trains from seed
    ``seed[k]`` (step 0 of its init stream), at every init scale: the scale multiplies the
    same draw. The draws do not depend on ``device`` (to float rounding).
    """
    dev = resolve(device)
    if isinstance(seed, (int, np.integer)):
        key, steps = philox.keys([_check_seed(seed)], dev), torch.arange(K)
    else:
        if len(seed) != K:
            raise ValueError(f"init_params: {len(seed)} seeds for K={K} models")
        key, steps = philox.keys([_check_seed(s) for s in seed], dev), 0
    W = [w.mul_(scale) for w in _glorot_draw(model, key, steps, dtype)]
    b = [torch.zeros(K, o, device=dev, dtype=dtype) for _, o in model.shapes]
    return Params(W, b)


def save_params(path, params: Params, model: ModelSpec) -> None:
    """Save weights (e.g. the shared "fixed" init, or a few trained models) with their spec."""
    save_torch(path, {"model": vars(model), "W": [w.detach().cpu() for w in params.W],
                      "b": [b.detach().cpu() for b in params.b]})


def load_params(path, device=None) -> tuple[Params, ModelSpec]:
    """Load what :func:`save_params` saved: ``(params, model)`` (params on ``device`` or CPU);
    any other file, or one altered since (its content hash), raises
    :class:`dpaudit.io.BadInputFile`."""
    kind = "model weights saved by dpaudit (.pt)"
    blob = read_torch(path, kind, device or "cpu")
    try:
        model = ModelSpec(**blob["model"])
        params = Params(blob["W"], blob["b"])
        params.check(model)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise BadInputFile(path, f"not {kind} ({type(exc).__name__}: {exc})") from None
    return params, model
