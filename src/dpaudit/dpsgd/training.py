"""The DP-SGD trainer: :func:`train` and :func:`train_with_noise_std`, K independent models
per seed list (and M columns of configs per seed) in one wide step.

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
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
import torch

from ..device import is_gpu, resolve
from . import philox, precision, sampling
from .gradient_canaries import CanaryHook, CanaryRun, GradientCanaries
from .model import Params, check_seed, glorot_draw, layer_tensors, noise_views
from .spec import DPSGDConfig, ModelSpec
from .wide import Wide, binary_step, gradient_step


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
_SHARED = ("epochs", "batch_size", "lr", "sampling", "normalisation")


def _initial(model: ModelSpec, cols: list[DPSGDConfig], init: Params | None, key, dev,
             dtype) -> Wide:
    """The K x M initial weights: each seed's Glorot draw (one per seed, whatever the
    columns) times each "glorot" column's scale; ``init`` for the "fixed" columns."""
    K, M = len(key), len(cols)
    if any(c.init == "fixed" for c in cols):
        if init is None or init.K != 1:
            raise ValueError("DPSGDConfig.init='fixed': pass init= the Params of one model")
        init.check(model)
    elif init is not None:
        raise ValueError("train: init= is only used with DPSGDConfig.init='fixed'")
    W = [torch.empty(K, M, o, i, device=dev, dtype=dtype) for i, o in model.shapes[:1]]
    W += [torch.empty(K, M, i, o, device=dev, dtype=dtype) for i, o in model.shapes[1:]]
    b = [torch.zeros(K, M, o, device=dev, dtype=dtype) for _, o in model.shapes]
    wide = Wide(W, b)
    glorot = [m for m, c in enumerate(cols) if c.init == "glorot"]
    draws = glorot_draw(model, key, 0, dtype) if glorot else None
    for m, c in enumerate(cols):
        col = wide.column(m)
        if c.init == "fixed":
            for t, v in zip(layer_tensors(col), layer_tensors(init)):
                t.copy_(v.to(dev, dtype).expand_as(t))
        else:
            for w, d in zip(col.W, draws):
                w.copy_(d).mul_(c.init_scale)
    return wide


def _check(X, y, model: ModelSpec, cols: list[DPSGDConfig], seeds, canaries, lr_schedule,
           dev) -> None:
    """The arguments of one training call, before anything is drawn or trained."""
    K, M, cfg = len(seeds), len(cols), cols[0]
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
        if cfg.normalisation == "asgm":
            raise ValueError("canaries: the canary scores assume a constant normaliser; "
                             "DPSGDConfig.normalisation 'asgm' divides by each batch's size")
    if int(y.min()) < 0 or int(y.max()) >= model.n_classes:
        raise ValueError(f"train: labels must be in [0, {model.n_classes})")
    if canaries is not None and precision.uses_tf32(dev):
        raise ValueError("canaries: train with matmul_precision('fp32') (TF32 would round "
                         "the canaries and their scores)")


def _train(X, y, model: ModelSpec, cols: list[DPSGDConfig], stds: list[float], seeds, init,
           device, progress, canaries, lr_schedule=None, on_epoch=None):
    K, M, dev = len(seeds), len(cols), resolve(device)
    cfg = cols[0]
    _check(X, y, model, cols, seeds, canaries, lr_schedule, dev)
    n = X.shape[0]
    dtype = X.dtype if X.is_floating_point() else torch.float32
    key = philox.keys([check_seed(s) for s in seeds], dev)
    fused = is_gpu(dev)  # one kernel per draw on a GPU (philox module docstring)
    wide = _initial(model, cols, init, key, dev, dtype)

    shared = sampling.shares_data(model, cfg, n, M)
    batches = sampling.Batches(cfg, n, key, shared, dtype, fused)
    data = _Data(X, y, model.n_classes, shared, dev, dtype)
    clip = torch.tensor([c.clip * precision.clip_scale(dev) for c in cols], device=dev,
                        dtype=dtype).view(M, 1)

    # Logistic regression on two classes: the step with half the matmuls (wide.binary_step).
    step = binary_step if model.arch == "lr" and model.n_classes == 2 else gradient_step
    B = cfg.divisor(n)
    step_size = cfg.lr / B
    by_size = cfg.normalisation == "asgm"  # each run's step rescaled by B / its batch size
    chunk, T = cfg.chunk_steps(n), cfg.steps(n)
    # One unscaled noise draw per seed and step, scaled per column: std_m for each layer.
    noisy = any(v > 0 for v in stds)
    std = torch.tensor(stds, device=dev, dtype=dtype)
    std_views = [std.view(1, M, 1, 1), std.view(1, M, 1)] * len(model.shapes)
    # The canary treated as the sampling treats an example, unless given its own rate.
    by_shuffle = canaries is not None and canaries.rate is None and cfg.shuffled
    hook = None if canaries is None else CanaryHook(
        canaries, None if by_shuffle else canaries.rate or cfg.batch_size / n, key,
        wide.column(0), dev, dtype, step_size, stds[0], cfg.clip, fused,
        (cfg.sampling, n, cfg.batch_size) if by_shuffle else None, cfg.batch_size)
    ends = sampling.epoch_ends(cfg, n) if on_epoch is not None else []
    epoch = 0
    for t in range(T):
        if lr_schedule is not None:
            lr = lr_schedule(t)
            if not 0 < lr < math.inf:
                raise ValueError(f"lr_schedule({t})={lr!r}: must be > 0 and finite")
            step_size = lr / B
        idx, weights = batches.step(t)
        scale = None
        if by_size:
            weights, scale = _sampled_scale(idx, weights, n, K, B, dev, dtype)
        step(wide, *data.batch(idx, K), clip, weights, step_size)
        if hook is not None:
            hook.add(hook_params := wide.column(0), t, step_size,
                     sampling.batch_sizes(idx, weights, n, K, dev) if hook.mates else None)
        if noisy:
            svs = std_views if scale is None else \
                [v * scale.view(-1, *[1] * (v.dim() - 1)) for v in std_views]
            _add_noise(wide, philox.draw("normal", key, philox.NOISE, t, model.n_params,
                                         fused=fused), model, svs, step_size)
        if hook is not None:
            hook.observe(hook_params)
        if epoch < len(ends) and t + 1 == ends[epoch]:
            epoch += 1
            on_epoch(epoch, [wide.column(m) for m in range(M)])
        if progress is not None and ((t + 1) % chunk == 0 or t + 1 == T):
            progress(t + 1, T)
    columns = [wide.column(m) for m in range(M)]
    if hook is not None:
        canaries.record(T, hook.rate, hook.counts)
        return CanaryRun(columns[0], hook.scores, hook.llr)
    return [Params([w.contiguous() for w in p.W], [b.contiguous() for b in p.b])
            for p in columns]


