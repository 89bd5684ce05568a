"""One writer per result folder: advisory locks held by the commands that fill a folder.

Snakemake's lock of a working directory does not keep two runs apart there: Snakemake
9.27 deletes every lock under ``.snakemake/locks`` when any invocation in the folder ends,
so a run started after that reruns jobs that another run is still doing. A command that
writes a folder for a long time (a training group) holds :func:`hold` for its whole run,
so that a second one for the same folder stops at once instead of training into it.
"""

from __future__ import annotations

import fcntl
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


class Busy(RuntimeError):
    """Another process holds the lock of the folder."""


def lock_file(folder: Path) -> Path:
    """The lock of ``folder``: a hidden file beside it, not in it, since Snakemake deletes a
    job's output folder before the job runs (a lock inside would be deleted with it and
    a new file of the same name locked again)."""
    folder = Path(folder)
    return folder.parent / f".{folder.name}.lock"


@contextmanager
def hold(folder: Path) -> Iterator[None]:
    """Within this scope this process is the only holder of ``folder``'s lock (an exclusive
    ``fcntl.flock`` on :func:`lock_file`, released by the operating system however the
    process ends). Held elsewhere: :class:`Busy`, naming the folder and the lock. The
    file stays after release, empty (the same bytes after every run): removing it would
    let the next two holders lock two different files of one name."""
    path = lock_file(folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Busy(f"{folder} is being written by another process (it holds {path}): "
                       "two runs in one folder would retrain and delete each other's "
                       "results; wait for that run to end, or give this one its own "
                       "--directory") from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


__all__ = ["Busy", "lock_file", "hold"]
