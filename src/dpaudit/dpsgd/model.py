"""The models DP-SGD trains: weights (:class:`Params`) of a :class:`ModelSpec` (the
architecture and hyper-parameters are in :mod:`.spec`) and their flat layout, the seeded
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
from .spec import ModelSpec
from ..device import resolve
from ..io import BadInputFile, read_torch, save_torch

# Std of the standard normal truncated to [-2, 2] (scipy.stats.truncnorm(-2, 2).std()):
# Keras' glorot_normal divides by it so that the truncated draw has variance 2/(in+out).
_TRUNC2_STD = 0.87962566103423978


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


def noise_views(noise: torch.Tensor, params: "Params | ModelSpec"):
    """Per-layer views (W_0, b_0, W_1, b_1, ...) of a (K, P) noise row, laid out row-major,
    for the layer shapes of ``params`` (or of a ModelSpec)."""
    shapes = params.shapes if isinstance(params, ModelSpec) else [w.shape[1:] for w in params.W]
    views, off = [], 0
    for i, o in shapes:
        views += [noise[:, off:off + i * o].unflatten(1, (i, o)),
                  noise[:, off + i * o:off + (i + 1) * o]]
        off += (i + 1) * o
    return views


def layer_tensors(params: Params) -> list[torch.Tensor]:
    """The parameter tensors in the flattened layout's order: W_0, b_0, W_1, b_1, ..."""
    return [t for pair in zip(params.W, params.b) for t in pair]


def flatten(params: Params) -> torch.Tensor:
    """The K models' parameters as one (K, P) tensor, in the trainer's layout: W_0, b_0, W_1,
    b_1, ..., each row-major (W_l of shape (fan_in, fan_out)); the layout of the noise
    (``noise_views``) and of :attr:`GradientCanaries.directions`. A new tensor."""
    return torch.cat([t.reshape(params.K, -1) for t in layer_tensors(params)], dim=1)


def check_seed(seed) -> int:
    """``seed`` as an int; ValueError unless it is an integer >= 0."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed={seed!r}: must be an integer >= 0")
    return int(seed)


# Phi(-2) and Phi(2) - Phi(-2), the standard normal's mass below -2 and within [-2, 2].
_PHI_M2 = 0.022750131948179195
_PHI_MASS = 0.9544997361036416


def glorot_draw(model: "ModelSpec", key: torch.Tensor, steps, dtype) -> list[torch.Tensor]:
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
        key, steps = philox.keys([check_seed(seed)], dev), torch.arange(K)
    else:
        if len(seed) != K:
            raise ValueError(f"init_params: {len(seed)} seeds for K={K} models")
        key, steps = philox.keys([check_seed(s) for s in seed], dev), 0
    W = [w.mul_(scale) for w in glorot_draw(model, key, steps, dtype)]
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
