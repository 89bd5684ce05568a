"""Batched DP-SGD: K independent models trained at once, with exact per-example clipping.

DP-SGD (Abadi et al. 2016, Alg. 1; Jagielski et al. 2020, Alg. 1). At each step
t, with batch B_t and clipping norm C, every model takes

    theta_{t+1} = theta_t - lr / B * ( sum_{i in B_t} clip_C(grad_i) + N(0, s^2 I) ),
    clip_C(g) = g * min(1, C / ||g||_2),

where grad_i is the gradient of example i's cross-entropy loss with respect to *all*
parameters jointly, ``s`` is the noise std on the clipped sum (``noise_multiplier * C`` for
DP-SGD) and ``B`` the fixed batch size ("shuffle") or the expected batch size q*n
("poisson"). This is the update of the reference code of Jagielski et al.
(``jagielski/auditing-dpsgd``, TF-Privacy ``VectorizedDPSGD`` with one microbatch per
example: clipped sum plus noise, divided by the number of microbatches).

Efficiency. The K models share one tensor layout with a leading model dimension, so every
step is a handful of batched matmuls (``torch.bmm``). The forward and backward passes of the
dense architectures are written out by hand. For a dense layer z = a W + b the
per-example gradient is the outer product (a_i; 1) g_i^T with g_i = d loss_i / d z_i, so
its squared Frobenius norm is (||a_i||^2 + 1) ||g_i||^2 (Goodfellow 2015, "Efficient
per-example gradient computations"); summing this over layers gives ||grad_i||^2 without
materialising any per-example gradient, and the clipped sum of a layer's weight gradients
is the single matmul  sum_i c_i a_i g_i^T = a^T (c * g),  c_i = min(1, C / ||grad_i||).

Randomness. Model k's randomness depends only on its seed ``seeds[k]``: four independent
generators (initialisation, batch sampling, noise, canary sampling) are derived from it by
``numpy.random.SeedSequence(seed).spawn`` (the first three children are the same whether
three or four are spawned: the canary stream left every other draw unchanged). Random
numbers are drawn per model in chunks of whole epochs, at least 64 steps (a size fixed by
the config, not by K), so a model's result does not depend on which other models are trained
beside it, and the batches of a given seed are the same for every noise level and
initialisation (paired comparisons).

Gradient canaries (white-box one-run audits). ``canaries=`` (:class:`GradientCanaries`)
inserts m fixed vectors g_j of norm exactly C into the update: canary j is part of model k's
run iff ``included[k, j]`` (drawn by the caller, typically a fair coin: Steinke, Nasr &
Jagielski 2023, "Privacy Auditing with One (1) Training Run"), and at every step each
included canary is independently sampled with rate q (default: the data's B/n, the
subsampling the accountants assume), its vector then added to the clipped gradient sum
exactly as a clipped example's gradient would be (before the noise, before the division by
B). Such gradient canaries (Nasr, Hayes, Steinke, Balle, Tramèr, Jagielski, Carlini &
Terzis 2023, "Tight Auditing of Differentially Private Machine Learning"), in particular
Dirac canaries (one coordinate set to C, :func:`dirac_canaries`), are the worst-case
insertion DP-SGD's guarantee covers, so the audit measures the mechanism rather than how
well an input example can be made to stand out. The trainer returns the summed scores
sum_t <theta_t - theta_{t+1}, g_j> (float64, higher = "in"), which telescope to the
last-iterate score <theta_0 - theta_T, g_j> (:func:`last_iterate_scores`, via
:func:`flatten`), and, with noise, the all-iterates test :attr:`CanaryRun.llr`: per step the
likelihood ratio of "sampled at rate q" against "absent", which only an auditor who sees
every iterate can compute.
"""

from __future__ import annotations

import contextvars
import math
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

import numpy as np
import torch

from .device import resolve
from .io import BadInputFile, atomic_path, read_torch

ARCHS = ("lr", "fnn")
SAMPLINGS = ("shuffle", "poisson")
INITS = ("glorot", "fixed")

# Std of the standard normal truncated to [-2, 2] (scipy.stats.truncnorm(-2, 2).std()):
# Keras' glorot_normal divides by it so that the truncated draw has variance 2/(in+out).
_TRUNC2_STD = 0.87962566103423978
# Stream indices of the per-model generators derived from a seed.
_INIT, _BATCH, _NOISE, _CANARY = 0, 1, 2, 3
_STREAMS = 4
_MIN_CHUNK_STEPS = 64
#: Float32 matmul precisions of the trainer (:func:`matmul_precision`).
PRECISIONS = ("fp32", "tf32")
#: TF32 keeps 10 of float32's 23 fraction bits: each input of a TF32 product is within a
#: relative 2^-10 of its float32 value, whether the hardware rounds to nearest or toward 0.
TF32_REL = 2.0 ** -10
_PRECISION = contextvars.ContextVar("dpaudit_matmul_precision", default="fp32")


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
    Keras' ``fit`` in the reference code; "poisson" = each example independently with rate
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
        if self.sampling == "shuffle" and self.epochs != int(self.epochs):
            raise ValueError(f"DPSGDConfig.epochs={self.epochs}: must be an integer with "
                             f"sampling='shuffle'")
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

    def steps_per_epoch(self, n: int) -> int:
        return math.ceil(n / self.batch_size)

    def chunk_steps(self, n: int) -> int:
        """Steps whose random numbers are drawn at once: whole epochs, at least 64 steps.

        A function of the config only (not of K), so each model's draws are the same
        whatever is trained beside it; large, so that the per-model generator calls (one
        for the batches, one for the noise of a chunk) are few on a GPU.
        """
        spe = self.steps_per_epoch(n)
        return spe * math.ceil(_MIN_CHUNK_STEPS / spe)

    def steps(self, n: int) -> int:
        """Number of DP-SGD steps T on n examples."""
        if self.sampling == "shuffle":
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


def _check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed={seed!r}: must be an integer >= 0")
    return int(seed)


def _stream_states(seed) -> list[int]:
    """The initial states of a seed's four streams (init, batches, noise, canaries): one
    ``SeedSequence.spawn`` per seed, shared by every stream and column trained from it."""
    children = np.random.SeedSequence(_check_seed(seed)).spawn(_STREAMS)
    return [int(c.generate_state(1, np.uint64)[0]) for c in children]


