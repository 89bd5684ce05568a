"""The one device choice: where models train and features are computed."""

from __future__ import annotations

import torch

#: Names a config or CLI may give (``auto``: CUDA when torch sees a GPU, else the CPU).
DEVICES = ("auto", "cpu", "cuda")


def resolve(device: str | torch.device | None = None) -> torch.device:
    """``None`` or ``"auto"``: a GPU when torch sees one, else the CPU; ``"cuda"`` without an
    index: of several GPUs the one with the most free memory (jobs started side by side
    with ``--resources gpu=N`` spread over the N GPUs); any other name or
    ``torch.device`` as given. Asking for CUDA where torch sees none is a ValueError."""
    if device is None or device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None and torch.cuda.device_count() > 1:
        free = [torch.cuda.mem_get_info(i)[0] for i in range(torch.cuda.device_count())]
        return torch.device("cuda", max(range(len(free)), key=free.__getitem__))
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r}: torch sees no CUDA device here (use auto or cpu)")
    return dev


__all__ = ["DEVICES", "resolve"]
