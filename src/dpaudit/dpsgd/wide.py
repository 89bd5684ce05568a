"""The wide step of K seeds x M columns: forward pass, per-example backprop signals and
squared gradient norms (what clipping needs); :func:`logits`, :func:`losses` and
:func:`grad_norms` of trained models.

Efficiency. The K models share one tensor layout with a leading model dimension, so every
step is a handful of batched matmuls (``torch.bmm``). The forward and backward passes of the
dense architectures are written out by hand. For a dense layer z = a W + b the
per-example gradient is the outer product (a_i; 1) g_i^T with g_i = d loss_i / d z_i, so
its squared Frobenius norm is (||a_i||^2 + 1) ||g_i||^2 (Goodfellow 2015, "Efficient
per-example gradient computations"); summing this over layers gives ||grad_i||^2 without
materialising any per-example gradient, and the clipped sum of a layer's weight gradients
is the single matmul  sum_i c_i a_i g_i^T = a^T (c * g),  c_i = min(1, C / ||grad_i||).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .model import Params
from .spec import ModelSpec


class Wide(NamedTuple):
    """K seeds x M columns of one :class:`ModelSpec` in one layout (the trainer's): ``W[0]``
    (K, M, fan_out, fan_in), the first layer of every column transposed, so that it is one
    (K M fan_out) x fan_in matrix: its products with a batch shared by all K models, or
    with each model's own batch, are single matmuls with no copies; ``W[l]`` (K, M, fan_in,
    fan_out) for l > 0; ``b[l]`` (K, M, fan_out)."""

    W: list[torch.Tensor]
    b: list[torch.Tensor]

    @classmethod
    def of(cls, params: Params) -> "Wide":
        """A view of ``params`` as one column (in-place updates reach ``params``)."""
        return cls([params.W[0].transpose(1, 2).unsqueeze(1)]
                   + [w.unsqueeze(1) for w in params.W[1:]], [b.unsqueeze(1) for b in params.b])

    def column(self, m: int) -> Params:
        """Column m's K models as Params (views of the wide tensors)."""
        return Params([self.W[0][:, m].transpose(1, 2)] + [w[:, m] for w in self.W[1:]],
                      [b[:, m] for b in self.b])

    def tensors(self) -> list[torch.Tensor]:
        return [t for pair in zip(self.W, self.b) for t in pair]


def _forward(wide: Wide, x: torch.Tensor, xt: torch.Tensor | None = None):
    """Layer inputs and logits in the feature-major layout the step keeps throughout:
    [a_0 = x^T, a_1 (K, M, hidden, m), ...] and logits (K, M, C, m).

    ``x`` is either each model's own batch (K, m, d), a_0 = x^T (K, d, m) ("gather"), or
    one batch shared by all K models (m, d), a_0 = x^T (d, m) ("shared": the first layer of
    every model and column is then one (K M fan_out, d) @ (d, m) matmul; ``xt``, a
    contiguous x^T, makes it faster on the CPU). Every product
    is an (out x in) @ (in x batch) matmul, with transposed operands where the layout needs
    them (BLAS reads them in place): no permuted copies; and on the CPU this form is
    faster than (batch x in) @ (in x out) for narrow heads (measured: docs/scale.md)."""
    K, M, o, d = wide.W[0].shape
    W0 = wide.W[0].reshape(K * M * o, d)
    xt = x.transpose(-1, -2) if xt is None else xt
    if x.dim() == 2:
        z = torch.addmm(wide.b[0].reshape(-1, 1), W0, xt)
    else:
        z = torch.baddbmm(wide.b[0].reshape(K, -1, 1), W0.view(K, M * o, d), xt)
    m = x.shape[-2]
    z = z.view(K, M, o, m)
    acts = [xt]
    for W, b in zip(wide.W[1:], wide.b[1:]):
        h = z.relu_()
        acts.append(h)
        i, o = W.shape[2:]
        z = torch.baddbmm(b.reshape(K * M, o, 1), W.view(K * M, i, o).transpose(1, 2),
                          h.view(K * M, i, m)).view(K, M, o, m)
    return acts, z


def _backprop(wide: Wide, acts, z, onehot):
    """Per-example backprop signals g_l = d loss_i / d z_l of each layer, (K, M, fan_out, m);
    ``onehot`` (K, C, m), or (1, C, m) for a batch shared by the K models.

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
    ||x_i||^2 + 1, or (1, m) for a batch shared by the K models."""
    sq = sq_in.unsqueeze(1) * gs[0].square().sum(2)
    for a, g in zip(acts[1:], gs[1:]):
        sq += (a.square().sum(2) + 1) * g.square().sum(2)
    return sq