def _generator(seed: int, stream: int, device, states: list[int] | None = None) -> torch.Generator:
    """Generator of one stream (init, batches, noise, canaries) derived from a model's seed
    (``states``: the seed's :func:`_stream_states`, when already computed)."""
    state = (states or _stream_states(seed))[stream]
    return torch.Generator(device=device).manual_seed(state)


# Phi(-2) and Phi(2) - Phi(-2), the standard normal's mass below -2 and within [-2, 2].
_PHI_M2 = 0.022750131948179195
_PHI_MASS = 0.9544997361036416


def _glorot_draw(model: "ModelSpec", gen: torch.Generator, dev, dtype) -> list[torch.Tensor]:
    """One model's Glorot-normal weights (scale 1), one generator call for all layers.

    Inverse CDF: u ~ U(0, 1), z = Phi^-1(Phi(-2) + u (Phi(2) - Phi(-2))) is exactly N(0, 1)
    truncated to [-2, 2]. No device sync and no rejection loop (torch's trunc_normal_
    rejects and resamples, syncing the device each round, and its algorithm changed
    between torch versions, which would change every model's initialisation)."""
    sizes = [i * o for i, o in model.shapes]
    u = torch.rand(sum(sizes), generator=gen, device=dev, dtype=torch.float64)
    z = u.mul_(_PHI_MASS).add_(_PHI_M2).mul_(2).sub_(1).erfinv_().mul_(math.sqrt(2)).clamp_(-2, 2)
    out = []
    for part, (i, o) in zip(z.split(sizes), model.shapes):
        out.append(part.mul_(math.sqrt(2.0 / (i + o)) / _TRUNC2_STD).to(dtype).view(i, o))
    return out


def init_params(model: ModelSpec, K: int, seed, scale: float = 1.0, *, device=None,
                dtype: torch.dtype = torch.float32) -> Params:
    """Glorot-normal initial weights of K models, times ``scale``; zero biases.

    Keras ``glorot_normal`` (used by the reference code): N(0, s'^2) truncated to
    [-2 s', 2 s'] with s' = sqrt(2 / (fan_in + fan_out)) / 0.8796..., so that the weights
    have variance 2 / (fan_in + fan_out) (Glorot & Bengio 2010).

    ``seed``: an int (all K models drawn in turn from its init stream), or a sequence of K
    ints, model k from the init stream of ``seed[k]`` (what :func:`train` does, so
    ``init_params(model, 1, [s])`` is the initialisation of the model trained with seed s,
    at every init scale: the scale multiplies the same draw).
    """
    dev = resolve(device)
    if isinstance(seed, (int, np.integer)):
        gens = [_generator(seed, _INIT, dev)] * K
    else:
        if len(seed) != K:
            raise ValueError(f"init_params: {len(seed)} seeds for K={K} models")
        gens = [_generator(s, _INIT, dev) for s in seed]
    draws = [_glorot_draw(model, g, dev, dtype) for g in gens]
    W = [torch.stack(ws).mul_(scale) for ws in zip(*draws)]
    b = [torch.zeros(K, o, device=dev, dtype=dtype) for _, o in model.shapes]
    return Params(W, b)


def save_params(path, params: Params, model: ModelSpec) -> None:
    """Save weights (e.g. the shared "fixed" init, or a few trained models) with their spec."""
    with atomic_path(path) as tmp:
        torch.save({"model": vars(model), "W": [w.detach().cpu() for w in params.W],
                    "b": [b.detach().cpu() for b in params.b]}, tmp)


def load_params(path, device=None) -> tuple[Params, ModelSpec]:
    """Load what :func:`save_params` saved: ``(params, model)`` (params on ``device`` or CPU);
    any other file raises :class:`dpaudit.io.BadInputFile`."""
    kind = "model weights saved by dpaudit (.pt)"
    blob = read_torch(path, kind, device or "cpu")
    try:
        model = ModelSpec(**blob["model"])
        params = Params(blob["W"], blob["b"])
        params.check(model)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise BadInputFile(path, f"not {kind} ({type(exc).__name__}: {exc})") from None
    return params, model


class _Wide(NamedTuple):
    """K seeds x M columns of one :class:`ModelSpec` in one layout (the trainer's): ``W[0]``
    (K, fan_in, M, fan_out), so that the first layer of every column is one
    (batch x fan_in) @ (fan_in x M*fan_out) matmul per seed; ``W[l]`` (K, M, fan_in,
    fan_out) for l > 0; ``b[l]`` (K, M, fan_out)."""

    W: list[torch.Tensor]
    b: list[torch.Tensor]

    @classmethod
    def of(cls, params: Params) -> "_Wide":
        """A view of ``params`` as one column (in-place updates reach ``params``)."""
        return cls([params.W[0].unsqueeze(2)] + [w.unsqueeze(1) for w in params.W[1:]],
                   [b.unsqueeze(1) for b in params.b])

    def column(self, m: int) -> Params:
        """Column m's K models as Params (views of the wide tensors)."""
        return Params([self.W[0][:, :, m]] + [w[:, m] for w in self.W[1:]],
                      [b[:, m] for b in self.b])

    def tensors(self) -> list[torch.Tensor]:
        return [t for pair in zip(self.W, self.b) for t in pair]


def _forward(wide: _Wide, x: torch.Tensor):
    """Layer inputs and logits in the feature-major layout the step keeps throughout:
    [a_0 = x^T (K, d, m), a_1 (K, M, hidden, m), ...] and logits (K, M, C, m), x (K, m, d).

    Every product is a batched (out x in) @ (in x batch) matmul, with transposed operands
    where the layout needs them (BLAS reads them in place): no permuted copies; and on the
    CPU this form is several times faster than (batch x in) @ (in x out) for narrow heads
    (2 cores, 8 models, batch 500, 1024 -> 2: weight gradient 11.3 -> 1.3 ms, forward
    3.6 -> 1.0 ms; as fast at 32 outputs)."""
    K, m, d = x.shape
    M = wide.W[0].shape[2]
    xt = x.transpose(1, 2)
    z = torch.baddbmm(wide.b[0].reshape(K, -1, 1), wide.W[0].view(K, d, -1).transpose(1, 2), xt)
    z = z.view(K, M, -1, m)
    acts = [xt]
    for W, b in zip(wide.W[1:], wide.b[1:]):
        h = z.relu_()
        acts.append(h)
        i, o = W.shape[2:]
        z = torch.baddbmm(b.reshape(K * M, o, 1), W.view(K * M, i, o).transpose(1, 2),
                          h.view(K * M, i, m)).view(K, M, o, m)
    return acts, z


