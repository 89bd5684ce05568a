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

from ..device import resolve
from . import precision
from .gradient_canaries import CanaryRun, GradientCanaries, _CanaryHook
from .model import (_BATCH, _INIT, _NOISE, DPSGDConfig, ModelSpec, Params, _generator,
                    _glorot_draw, _noise_views, _stream_states, _tensors)
from .sampling import _each_model, _sample_batches, epoch_ends
from .wide import _backprop, _forward, _sq_grad_norms, _Wide


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
    if canaries is not None and precision._tf32(dev):
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
    clip = torch.tensor([c.clip * precision._clip_scale(dev) for c in cols], device=dev,
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
    with precision._cuda_matmuls(resolve(device)):
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
