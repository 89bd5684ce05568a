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
    index, of several GPUs: the one with the most free memory that no other dpaudit process
    has claimed (:func:`claim_first`; jobs started side by side with ``--resources gpu=N``
    each get their own of the N GPUs), the same one for the rest of the process; any other
    name or ``torch.device`` as given. Asking for CUDA where torch sees none is a
    ValueError."""
    global _claimed
    if device is None or device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None and torch.cuda.device_count() > 1:
        if _claimed is None:
            n = torch.cuda.device_count()
            free = [torch.cuda.mem_get_info(i)[0] for i in range(n)]
            order = sorted(range(n), key=lambda i: -free[i])
            names = [str(torch.cuda.get_device_properties(i).uuid) for i in order]
            pick, lock = claim_first(names, LOCK_DIR)
            _claimed = (torch.device("cuda", order[names.index(pick)]), lock)
        return _claimed[0]
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r}: torch sees no CUDA device here (use auto or cpu)")
    return dev


def claim_first(names: Sequence[str], lock_dir: Path) -> tuple[str, IO | None]:
    """The first of ``names`` (GPUs, best first) that no other process holds, claimed by an
    exclusive lock on ``lock_dir/<name>.lock`` that lasts while the returned file is open
    (the operating system releases it when the process ends, however it ends). When every
    one is held: the first, with no lock."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        fh = open(lock_dir / f"{name}.lock", "w")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            continue
        return name, fh
    return names[0], None


__all__ = ["DEVICES", "LOCK_DIR", "resolve", "claim_first"]