def _backprop(wide: _Wide, acts, z, onehot):
    """Per-example backprop signals g_l = d loss_i / d z_l of each layer, (K, M, fan_out, m);
    ``onehot`` (K, C, m).

    Softmax cross-entropy: g_L = softmax(z_L) - onehot(y); through a ReLU layer
    g_{l-1} = (W_l g_l) * 1[z_{l-1} > 0].
    """
    g = torch.softmax(z, dim=2).sub_(onehot.unsqueeze(1))
    gs = [g]
    K, M, _, m = z.shape
    for l in range(len(wide.W) - 1, 0, -1):
        i, o = wide.W[l].shape[2:]
        g = torch.bmm(wide.W[l].view(K * M, i, o), g.view(K * M, o, m)).view(K, M, i, m)
        gs.append(g.mul_(acts[l] > 0))
    return gs[::-1]


def _sq_grad_norms(acts, gs, sq_in):
    """||grad_i||^2 = sum_l (||a_{l,i}||^2 + 1) ||g_{l,i}||^2, (K, M, m); ``sq_in`` (K, m) =
    ||x_i||^2 + 1."""
    sq = sq_in.unsqueeze(1) * gs[0].square().sum(2)
    for a, g in zip(acts[1:], gs[1:]):
        sq += (a.square().sum(2) + 1) * g.square().sum(2)
    return sq


def _as_params_input(params: Params, x: torch.Tensor) -> torch.Tensor:
    """x (m, d) on the params' device and dtype, shared by the K models: (K, m, d)."""
    return x.to(params.W[0].device, params.W[0].dtype).expand(params.K, -1, -1)


def logits(params: Params, x: torch.Tensor, model: ModelSpec) -> torch.Tensor:
    """Logits (K, m, n_classes) of the K models on x (m, in_dim), returned on x's device."""
    params.check(model)
    with torch.no_grad():
        z = _forward(_Wide.of(params), _as_params_input(params, x))[1]
        return z[:, 0].transpose(1, 2).to(x.device)


def losses(params: Params, x: torch.Tensor, y: torch.Tensor, model: ModelSpec) -> torch.Tensor:
    """Per-example cross-entropy losses (K, m) of the K models on (x, y)."""
    z = torch.log_softmax(logits(params, x, model), dim=-1)
    return -z.gather(-1, y.to(z.device).view(1, -1, 1).expand(z.shape[0], -1, 1)).squeeze(-1)


def grad_norms(params: Params, x: torch.Tensor, y: torch.Tensor, model: ModelSpec) -> torch.Tensor:
    """Per-example gradient norms ||grad_theta loss_i|| (K, m), all layers jointly, unclipped."""
    params.check(model)
    with torch.no_grad():
        xb, wide = _as_params_input(params, x), _Wide.of(params)
        acts, z = _forward(wide, xb)
        onehot = torch.nn.functional.one_hot(y.to(z.device), model.n_classes).to(z.dtype)
        gs = _backprop(wide, acts, z, onehot.T.expand(params.K, -1, -1))
        sq = _sq_grad_norms(acts, gs, xb.square().sum(-1) + 1)
        return sq.squeeze(1).sqrt_().to(x.device)


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


def last_iterate_scores(theta0: Params, thetaT: Params, directions: torch.Tensor) -> torch.Tensor:
    """Last-iterate canary scores <theta_0 - theta_T, g_j>, (K, m) float64 (higher = "in").

    ``theta0`` of K models or of one (the shared "fixed" init), ``thetaT`` of K models,
    ``directions`` (m, P) as in :class:`GradientCanaries`. For the "glorot" init, theta_0 of
    the models trained with ``seeds`` is ``init_params(model, K, seeds, cfg.init_scale,
    device=<the training device>)``: the generators are device-specific, so an init drawn on
    another device is another init (mixing devices here raises torch's device error).
    """
    step = flatten(theta0).double() - flatten(thetaT).double()
    return step @ directions.to(step.device, torch.float64).T


