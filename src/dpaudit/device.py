"""The one device choice: where models train and features are computed."""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path
from typing import IO, Sequence

import torch

#: Names a config or CLI may give (``auto``: CUDA when torch sees a GPU, else the CPU).
DEVICES = ("auto", "cpu", "cuda")
#: Where the processes of one user claim GPUs (:func:`claim_first`).
LOCK_DIR = Path(tempfile.gettempdir()) / f"dpaudit-gpus-{os.getuid()}"

# The GPU this process claimed, with the open lock file that holds the claim until exit.
_claimed: tuple[torch.device, IO | None] | None = None


def resolve(device: str | torch.device | None = None) -> torch.device:
    """``None`` or ``"auto"``: a GPU when torch sees one, else the CPU; ``"cuda"`` without an
    index, of several GPUs: the first one that no other dpaudit process of this user has
    claimed (:func:`claim_first`: jobs started side by side with ``--resources gpu=N`` each
    get their own of the N GPUs), or the one with the most free memory if all are claimed,
    the same one for the rest of the process; any other name or ``torch.device`` as given.
    Asking for CUDA where torch sees none is a ValueError."""
    global _claimed
    if device is None or device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None and torch.cuda.device_count() > 1:
        if _claimed is None:
            n = torch.cuda.device_count()
            # Global names, so that jobs with different CUDA_VISIBLE_DEVICES agree.
            names = [str(getattr(torch.cuda.get_device_properties(i), "uuid", ""))
                     for i in range(n)]
            if len(set(names)) < n or "" in names:
                names = [f"cuda{i}" for i in range(n)]
            pick, lock = claim_first(names, LOCK_DIR)
            if lock is None:  # every card claimed: share the freest (this opens contexts)
                free = [torch.cuda.mem_get_info(i)[0] for i in range(n)]
                index = max(range(n), key=free.__getitem__)
            else:
                index = names.index(pick)
            _claimed = (torch.device("cuda", index), lock)
        return _claimed[0]
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r}: torch sees no CUDA device here (use auto or cpu)")
    return dev


def describe(device: str | torch.device | None = None) -> dict:
    """What a result records of the device it was computed on: its name (``cpu``,
    ``cuda:0``), the GPU's model and multiprocessor count (torch's random kernels draw
    other numbers on other GPU models), and the torch and CUDA versions."""
    dev = resolve(device)
    out = {"device": str(dev), "torch": torch.__version__, "cuda": torch.version.cuda,
           "gpu_name": None, "sm_count": None}
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        out.update(device=f"cuda:{dev.index if dev.index is not None else torch.cuda.current_device()}",
                   gpu_name=props.name, sm_count=props.multi_processor_count)
    return out


def claim_first(names: Sequence[str], lock_dir: Path) -> tuple[str, IO | None]:
    """The first of ``names`` (GPUs) that no other process holds, claimed by an exclusive
    lock on ``lock_dir/<name>.lock`` that lasts while the returned file is open (the
    operating system releases it when the process ends, however it ends). When every one
    is held, or the locks cannot be made: the first, with no lock."""
    try:
        lock_dir.mkdir(parents=True, exist_ok=True)
    except OSError:
        return names[0], None
    for name in names:
        try:
            fh = open(lock_dir / f"{name}.lock", "w")
        except OSError:
            continue
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            continue
        return name, fh
    return names[0], None


__all__ = ["DEVICES", "LOCK_DIR", "resolve", "describe", "claim_first"]