class _Data:
    """The training data on the device, once, and each step's batch: every row, shared by
    all runs, or each run's gathered batch (:func:`sampling.shares_data`), once per seed
    for all columns."""

    def __init__(self, X, y, n_classes: int, shared: bool, dev, dtype):
        self.X = X.to(dev, dtype)
        self.onehot = torch.nn.functional.one_hot(y.to(dev), n_classes).to(dtype).T  # (C, n)
        # ||(x_i; 1)||^2, fixed
        self.sq_in = torch.linalg.vector_norm(self.X, dim=1).square_().add_(1)
        self.xt = self.X.T.contiguous() if shared else None
        self.shared = shared
        self.buffer = torch.empty(0, device=dev, dtype=dtype)

    def batch(self, idx, K: int) -> tuple:
        """``(xb, xt, yb, sq_b)`` of the step's batch ``idx`` (K, b) of K runs, as the
        step functions (:mod:`.wide`) take them; every row where the data is shared."""
        if self.shared:
            return self.X, self.xt, self.onehot.unsqueeze(0), self.sq_in.unsqueeze(0)
        flat_idx, d = idx.reshape(-1), self.X.shape[1]
        if self.buffer.numel() < flat_idx.numel() * d:
            # a quarter to spare: Poisson batches grow a little at many steps, and each new
            # buffer's first writes fault its pages in (several times the gather's cost)
            self.buffer = torch.empty(flat_idx.numel() * d * 5 // 4, device=self.X.device,
                                      dtype=self.X.dtype)
        xb = self.buffer[:flat_idx.numel() * d].view(K, -1, d)
        torch.index_select(self.X, 0, flat_idx, out=xb.view(-1, d))
        yb = self.onehot.index_select(1, flat_idx).view(len(self.onehot), K, -1).transpose(0, 1)
        return xb, None, yb, self.sq_in.index_select(0, flat_idx).view(K, -1)


def _add_noise(wide: Wide, noise: torch.Tensor, model: ModelSpec, std_views: list,
               step_size: float) -> None:
    """One step's noise: every seed's draw ``noise`` (K, n_params) times each column's std
    (``std_views``, one per layer tensor), times minus the step size."""
    views = noise_views(noise, model)
    # The first layer's W is kept transposed: a contiguous copy of its noise, so
    # that adding it to every column reads memory in order.
    views[0] = views[0].transpose(1, 2).contiguous()
    for param, eps, sv in zip(wide.tensors(), views, std_views):
        param.addcmul_(eps.unsqueeze(1), sv, value=-step_size)


def _sampled_scale(idx, weights, n: int, K: int, B: int, dev, dtype):
    """ASGM's step: (each row's weight times B / its run's batch size, that factor (K,)),
    so that the step's lr / B turns into lr / the sampled size (at least 1)."""
    sizes = sampling.batch_sizes(idx, weights, n, K, dev).to(dtype)
    scale = B / sizes.clamp(min=1)
    if weights is None:  # every row counts: the full data, or each run's gathered batch
        weights = torch.ones(K, n if idx is None else idx.shape[1], device=dev, dtype=dtype)
    return weights * scale.unsqueeze(1), scale


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
    (cfg.init == "glorot"), batches and noise are Philox draws keyed by ``seeds[k]`` only
    (:mod:`dpaudit.dpsgd.philox`; seeds are integers in [0, 2^64)), the same on every device.
    With cfg.init == "fixed", ``init`` is a Params of one model that every model starts
    from. Computes in X's floating dtype on ``device`` (default: CUDA when available, else
    CPU); returns the trained Params there. ``progress(step, steps)`` is called after
    every chunk of steps (:meth:`DPSGDConfig.chunk_steps`) and after the last.

    Columns: ``cfg`` a sequence of M configs (and ``noise_std`` one value or M) trains M
    models per seed at once, one per column, which differ in clip, noise and init (Glorot
    scale or "fixed") and share epochs, batch size, lr and sampling. Every column of seed k
    sees seed k's batches, its noise draw (times the column's std) and its Glorot draw
    (times the column's scale), so column m's models are those a call with ``cfg[m]`` alone
    trains, to float rounding; the batch, the sampling and the noise draws are done once
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
    with precision.cuda_matmuls(resolve(device)):
        out = _train(X, y, model, cols, stds, list(seeds), init, device, progress, canaries,
                     lr_schedule, on_epoch)
    return out[0] if isinstance(cfg, DPSGDConfig) and isinstance(out, list) else out


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