def dirac_canaries(model: ModelSpec, m: int, clip: float, seed, candidates=None, *,
                   dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """m Dirac gradient canaries (m, P): rows C * e_{c_j} at m distinct coordinates c_j.

    The coordinates are drawn uniformly without replacement (``numpy.random.default_rng
    (seed)``) among ``candidates`` (indices into the flattened layout of :func:`flatten`),
    by default the weights of the first layer. Why there: any direction of norm C is a
    valid insertion for DP-SGD's guarantee, but the data's clipped gradients moving the
    canary's coordinate add to the score's noise. A first-layer weight W_0[i, h] receives
    x_i g_h from each example, small where the input feature i is mostly zero (the border
    pixels of FMNIST), whereas the biases and the head receive a term from every example.
    The first layer also holds nearly all parameters (25,088 of 25,186 for 784 -> 32 -> 2),
    so m ~ 1000 distinct coordinates are easily found, and distinct coordinates make the
    canaries orthogonal: one canary's insertions do not enter another's score (only through
    the training dynamics). Weights of an input feature that is 0 on every training example
    get no data gradient and do not affect the forward pass at all; with those as
    ``candidates`` (rows i of W_0: coordinates i * fan_out + h) the score is exactly
    lr / B * (C^2 * #sampled steps + C * noise), the Gaussian mechanism of the analysis.
    """
    P = model.n_params
    if candidates is None:
        candidates = np.arange(model.shapes[0][0] * model.shapes[0][1])
    candidates = np.unique(np.asarray(candidates, dtype=np.int64))
    if candidates.size == 0 or candidates[0] < 0 or candidates[-1] >= P:
        raise ValueError(f"dirac_canaries: candidates must be indices in [0, {P})")
    if isinstance(m, bool) or int(m) != m or not 1 <= m <= candidates.size:
        raise ValueError(f"dirac_canaries: m={m} must be an integer in [1, {candidates.size}] "
                         f"(the number of candidate coordinates)")
    if not clip > 0:
        raise ValueError(f"dirac_canaries: clip={clip} must be > 0")
    coords = np.random.default_rng(seed).choice(candidates, int(m), replace=False)
    directions = torch.zeros(int(m), P, dtype=dtype, device=resolve(device))
    directions[torch.arange(int(m), device=directions.device),
               torch.as_tensor(coords, device=directions.device)] = clip
    return directions


@dataclass(frozen=True)
class GradientCanaries:
    """m gradient canaries for a white-box one-run audit (see the module docstring).

    directions: (m, P) float, row j the canary's vector g_j in the layout of :func:`flatten`;
    every row must have L2 norm ``cfg.clip`` (within 1e-5 relative), the most one clipped
    example can contribute. included: (K, m) bool, canary j is inserted into model k's run
    (the k-th seed of the trainer) iff included[k, j]. rate: the probability with which an
    included canary is added at each step, independently across steps, canaries and models;
    None = the data's rate q = batch_size / n. The sampling draws come from each model's own
    canary stream and do not depend on ``included`` or ``rate`` (a run with a canary in and
    one with it out are paired: u[k, t, j] < rate decides at every step).
    Extra memory: the directions on the device, and (K, chunk_steps, m) bytes of draws.
    """

    directions: torch.Tensor
    included: torch.Tensor
    rate: float | None = None

    def __post_init__(self):
        d, inc, rate = self.directions, self.included, self.rate
        if not isinstance(d, torch.Tensor) or d.dim() != 2 or d.shape[0] < 1 \
                or not d.is_floating_point():
            got = tuple(d.shape) if isinstance(d, torch.Tensor) else type(d).__name__
            raise ValueError(f"canaries.directions: must be a floating (m, P) tensor with "
                             f"m >= 1; got {got}")
        if not isinstance(inc, torch.Tensor) or inc.dtype != torch.bool or inc.dim() != 2 \
                or inc.shape[1] != d.shape[0]:
            got = (f"{inc.dtype} {tuple(inc.shape)}" if isinstance(inc, torch.Tensor)
                   else type(inc).__name__)
            raise ValueError(f"canaries.included: must be a bool (K, m={d.shape[0]}) tensor; "
                             f"got {got}")
        try:
            ok = rate is None or (not isinstance(rate, bool) and 0 < float(rate) <= 1)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ValueError(f"canaries.rate={rate!r}: must be in (0, 1] (or None: the data's "
                             f"rate batch_size / n)")

    def check(self, model: ModelSpec, clip: float, K: int) -> None:
        """Shapes against the model and the K trained models; norms equal to ``clip``."""
        m, P = self.directions.shape
        if P != model.n_params:
            raise ValueError(f"canaries.directions: {P} columns, but the model has "
                             f"P={model.n_params} parameters")
        if self.included.shape[0] != K:
            raise ValueError(f"canaries.included: {self.included.shape[0]} rows for K={K} models")
        # In the directions' dtype: float32 rounding (< 1e-6 relative) is far below 1e-5.
        norms = torch.linalg.vector_norm(self.directions, dim=1).double()
        bad = ~((norms - clip).abs() <= 1e-5 * clip)  # also catches nan/inf
        if bad.any():
            j = int(bad.nonzero()[0])
            raise ValueError(f"canaries.directions: every row must have L2 norm "
                             f"DPSGDConfig.clip={clip} (within 1e-5 relative); {int(bad.sum())} "
                             f"of {m} do not, e.g. row {j}: {float(norms[j])}")


class CanaryRun(NamedTuple):
    """What the trainer returns with ``canaries=``: the trained Params; ``scores`` (K, m)
    float64, sum_t <theta_t - theta_{t+1}, g_j> (higher = "in"), which telescopes to the
    last-iterate score; and ``llr`` (K, m), the all-iterates test: the sum over steps of the
    log likelihood ratio log(1 - q + q exp(mu z_t - mu^2 / 2)) of "canary j sampled at rate
    q" against "absent", with z_t = <theta_t - theta_{t+1}, g_j> / (lr / B * noise_std * C)
    and mu = C / noise_std (the data's gradients ignored): an auditor who sees every
    iterate weighs each step by how likely it holds the canary, which a sum of inner
    products cannot. None without noise (where it is undefined)."""

    params: Params
    scores: torch.Tensor
    llr: torch.Tensor | None = None


class _CanaryHook:
    """The trainer's canary work: per chunk one draw per model; per step the sampled sum
    (K, m) x (m, P) added to the update, and the score update (K, P) x (P, m) of the step.
    Dirac canaries (one nonzero per row) take an index_add and a gather instead."""

    def __init__(self, canaries: GradientCanaries, rate: float, states, params: Params, dev,
                 dtype, step_size: float, noise_std: float, clip: float):
        d = canaries.directions.to(dev)
        K, (m, P) = params.K, d.shape
        self.K, self.m, self.rate, self.dev, self.dtype = K, m, float(rate), dev, dtype
        self.included = canaries.included.to(dev)
        self.gens = [_generator(None, _CANARY, dev, st) for st in states]
        self.scores = torch.zeros(K, m, device=dev, dtype=torch.float64)
        # Per-step likelihood ratio: z = <step, g> / (step_size noise_std C) is N(0, 1) from
        # the noise plus mu = C / noise_std when the canary was added (data ignored).
        self.llr = torch.zeros(K, m, device=dev, dtype=torch.float64) if noise_std > 0 else None
        if self.llr is not None:
            self.z_scale = 1.0 / (step_size * noise_std * clip)
            self.mu = clip / noise_std
            self.log_out, self.log_in = math.log1p(-self.rate) if self.rate < 1 else -math.inf, \
                math.log(self.rate) - self.mu ** 2 / 2
        self.csum = torch.empty(K, P, device=dev, dtype=dtype)
        self.flat = flatten(params)
        if bool((torch.linalg.vector_norm(d, 0, dim=1) == 1).all()):  # nonzeros per row
            self.coords = torch.nonzero(d)[:, 1]  # row-major: row j's coordinate is entry j
            self.values = d[torch.arange(m, device=dev), self.coords].double()
            self.values_dt = self.values.to(dtype)
            self.dirs = None
            self.prev = self.flat.index_select(1, self.coords).double()  # (K, m)
        else:
            self.dirs = d.to(dtype)
            self.prev, self.step = self.flat.clone(), torch.empty_like(self.flat)

    def draw(self, S: int) -> None:
        """Which included canaries are sampled at each of the next S steps, (K, S, m) bool."""
        self.sampled = torch.empty(self.K, S, self.m, device=self.dev, dtype=torch.bool)

        def fill(k):
            u = torch.rand(S, self.m, generator=self.gens[k], device=self.dev)
            torch.lt(u, self.rate, out=self.sampled[k])

        _each_model(fill, self.K, self.dev)
        self.sampled &= self.included.unsqueeze(1)

    def add(self, params: Params, s: int, step_size: float) -> None:
        """theta -= step_size * (sum of the canaries sampled at step s of the chunk)."""
        hit = self.sampled[:, s].to(self.dtype)  # (K, m)
        if self.dirs is None:
            self.csum.zero_().index_add_(1, self.coords, hit.mul_(self.values_dt))
        else:
            torch.matmul(hit, self.dirs, out=self.csum)
        for param, c in zip(_tensors(params), _noise_views(self.csum, params)):
            param.sub_(c, alpha=step_size)

    def observe(self, params: Params) -> None:
        """scores += <theta_t - theta_{t+1}, g_j>, after the step to theta_{t+1}."""
        torch.cat([t.reshape(self.K, -1) for t in _tensors(params)], dim=1, out=self.flat)
        if self.dirs is None:
            new = self.flat.index_select(1, self.coords).double()
            step = (self.prev - new).mul_(self.values)
            self.prev = new
        else:
            torch.sub(self.prev, self.flat, out=self.step)
            step = (self.step @ self.dirs.T).double()
            self.prev, self.flat = self.flat, self.prev
        self.scores.add_(step)
        if self.llr is not None:  # log(1 - q + q exp(mu z - mu^2 / 2)) per step
            self.llr.add_(torch.logaddexp(torch.full_like(step, self.log_out),
                                          step.mul_(self.z_scale * self.mu).add_(self.log_in)))


@contextmanager
def matmul_precision(name: str):
    """Within this scope the trainer computes its float32 matmuls in precision ``name``:
    ``"fp32"`` (also the default outside any scope: exact float32 products, whatever torch's
    global TF32 setting) or ``"tf32"`` (on CUDA, TensorFloat-32 tensor-core products of
    float32 inputs rounded to 10 fraction bits, accumulated in float32; on the CPU, which
    has none, the same as fp32).

    Privacy under TF32. The per-example norms come from elementwise float32 squares of the
    activations a and backprop signals g that the step uses (some of them outputs of TF32
    products: any function of one example and the weights is fine); the clipped sum of a
    layer, a^T (c * g), is a TF32 product whose inputs are rounded entrywise, each by a
    relative 2^-10 at most (:data:`TF32_REL`), so example i adds the outer product of
    vectors up to (1 + 2^-10) times longer than those its norm was computed from: up to
    (1 + 2^-10)^2 C (biases are summed in float32). The trainer therefore clips to
    C / (1 + 2^-10)^2 (0.2% less) under TF32, so that every example adds at most C, the
    sensitivity the noise is calibrated to, to float32 rounding as in fp32 mode. Gradient
    canaries are refused under TF32. docs/scale.md has the argument in full."""
    if name not in PRECISIONS:
        raise ValueError(f"matmul_precision={name!r}: must be one of {PRECISIONS}")
    token = _PRECISION.set(name)
    try:
        yield
    finally:
        _PRECISION.reset(token)


def _tf32(dev: torch.device) -> bool:
    """Whether the trainer's products on ``dev`` are TF32 (:func:`matmul_precision`)."""
    return dev.type == "cuda" and _PRECISION.get() == "tf32"


def _clip_scale(dev: torch.device) -> float:
    """The factor on every clipping norm: 1, or (1 + 2^-10)^-2 under TF32 (the margin for
    the rounding of the clipped sum's inputs, :func:`matmul_precision`)."""
    return (1 + TF32_REL) ** -2 if _tf32(dev) else 1.0


@contextmanager
def _cuda_matmuls(dev: torch.device):
    """torch's CUDA float32 matmul setting as :func:`matmul_precision` says, restored on
    exit (torch's newer per-backend setting; reading the legacy ``allow_tf32`` after it is
    set raises)."""
    mm = torch.backends.cuda.matmul
    if dev.type != "cuda":
        yield
        return
    want = "tf32" if _tf32(dev) else "ieee"
    if hasattr(mm, "fp32_precision"):
        saved, mm.fp32_precision = mm.fp32_precision, want
    else:  # torch < 2.9
        saved, mm.allow_tf32 = mm.allow_tf32, want == "tf32"
    try:
        yield
    finally:
        if hasattr(mm, "fp32_precision"):
            mm.fp32_precision = saved
        else:
            mm.allow_tf32 = saved


def _columns(cfg, noise_std) -> tuple[list[DPSGDConfig], list[float]]:
    """The columns (one DPSGDConfig each) and their noise stds; a ValueError unless they
    share what every column of one call must: epochs, batch size, learning rate, sampling."""
    cols = [cfg] if isinstance(cfg, DPSGDConfig) else list(cfg)
    if not cols or not all(isinstance(c, DPSGDConfig) for c in cols):
        raise ValueError("train: cfg must be a DPSGDConfig or a non-empty sequence of them")
    stds = [noise_std] * len(cols) if np.ndim(noise_std) == 0 else list(noise_std)
    if len(stds) != len(cols):
        raise ValueError(f"train: {len(stds)} noise stds for {len(cols)} columns")
    for m, c in enumerate(cols[1:], 1):
        for field in _SHARED:
            if getattr(c, field) != getattr(cols[0], field):
                raise ValueError(f"train: every column must have the same {field} (the columns "
                                 f"share batches); column {m} has {getattr(c, field)!r}, "
                                 f"column 0 {getattr(cols[0], field)!r}")
    for std in stds:
        if not std >= 0:
            raise ValueError(f"noise_std={std}: must be >= 0")
    return cols, [float(v) for v in stds]


#: What the columns of one training call share (they train on the same batches).
_SHARED = ("epochs", "batch_size", "lr", "sampling")


def _initial(model: ModelSpec, cols: list[DPSGDConfig], init: Params | None, states, dev,
             dtype) -> _Wide:
    """The K x M initial weights: each seed's Glorot draw (one per seed, whatever the
    columns) times each "glorot" column's scale; ``init`` for the "fixed" columns."""
    K, M = len(states), len(cols)
    if any(c.init == "fixed" for c in cols):
        if init is None or init.K != 1:
            raise ValueError("DPSGDConfig.init='fixed': pass init= the Params of one model")
        init.check(model)
    elif init is not None:
        raise ValueError("train: init= is only used with DPSGDConfig.init='fixed'")
    W = [torch.empty(K, i, M, o, device=dev, dtype=dtype) for i, o in model.shapes[:1]]
    W += [torch.empty(K, M, i, o, device=dev, dtype=dtype) for i, o in model.shapes[1:]]
    b = [torch.zeros(K, M, o, device=dev, dtype=dtype) for _, o in model.shapes]
    wide = _Wide(W, b)
    glorot = [m for m, c in enumerate(cols) if c.init == "glorot"]
    if glorot:
        draws = [torch.stack(ws) for ws in zip(*(
            _glorot_draw(model, _generator(None, _INIT, dev, st), dev, dtype) for st in states))]
    for m, c in enumerate(cols):
        col = wide.column(m)
        if c.init == "fixed":
            for t, v in zip(_tensors(col), _tensors(init)):
                t.copy_(v.to(dev, dtype).expand_as(t))
        else:
            for w, d in zip(col.W, draws):
                w.copy_(d).mul_(c.init_scale)
    return wide


def epoch_ends(cfg: DPSGDConfig, n: int) -> list[int]:
    """The step counts after which epochs 1, 2, ... end on n examples: multiples of the
    steps per epoch ("shuffle"); ``round(e n / B)`` ("poisson", whose epochs are n / B
    steps on average, the last one ``steps(n)`` for whole ``epochs``)."""
    if cfg.sampling == "shuffle":
        return [e * cfg.steps_per_epoch(n) for e in range(1, int(cfg.epochs) + 1)]
    return [round(e * n / cfg.batch_size) for e in range(1, math.floor(cfg.epochs) + 1)]


def _train(X, y, model: ModelSpec, cols: list[DPSGDConfig], stds: list[float], seeds, init,
           device, progress, canaries, lr_schedule=None, on_epoch=None):
    K, M, dev = len(seeds), len(cols), resolve(device)
    cfg = cols[0]
    if K < 1:
        raise ValueError("train: seeds must name at least one model")
    if len(set(seeds)) != K:
        raise ValueError("train: seeds must be distinct (equal seeds give identical models)")
    n = X.shape[0]
    if X.dim() != 2 or X.shape[1] != model.in_dim or y.shape != (n,):
        raise ValueError(f"train: X must be (n, {model.in_dim}) and y (n,); got {tuple(X.shape)}"
                         f" and {tuple(y.shape)}")
    if cfg.batch_size > n:
        raise ValueError(f"DPSGDConfig.batch_size={cfg.batch_size}: must be <= n={n}")
    if canaries is not None:
        if not isinstance(canaries, GradientCanaries):
            raise ValueError(f"canaries: must be a GradientCanaries or None, not "
                             f"{type(canaries).__name__}")
        if M != 1:
            raise ValueError(f"canaries: train one column at a time with gradient canaries "
                             f"(got {M} columns)")
        canaries.check(model, cfg.clip, K)
        if lr_schedule is not None:
            raise ValueError("canaries: the canary scores assume a constant learning rate; "
                             "pass lr_schedule=None")
    if int(y.min()) < 0 or int(y.max()) >= model.n_classes:
        raise ValueError(f"train: labels must be in [0, {model.n_classes})")
    if canaries is not None and _tf32(dev):
        raise ValueError("canaries: train with matmul_precision('fp32') (TF32 would round "
                         "the canaries and their scores)")
    dtype = X.dtype if X.is_floating_point() else torch.float32
    states = [_stream_states(s) for s in seeds]  # one spawn per seed, for every stream
    wide = _initial(model, cols, init, states, dev, dtype)

    # Data on the device once; batches are gathered by index, once per seed for all columns.
    X = X.to(dev, dtype)
    onehot = torch.nn.functional.one_hot(y.to(dev), model.n_classes).to(dtype)
    sq_in = torch.linalg.vector_norm(X, dim=1).square_().add_(1)  # ||(x_i; 1)||^2, fixed
    batch_gens = [_generator(None, _BATCH, dev, st) for st in states]
    noise_gens = [_generator(None, _NOISE, dev, st) for st in states]
    clip = torch.tensor([c.clip * _clip_scale(dev) for c in cols], device=dev,
                        dtype=dtype).view(M, 1)

    B, P, d = cfg.batch_size, model.n_params, model.in_dim
    step_size = cfg.lr / B
    chunk, T = cfg.chunk_steps(n), cfg.steps(n)
    # One unscaled noise draw per seed, scaled per column: std_m for each layer's layout.
    noisy = any(v > 0 for v in stds)
    noise = torch.empty(K, chunk, P, device=dev, dtype=dtype) if noisy else None
    std = torch.tensor(stds, device=dev, dtype=dtype)
    std_views = [std.view(1, 1, M, 1), std.view(1, M, 1)] + \
        [std.view(1, M, 1, 1), std.view(1, M, 1)] * (len(model.shapes) - 1)
    x_buf = torch.empty(0, device=dev, dtype=dtype)
    hook = None if canaries is None else _CanaryHook(
        canaries, cfg.batch_size / n if canaries.rate is None else canaries.rate, states,
        wide.column(0), dev, dtype, step_size, stds[0], cfg.clip)
    ends = epoch_ends(cfg, n) if on_epoch is not None else []
    done, epoch = 0, 0
    while done < T:
        S = min(chunk, T - done)
        batches = _sample_batches(cfg, n, S, batch_gens, dev, dtype)
        if noise is not None:
            _each_model(lambda k: torch.randn(S, P, generator=noise_gens[k], out=noise[k, :S]),
                        K, dev)
        if hook is not None:
            hook.draw(S)
        for s, (idx, valid) in enumerate(batches):
            if lr_schedule is not None:
                lr = lr_schedule(done + s)
                if not 0 < lr < math.inf:
                    raise ValueError(f"lr_schedule({done + s})={lr!r}: must be > 0 and finite")
                step_size = lr / B
            flat_idx = idx.reshape(-1)
            if x_buf.numel() < flat_idx.numel() * d:
                x_buf = torch.empty(flat_idx.numel() * d, device=dev, dtype=dtype)
            xb = x_buf[:flat_idx.numel() * d].view(K, -1, d)
            torch.index_select(X, 0, flat_idx, out=xb.view(-1, d))
            acts, z = _forward(wide, xb)
            gs = _backprop(wide, acts, z, onehot.index_select(0, flat_idx)
                           .view(K, -1, model.n_classes).transpose(1, 2))
            sq = _sq_grad_norms(acts, gs, sq_in.index_select(0, flat_idx).view(K, -1))
            c = torch.div(clip, sq.sqrt_()).clamp_(max=1.0)  # (K, M, b)
            if valid is not None:
                c.mul_(valid.unsqueeze(1))
            for l, (a, g) in enumerate(zip(acts, gs)):
                g = g.mul_(c.unsqueeze(2))  # (K, M, fan_out, b)
                nb = g.shape[-1]
                if l == 0:  # every column's first layer: one matmul per seed
                    wide.W[0].view(K, d, -1).baddbmm_(a, g.view(K, -1, nb).transpose(1, 2),
                                                      alpha=-step_size)
                else:
                    i, o = wide.W[l].shape[2:]
                    wide.W[l].view(K * M, i, o).baddbmm_(
                        a.view(K * M, i, nb), g.view(K * M, o, nb).transpose(1, 2),
                        alpha=-step_size)
                wide.b[l].sub_(g.sum(-1), alpha=step_size)
            if hook is not None:
                hook.add(hook_params := wide.column(0), s, step_size)
            if noise is not None:
                for j, (t, eps, sv) in enumerate(zip(wide.tensors(),
                                                     _noise_views(noise[:, s], model), std_views)):
                    t.addcmul_(eps.unsqueeze(2 if j == 0 else 1), sv, value=-step_size)
            if hook is not None:
                hook.observe(hook_params)
            if epoch < len(ends) and done + s + 1 == ends[epoch]:
                epoch += 1
                on_epoch(epoch, [wide.column(m) for m in range(M)])
        done += S
        if progress is not None:
            progress(done, T)
    columns = [wide.column(m) for m in range(M)]
    if hook is not None:
        return CanaryRun(columns[0], hook.scores, hook.llr)
    return [Params([w.contiguous() for w in p.W], [b.contiguous() for b in p.b])
            for p in columns]


def train_with_noise_std(X: torch.Tensor, y: torch.Tensor, model: ModelSpec,
                         cfg: DPSGDConfig | Sequence[DPSGDConfig], seeds: Sequence[int],
                         noise_std, init: Params | None = None, device=None,
                         progress: Callable[[int, int], None] | None = None,
                         *, canaries: GradientCanaries | None = None,
                         lr_schedule: Callable[[int], float] | None = None,
                         on_epoch: Callable[[int, list[Params]], None] | None = None):
    """Train K = len(seeds) models per column by DP-SGD with noise std ``noise_std`` on the
    clipped sum.

    X (n, in_dim) float, y (n,) int labels in [0, n_classes). Model k's initialisation
    (cfg.init == "glorot"), batches and noise are drawn from generators derived from
    ``seeds[k]`` only. With cfg.init == "fixed", ``init`` is a Params of one model that
    every model starts from. Computes in X's floating dtype on ``device`` (default: CUDA
    when available, else CPU); returns the trained Params there. ``progress(step, steps)``
    is called after every chunk of steps (:meth:`DPSGDConfig.chunk_steps`).

    Columns: ``cfg`` a sequence of M configs (and ``noise_std`` one value or M) trains M
    models per seed at once, one per column, which differ in clip, noise and init (Glorot
    scale or "fixed") and share epochs, batch size, lr and sampling. Every column of seed k
    sees seed k's batches, its noise draw (times the column's std) and its Glorot draw
    (times the column's scale), so column m's models are those a call with ``cfg[m]`` alone
    trains, to float rounding; the gather, the sampling and the noise draws are done once
    per seed, and the first layer of all columns is one matmul. Returns a list of M Params.

    ``canaries``: gradient canaries (:class:`GradientCanaries`, row k of ``included`` for
    model ``seeds[k]``; one column only); then returns a :class:`CanaryRun`
    ``(params, scores)`` with the all-iterates scores (K, m) float64. Without them, the
    Params only.

    ``lr_schedule(t)``: the learning rate of step t = 0, 1, ... (every column), in place of
    ``cfg.lr`` (e.g. Abadi et al.'s linear decay over the first epochs); not with canaries.
    ``on_epoch(e, params)``: called after the last step of every whole epoch e = 1, 2, ...
    (:func:`epoch_ends`) with the M columns' current Params, views of the weights being
    trained: read them (evaluate, copy), never change them. Neither changes any random draw,
    and the hook leaves the trained models as they are without it.
    """
    cols, stds = _columns(cfg, noise_std)
    with _cuda_matmuls(resolve(device)):
        out = _train(X, y, model, cols, stds, list(seeds), init, device, progress, canaries,
                     lr_schedule, on_epoch)
    return out[0] if isinstance(cfg, DPSGDConfig) and isinstance(out, list) else out


def _each_model(fill: Callable[[int], object], K: int, dev: torch.device) -> None:
    """``fill(k)`` for every model k; on the CPU in parallel threads, since torch samples
    from one generator on one thread (the noise draws were a quarter of a CPU step). The
    models' generators are independent, so the numbers do not depend on the threading."""
    threads = torch.get_num_threads()
    if dev.type != "cpu" or K == 1 or threads == 1:
        for k in range(K):
            fill(k)
        return
    with ThreadPoolExecutor(min(threads, K)) as pool:
        list(pool.map(fill, range(K)))


def _sample_batches(cfg: DPSGDConfig, n: int, S: int, gens, dev, dtype):
    """Index batches (K, b) of S steps for K = len(gens) models, each with a (K, b) 0/1
    weight mask (None when all entries count).

    "shuffle" (S a multiple of the steps per epoch): each epoch a uniformly random
    permutation per model, the argsort of n i.i.d. uniform keys (float64: ties have
    probability ~n^2 2^-54), cut into consecutive batches.
    "poisson": example j is in model k's batch at step s iff u[k, s, j] < q; the K
    batches of a step are padded to the largest one with entries of weight 0.
    """
    K = len(gens)
    if cfg.sampling == "shuffle":
        spe, B = cfg.steps_per_epoch(n), cfg.batch_size
        keys = torch.empty(K, S // spe, n, device=dev, dtype=torch.float64)
        for k, g in enumerate(gens):
            torch.rand(keys.shape[1:], generator=g, out=keys[k], dtype=torch.float64)
        perm = torch.argsort(keys, dim=-1, stable=True)
        return [(perm[:, e, s * B:(s + 1) * B], None)
                for e in range(S // spe) for s in range(spe)]
    u = torch.empty(K, S, n, device=dev)
    for k, g in enumerate(gens):
        torch.rand(S, n, generator=g, out=u[k])
    sel = u < cfg.batch_size / n
    counts = sel.sum(-1)  # (K, S)
    width = counts.amax(0).clamp_(min=1).tolist()  # one device sync per chunk
    kk, ss, jj = sel.nonzero(as_tuple=True)
    pos = sel.cumsum(-1).sub_(1)[kk, ss, jj]
    idx = torch.zeros(K, S, max(width), dtype=torch.long, device=dev)
    idx[kk, ss, pos] = jj
    valid = torch.arange(max(width), device=dev) < counts.unsqueeze(-1)
    return [(idx[:, s, :w], valid[:, s, :w].to(dtype)) for s, w in enumerate(width)]


def train(X: torch.Tensor, y: torch.Tensor, model: ModelSpec,
          cfg: DPSGDConfig | Sequence[DPSGDConfig], seeds: Sequence[int],
          init: Params | None = None, device=None,
          progress: Callable[[int, int], None] | None = None, *,
          canaries: GradientCanaries | None = None,
          lr_schedule: Callable[[int], float] | None = None,
          on_epoch: Callable[[int, list[Params]], None] | None = None):
    """DP-SGD, noise std ``noise_multiplier * clip`` of each column
    (:func:`train_with_noise_std`, which explains ``lr_schedule`` and ``on_epoch``): Params
    for one config, a list of Params for a sequence of configs; with ``canaries=``, a
    :class:`CanaryRun` (params, all-iterates scores)."""
    cols = [cfg] if isinstance(cfg, DPSGDConfig) else list(cfg)
    if not all(isinstance(c, DPSGDConfig) for c in cols):
        raise ValueError("train: cfg must be a DPSGDConfig or a non-empty sequence of them")
    stds = [c.noise_multiplier * c.clip for c in cols]
    return train_with_noise_std(X, y, model, cfg, seeds,
                                stds[0] if isinstance(cfg, DPSGDConfig) else stds, init=init,
                                device=device, progress=progress, canaries=canaries,
                                lr_schedule=lr_schedule, on_epoch=on_epoch)


def step_bytes(model: ModelSpec, n: int, cfg: DPSGDConfig, columns: int = 1,
               dtype_bytes: int = 4) -> int:
    """Bytes one seed adds to a training call of ``columns`` columns: its noise chunk
    (chunk_steps x P), its sampling draws for a chunk, its weights (and the layer
    gradients the step forms), and one step's gathered batch with every column's
    activations, backprop signals and their temporaries (:func:`_train`)."""
    S, B, P = cfg.chunk_steps(n), cfg.batch_size, model.n_params
    if cfg.sampling == "shuffle":  # float64 keys and int64 argsort per epoch of the chunk
        draws = 16 * (S // cfg.steps_per_epoch(n)) * n
        width = B
    else:  # float32 uniforms, bool mask, int64 cumsum and indices; batches padded
        draws = 21 * S * n
        width = B + 6 * math.isqrt(B) + 6
    outs = sum(o for _, o in model.shapes)
    noise = dtype_bytes * S * P
    weights = dtype_bytes * 2 * columns * P
    step = dtype_bytes * width * (model.in_dim + 6 * columns * outs)
    return noise + draws + weights + step


def seeds_per_call(model: ModelSpec, n: int, cfg: DPSGDConfig, columns: int = 1,
                   device=None, limit: int = 4096, jobs_per_gpu: int = 1) -> int:
    """How many seeds to train per :func:`train` call of ``columns`` columns, at most
    ``limit`` (e.g. the trials left to train on one data set).

    CPU: enough that K x columns >= 32 models (batching amortises the per-step overhead;
    benchmarks/bench_dpsgd.py). CUDA: as many as fit, by :func:`step_bytes`, in this job's
    share of half the card's memory, the card being shared by ``jobs_per_gpu`` training
    jobs (the workflow's ``jobs_per_gpu``), and never more than 90% of what is free now.
    """
    if isinstance(jobs_per_gpu, bool) or int(jobs_per_gpu) != jobs_per_gpu or jobs_per_gpu < 1:
        raise ValueError(f"jobs_per_gpu={jobs_per_gpu!r}: must be an integer >= 1")
    dev = resolve(device)
    if dev.type != "cuda":
        return max(1, min(limit, math.ceil(32 / columns)))
    free, total = torch.cuda.mem_get_info(dev)
    per_seed = step_bytes(model, n, cfg, columns)
    budget = min(total // (2 * int(jobs_per_gpu)), int(0.9 * free))
    return int(max(1, min(limit, budget // per_seed)))


__all__ = ["ModelSpec", "DPSGDConfig", "Params", "init_params", "save_params", "load_params",
           "logits", "losses", "grad_norms", "train", "train_with_noise_std", "seeds_per_call",
           "step_bytes", "epoch_ends", "GradientCanaries", "CanaryRun", "flatten",
           "last_iterate_scores", "dirac_canaries", "matmul_precision", "ARCHS", "SAMPLINGS",
           "INITS", "PRECISIONS", "TF32_REL"]
