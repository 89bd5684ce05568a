"""Float32 matmul precision of the trainer (:func:`matmul_precision`: exact fp32 or TF32 on
CUDA), the clipping margin TF32 needs, and torch's CUDA matmul setting during training."""

from __future__ import annotations

import contextvars
from contextlib import contextmanager

import torch

from ..device import is_gpu

#: Float32 matmul precisions of the trainer (:func:`matmul_precision`).
PRECISIONS = ("fp32", "tf32")
#: TF32 keeps 10 of float32's 23 fraction bits: each input of a TF32 product is within a
#: relative 2^-10 of its float32 value, whether the hardware rounds to nearest or toward 0.
TF32_REL = 2.0 ** -10
_PRECISION = contextvars.ContextVar("dpaudit_matmul_precision", default="fp32")


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


def uses_tf32(dev: torch.device) -> bool:
    """Whether the trainer's products on ``dev`` are TF32 (:func:`matmul_precision`); under
    a forced GPU description (:func:`dpaudit.device.is_gpu`) the CPU takes this branch, its
    clip margin included, with float32 products."""
    return is_gpu(dev) and _PRECISION.get() == "tf32"


def clip_scale(dev: torch.device) -> float:
    """The factor on every clipping norm: 1, or (1 + 2^-10)^-2 under TF32 (the margin for
    the rounding of the clipped sum's inputs, :func:`matmul_precision`)."""
    return (1 + TF32_REL) ** -2 if uses_tf32(dev) else 1.0


@contextmanager
def cuda_matmuls(dev: torch.device):
    """torch's CUDA float32 matmul setting as :func:`matmul_precision` says, restored on
    exit (torch's newer per-backend setting; reading the legacy ``allow_tf32`` after it is
    set raises). Set under a forced GPU description too: harmless on the CPU, whose
    products it does not touch."""
    mm = torch.backends.cuda.matmul
    if not is_gpu(dev):
        yield
        return
    want = "tf32" if uses_tf32(dev) else "ieee"
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