def gradient_step(wide: Wide, x, xt, onehot, sq_in, clip, weights, step_size: float) -> None:
    """theta -= step_size * (sum over the batch of each example's clipped gradient), every
    model and column at once: the forward pass, the backprop signals, each example's norm
    over all parameters, its clip factor min(1, C / norm) (times its 0/1 weight where
    ``weights`` (K, m) says which rows are in each run's batch), and one matmul per layer
    (:func:`_forward` says what ``x`` and ``xt`` are; ``onehot`` (K or 1, C, m), ``sq_in``
    (K or 1, m) = ||x_i||^2 + 1, ``clip`` (M, 1))."""
    acts, z = _forward(wide, x, xt)
    gs = _backprop(wide, acts, z, onehot)
    c = torch.div(clip, _sq_grad_norms(acts, gs, sq_in).sqrt_()).clamp_(max=1.0)  # (K, M, m)
    if weights is not None:
        c.mul_(weights.unsqueeze(1))
    K, M = c.shape[:2]
    for l, (a, g) in enumerate(zip(acts, gs)):
        g = g.mul_(c.unsqueeze(2))  # (K, M, fan_out, m)
        nb = g.shape[-1]
        if l == 0:  # every column's first layer: one matmul (per model when gathered)
            W0 = wide.W[0].view(-1, x.shape[-1])
            if x.dim() == 2:
                W0.addmm_(g.view(-1, nb), x, alpha=-step_size)
            else:
                W0.view(K, -1, x.shape[-1]).baddbmm_(g.view(K, -1, nb), x, alpha=-step_size)
        else:
            i, o = wide.W[l].shape[2:]
            wide.W[l].view(K * M, i, o).baddbmm_(
                a.view(K * M, i, nb), g.view(K * M, o, nb).transpose(1, 2), alpha=-step_size)
        wide.b[l].sub_(g.sum(-1), alpha=step_size)


def binary_step(wide: Wide, x, xt, onehot, sq_in, clip, weights, step_size: float) -> None:
    """:func:`gradient_step` of logistic regression on two classes, with half the matmuls.
    The softmax's gradient of class 0 is minus that of class 1 (g_0 = p_0 - y_0 = -(p_1 -
    y_1)), so each example adds c g_1 (-1, 1) (x; 1)^T: one product, the difference's
    logits z_1 - z_0 (class 1's probability is their sigmoid), and one update product
    U = (c g_1)^T x, subtracted from class 1 and added to class 0. The norm is that of what
    is added, sqrt(2) |g_1| ||(x; 1)||."""
    K, M, _, d = wide.W[0].shape
    W, b = wide.W[0], wide.b[0]
    diff, bias = (W[:, :, 1] - W[:, :, 0]).view(K * M, d), (b[..., 1] - b[..., 0])
    if x.dim() == 2:
        z = torch.addmm(bias.reshape(-1, 1), diff, xt).view(K, M, -1)
    else:
        z = torch.baddbmm(bias.unsqueeze(-1), diff.view(K, M, d), x.transpose(1, 2))
    g = z.sigmoid_().sub_(onehot[:, 1].unsqueeze(1))  # (K, M, m)
    c = torch.div(clip, g.abs().mul(sq_in.unsqueeze(1).mul(2).sqrt_())).clamp_(max=1.0)
    if weights is not None:
        c.mul_(weights.unsqueeze(1))
    g.mul_(c)
    U = torch.mm(g.view(K * M, -1), x) if x.dim() == 2 else torch.bmm(g, x)
    U = U.view(K, M, d)
    W[:, :, 1].sub_(U, alpha=step_size)
    W[:, :, 0].add_(U, alpha=step_size)
    total = g.sum(-1)
    b[..., 1].sub_(total, alpha=step_size)
    b[..., 0].add_(total, alpha=step_size)


def logits(params: Params, x: torch.Tensor, model: ModelSpec) -> torch.Tensor:
    """Logits (K, m, n_classes) of the K models on x (m, in_dim), returned on x's device."""
    params.check(model)
    with torch.no_grad():
        z = _forward(Wide.of(params), x.to(params.W[0].device, params.W[0].dtype))[1]
        return z[:, 0].transpose(1, 2).to(x.device)


def losses(params: Params, x: torch.Tensor, y: torch.Tensor, model: ModelSpec) -> torch.Tensor:
    """Per-example cross-entropy losses (K, m) of the K models on (x, y)."""
    z = torch.log_softmax(logits(params, x, model), dim=-1)
    return -z.gather(-1, y.to(z.device).view(1, -1, 1).expand(z.shape[0], -1, 1)).squeeze(-1)


def grad_norms(params: Params, x: torch.Tensor, y: torch.Tensor, model: ModelSpec) -> torch.Tensor:
    """Per-example gradient norms ||grad_theta loss_i|| (K, m), all layers jointly, unclipped."""
    params.check(model)
    with torch.no_grad():
        xs, wide = x.to(params.W[0].device, params.W[0].dtype), Wide.of(params)
        acts, z = _forward(wide, xs)
        onehot = torch.nn.functional.one_hot(y.to(z.device), model.n_classes).to(z.dtype)
        gs = _backprop(wide, acts, z, onehot.T.unsqueeze(0))
        sq = _sq_grad_norms(acts, gs, xs.square().sum(-1).add_(1).unsqueeze(0))
        return sq.squeeze(1).sqrt_().to(x.device)
