"""The one device choice: where models train and features are computed."""

from __future__ import annotations

import torch

#: Names a config or CLI may give (``auto``: CUDA when torch sees a GPU, else the CPU).
DEVICES = ("auto", "cpu", "cuda")


def resolve(device: str | torch.device | None = None) -> torch.device:
    """``None`` or ``"auto"``: CUDA when available, else the CPU; any other name or
    ``torch.device`` as given. Asking for CUDA where torch sees none is a ValueError."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r}: torch sees no CUDA device here (use auto or cpu)")
    return dev


__all__ = ["DEVICES", "resolve"]
