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
two dense architectures are written out by hand. For a dense layer z = a W + b the
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

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

import numpy as np
import torch

from .device import resolve
from .io import atomic_path

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


@dataclass(frozen=True)
class ModelSpec:
    """A dense classifier: 'lr' (in_dim -> n_classes) or 'fnn' (in_dim -> hidden ReLU -> n_classes).

    Every layer has a bias. Softmax cross-entropy loss on the logits.
    """

    arch: str
    in_dim: int
    hidden: int = 32
    n_classes: int = 2

    def __post_init__(self):
        if self.arch not in ARCHS:
            raise ValueError(f"ModelSpec.arch={self.arch!r}: must be one of {ARCHS}")
        for name in ("in_dim", "hidden"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"ModelSpec.{name}={getattr(self, name)}: must be >= 1")
        if int(self.n_classes) < 2:
            raise ValueError(f"ModelSpec.n_classes={self.n_classes}: must be >= 2")

    @property
    def shapes(self) -> list[tuple[int, int]]:
        """(fan_in, fan_out) of each dense layer."""
        if self.arch == "lr":
            return [(self.in_dim, self.n_classes)]
        return [(self.in_dim, self.hidden), (self.hidden, self.n_classes)]

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


def _generator(seed: int, stream: int, device) -> torch.Generator:
    """Generator of one stream (init, batches, noise, canaries) derived from a model's seed."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed={seed!r}: must be an integer >= 0")
    child = np.random.SeedSequence(int(seed)).spawn(_STREAMS)[stream]
    state = child.generate_state(1, np.uint64)[0]
    return torch.Generator(device=device).manual_seed(int(state))


def init_params(model: ModelSpec, K: int, seed, scale: float = 1.0, *, device=None,
                dtype: torch.dtype = torch.float32) -> Params:
    """Glorot-normal initial weights of K models, times ``scale``; zero biases.

    Keras ``glorot_normal`` (used by the reference code): N(0, s'^2) truncated to
    [-2 s', 2 s'] with s' = sqrt(2 / (fan_in + fan_out)) / 0.8796..., so that the weights
    have variance 2 / (fan_in + fan_out) (Glorot & Bengio 2010).

    ``seed``: an int (all K models drawn in turn from its init stream), or a sequence of K
    ints, model k from the init stream of ``seed[k]`` (what :func:`train` does, so
    ``init_params(model, 1, [s])`` is the initialisation of the model trained with seed s).
    """
    dev = resolve(device)
    if isinstance(seed, (int, np.integer)):
        gens = [_generator(seed, _INIT, dev)] * K
    else:
        if len(seed) != K:
            raise ValueError(f"init_params: {len(seed)} seeds for K={K} models")
        gens = [_generator(s, _INIT, dev) for s in seed]
    W = [torch.empty(K, i, o, device=dev, dtype=dtype) for i, o in model.shapes]
    b = [torch.zeros(K, o, device=dev, dtype=dtype) for _, o in model.shapes]
    for k, g in enumerate(gens):
        for w, (i, o) in zip(W, model.shapes):
            s = math.sqrt(2.0 / (i + o)) / _TRUNC2_STD
            torch.nn.init.trunc_normal_(w[k], 0.0, s, -2 * s, 2 * s, generator=g)
    for w in W:
        w.mul_(scale)
    return Params(W, b)


def save_params(path, params: Params, model: ModelSpec) -> None:
    """Save weights (e.g. the shared "fixed" init, or a few trained models) with their spec."""
    with atomic_path(path) as tmp:
        torch.save({"model": vars(model), "W": [w.detach().cpu() for w in params.W],
                    "b": [b.detach().cpu() for b in params.b]}, tmp)


def load_params(path, device=None) -> tuple[Params, ModelSpec]:
    """Load what :func:`save_params` saved: ``(params, model)`` (params on ``device`` or CPU)."""
    blob = torch.load(path, map_location=device or "cpu", weights_only=True)
    model = ModelSpec(**blob["model"])
    params = Params(blob["W"], blob["b"])
    params.check(model)
    return params, model


def _narrow(W: torch.Tensor) -> bool:
    """A layer with few outputs (the 2-class heads): its batched matmuls run several times
    faster on the CPU as (out x in) @ (in x batch) than as (batch x in) @ (in x out)
    (2 cores, 8 models, batch 500, 1024 -> 2: weight gradient 11.3 -> 1.3 ms, forward
    3.6 -> 1.0 ms; at 32 outputs the plain form is as fast)."""
    return W.shape[-1] < 8


def _forward(params: Params, x: torch.Tensor):
    """Layer inputs [a_0 = x, a_1, ...] and logits; x is (m, d) shared or (K, m, d)."""
    acts, h = [x], x
    last = len(params.W) - 1
    for l, (W, b) in enumerate(zip(params.W, params.b)):
        if h.dim() == 2:
            z = torch.matmul(h, W).add_(b.unsqueeze(1))
        elif _narrow(W):
            z = torch.bmm(W.transpose(1, 2).contiguous(), h.transpose(1, 2)).transpose(1, 2)
            z = z.add(b.unsqueeze(1))
        else:
            z = torch.baddbmm(b.unsqueeze(1), h, W)
        if l < last:
            h = z.relu_()
            acts.append(h)
    return acts, z


def _backprop(params: Params, acts, z, onehot):
    """Per-example backprop signals g_l = d loss_i / d z_l of each layer, (K, m, fan_out).

    Softmax cross-entropy: g_L = softmax(z_L) - onehot(y); through a ReLU layer
    g_{l-1} = (g_l W_l^T) * 1[z_{l-1} > 0].
    """
    g = torch.softmax(z, dim=-1).sub_(onehot)
    gs = [g]
    for l in range(len(params.W) - 1, 0, -1):
        g = torch.bmm(g, params.W[l].transpose(1, 2)).mul_(acts[l] > 0)
        gs.append(g)
    return gs[::-1]


def _sq_grad_norms(acts, gs, sq_in):
    """||grad_i||^2 = sum_l (||a_{l,i}||^2 + 1) ||g_{l,i}||^2; ``sq_in`` = ||x_i||^2 + 1."""
    sq = sq_in * gs[0].square().sum(-1)
    for a, g in zip(acts[1:], gs[1:]):
        sq += (a.square().sum(-1) + 1) * g.square().sum(-1)
    return sq


def _as_params_input(params: Params, x: torch.Tensor) -> torch.Tensor:
    return x.to(params.W[0].device, params.W[0].dtype)


def logits(params: Params, x: torch.Tensor, model: ModelSpec) -> torch.Tensor:
    """Logits (K, m, n_classes) of the K models on x (m, in_dim), returned on x's device."""
    params.check(model)
    with torch.no_grad():
        return _forward(params, _as_params_input(params, x))[1].to(x.device)


def losses(params: Params, x: torch.Tensor, y: torch.Tensor, model: ModelSpec) -> torch.Tensor:
    """Per-example cross-entropy losses (K, m) of the K models on (x, y)."""
    z = torch.log_softmax(logits(params, x, model), dim=-1)
    return -z.gather(-1, y.to(z.device).view(1, -1, 1).expand(z.shape[0], -1, 1)).squeeze(-1)


def grad_norms(params: Params, x: torch.Tensor, y: torch.Tensor, model: ModelSpec) -> torch.Tensor:
    """Per-example gradient norms ||grad_theta loss_i|| (K, m), all layers jointly, unclipped."""
    params.check(model)
    with torch.no_grad():
        xb = _as_params_input(params, x).expand(params.K, -1, -1)
        acts, z = _forward(params, xb)
        onehot = torch.nn.functional.one_hot(y.to(z.device), model.n_classes).to(z.dtype)
        gs = _backprop(params, acts, z, onehot)
        return _sq_grad_norms(acts, gs, xb[0].square().sum(-1) + 1).sqrt_().to(x.device)


def _noise_views(noise: torch.Tensor, params: Params):
    """Per-layer views (W_0, b_0, W_1, b_1, ...) of a (K, P) noise row, laid out row-major."""
    views, off = [], 0
    for w in params.W:
        i, o = w.shape[1:]
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
    directions[torch.arange(int(m)), torch.as_tensor(coords, device=directions.device)] = clip
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

    def __init__(self, canaries: GradientCanaries, rate: float, seeds, params: Params, dev,
                 dtype, step_size: float, noise_std: float, clip: float):
        d = canaries.directions.to(dev)
        K, (m, P) = params.K, d.shape
        self.K, self.m, self.rate, self.dev, self.dtype = K, m, float(rate), dev, dtype
        self.included = canaries.included.to(dev)
        self.gens = [_generator(s, _CANARY, dev) for s in seeds]
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


def train_with_noise_std(X: torch.Tensor, y: torch.Tensor, model: ModelSpec, cfg: DPSGDConfig,
                         seeds: Sequence[int], noise_std: float, init: Params | None = None,
                         device=None, progress: Callable[[int, int], None] | None = None,
                         *, canaries: GradientCanaries | None = None) -> Params | CanaryRun:
    """Train K = len(seeds) models by DP-SGD with noise std ``noise_std`` on the clipped sum.

    X (n, in_dim) float, y (n,) int labels in [0, n_classes). Model k's initialisation
    (cfg.init == "glorot"), batches and noise are drawn from generators derived from
    ``seeds[k]`` only. With cfg.init == "fixed", ``init`` is a Params of one model that
    every model starts from. Computes in X's floating dtype on ``device`` (default: CUDA
    when available, else CPU); returns the trained Params there. ``progress(step, steps)``
    is called after every chunk of steps (:meth:`DPSGDConfig.chunk_steps`).

    ``canaries``: gradient canaries (:class:`GradientCanaries`, row k of ``included`` for
    model ``seeds[k]``); then returns a :class:`CanaryRun` ``(params, scores)`` with the
    all-iterates scores (K, m) float64. Without them, the Params only, as before.
    """
    K, dev = len(seeds), resolve(device)
    if K < 1:
        raise ValueError("train: seeds must name at least one model")
    if len(set(seeds)) != K:
        raise ValueError("train: seeds must be distinct (equal seeds give identical models)")
    if not noise_std >= 0:
        raise ValueError(f"noise_std={noise_std}: must be >= 0")
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
        canaries.check(model, cfg.clip, K)
    dtype = X.dtype if X.is_floating_point() else torch.float32

    if cfg.init == "fixed":
        if init is None or init.K != 1:
            raise ValueError("DPSGDConfig.init='fixed': pass init= the Params of one model")
        init.check(model)
    elif init is not None:
        raise ValueError("train: init= is only used with DPSGDConfig.init='fixed'")
    else:
        init = init_params(model, K, list(seeds), cfg.init_scale, device=dev, dtype=dtype)
    # A contiguous copy per model (the caller's init stays untouched).
    params = Params([w.to(dev, dtype).expand(K, -1, -1).clone(memory_format=torch.contiguous_format)
                     for w in init.W],
                    [b.to(dev, dtype).expand(K, -1).clone(memory_format=torch.contiguous_format)
                     for b in init.b])

    # Data on the device once; batches are gathered by index.
    X = X.to(dev, dtype)
    if int(y.min()) < 0 or int(y.max()) >= model.n_classes:
        raise ValueError(f"train: labels must be in [0, {model.n_classes})")
    onehot = torch.nn.functional.one_hot(y.to(dev), model.n_classes).to(dtype)
    sq_in = torch.linalg.vector_norm(X, dim=1).square_().add_(1)  # ||(x_i; 1)||^2, fixed
    batch_gens = [_generator(s, _BATCH, dev) for s in seeds]
    noise_gens = [_generator(s, _NOISE, dev) for s in seeds]

    B, P = cfg.batch_size, model.n_params
    step_size = cfg.lr / B
    chunk, T = cfg.chunk_steps(n), cfg.steps(n)
    # Buffers reused across steps: fresh multi-MB allocations cost page faults every step.
    noise = torch.empty(K, chunk, P, device=dev, dtype=dtype) if noise_std > 0 else None
    x_buf = torch.empty(0, device=dev, dtype=dtype)
    hook = None if canaries is None else _CanaryHook(
        canaries, cfg.batch_size / n if canaries.rate is None else canaries.rate, seeds, params,
        dev, dtype, cfg.lr / cfg.batch_size, noise_std, cfg.clip)
    done = 0
    while done < T:
        S = min(chunk, T - done)
        batches = _sample_batches(cfg, n, S, batch_gens, dev, dtype)
        if noise is not None:
            _each_model(lambda k: torch.randn(S, P, generator=noise_gens[k], out=noise[k, :S]),
                        K, dev)
        if hook is not None:
            hook.draw(S)
        for s, (idx, valid) in enumerate(batches):
            flat_idx = idx.reshape(-1)
            if x_buf.numel() < flat_idx.numel() * model.in_dim:
                x_buf = torch.empty(flat_idx.numel() * model.in_dim, device=dev, dtype=dtype)
            xb = x_buf[:flat_idx.numel() * model.in_dim].view(K, -1, model.in_dim)
            torch.index_select(X, 0, flat_idx, out=xb.view(-1, model.in_dim))
            acts, z = _forward(params, xb)
            gs = _backprop(params, acts, z, onehot.index_select(0, flat_idx).view(z.shape))
            sq = _sq_grad_norms(acts, gs, sq_in.index_select(0, flat_idx).view(z.shape[:2]))
            c = (cfg.clip / sq.sqrt_()).clamp_(max=1.0)
            if valid is not None:
                c.mul_(valid)
            for a, g, W, b in zip(acts, gs, params.W, params.b):
                g = g.mul_(c.unsqueeze(-1))
                if _narrow(W):
                    W.sub_(torch.bmm(g.transpose(1, 2), a).transpose(1, 2), alpha=step_size)
                else:
                    W.baddbmm_(a.transpose(1, 2), g, alpha=-step_size)
                b.sub_(g.sum(1), alpha=step_size)
            if hook is not None:
                hook.add(params, s, step_size)
            if noise is not None:
                for param, eps in zip((t for pair in zip(params.W, params.b) for t in pair),
                                      _noise_views(noise[:, s], params)):
                    param.add_(eps, alpha=-step_size * noise_std)
            if hook is not None:
                hook.observe(params)
        done += S
        if progress is not None:
            progress(done, T)
    return params if hook is None else CanaryRun(params, hook.scores, hook.llr)


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


def train(X: torch.Tensor, y: torch.Tensor, model: ModelSpec, cfg: DPSGDConfig,
          seeds: Sequence[int], init: Params | None = None, device=None,
          progress: Callable[[int, int], None] | None = None, *,
          canaries: GradientCanaries | None = None) -> Params | CanaryRun:
    """DP-SGD, noise std ``cfg.noise_multiplier * cfg.clip`` (:func:`train_with_noise_std`);
    with ``canaries=``, a :class:`CanaryRun` (params, all-iterates scores)."""
    return train_with_noise_std(X, y, model, cfg, seeds, cfg.noise_multiplier * cfg.clip,
                                init=init, device=device, progress=progress, canaries=canaries)


def pick_k(model: ModelSpec, n: int, device=None, cfg: DPSGDConfig | None = None) -> int:
    """How many models to train per :func:`train` call on ``device``.

    CPU: 32 (batching amortises the per-step overhead: on 2 cores the FMNIST 2-layer setup
    runs 1.2x faster per model at K = 32 than at K = 8 and no faster at 64, see
    benchmarks/bench_dpsgd.py). CUDA: as many as fit in half of the card's memory (the
    workflow runs one training job per GPU), never more than 90% of what is free now, at
    most 4096; per model: one chunk of noise (S x P) and of sampling draws (<= 16 bytes per
    example and step), and the gathered batch with its activations.
    """
    dev = resolve(device)
    if dev.type != "cuda":
        return 32
    cfg = cfg or DPSGDConfig(epochs=1, batch_size=min(n, 250), lr=1.0, clip=1.0,
                             noise_multiplier=1.0)
    S, B = cfg.chunk_steps(n), cfg.batch_size
    width = model.in_dim + 3 * sum(o for _, o in model.shapes)
    per_model = 4 * S * model.n_params + 16 * S * n + 4 * 3 * B * width
    free, total = torch.cuda.mem_get_info(dev)
    return int(max(1, min(4096, min(total // 2, int(0.9 * free)) // per_model)))


__all__ = ["ModelSpec", "DPSGDConfig", "Params", "init_params", "save_params", "load_params",
           "logits", "losses", "grad_norms", "train", "train_with_noise_std", "pick_k",
           "GradientCanaries", "CanaryRun", "flatten", "last_iterate_scores", "dirac_canaries",
           "ARCHS", "SAMPLINGS", "INITS"]
