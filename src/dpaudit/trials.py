"""The trials loop of every many-model audit: train batches of models on each side of a
neighbouring pair (or of several), score them, and report progress.

An experiment describes its sides (:class:`Side`: a name, the seeds of its trials and any
columns to carry) and one function ``train_score(side, start, seeds) -> {statistic:
array}`` that trains ``len(seeds)`` models at once (the side's trials ``start, start + 1,
...``) and returns one value (or one vector) per model for each statistic; :func:`run` does the batching, the bookkeeping (trial index, seed) and the
progress lines. With a ``store`` folder each finished batch is kept there (:func:`keep`),
so a rerun with the same key (an interrupted job, a timed-out cluster job) trains only
the batches it lacks.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class Side:
    """One data set an audit trains on: ``seeds`` of its trials, ``columns`` of its rows."""

    name: str
    seeds: Sequence[int]
    columns: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Execution:
    """Where an audit's runs train and what it says and keeps (the same for all its runs):
    on ``device``, ``per_call`` models per wide call (default: as many as the device's
    memory holds); progress lines to ``log``, each prefixed ``what``; each batch of runs
    kept in the folder ``store`` under the audit's key, which a rerun restores
    (:func:`run`)."""

    device: Any = None
    per_call: int | None = None
    log: Callable[[str], None] | None = None
    store: Any = None
    what: str = ""


#: train_score(side, start, seeds): the trials start, start + 1, ... of side, one per seed
TrainScore = Callable[[Side, int, list[int]], dict]


def run(sides: Sequence[Side], train_score: TrainScore, batch: int,
        log: Callable[[str], None] | None = None, what: str = "",
        every_s: float = 15.0, store=None, key: dict | None = None) -> pd.DataFrame:
    """Every side's trials, ``batch`` models per call of ``train_score``: one row per model
    with the side's ``columns``, ``side``, ``trial`` (0.. within the side), ``seed`` and
    the statistics. ``log`` gets a progress line (models done, rate, time left) at most
    every ``every_s`` seconds and at the end of each side.

    ``store`` (a folder): each batch is first looked up there (:func:`kept`: same ``key``,
    side, trials and seeds) and trained only if it is not kept; a trained batch is kept
    (:func:`keep`) as soon as it is scored, so an interrupted run loses at most one batch.
    """
    if batch < 1:
        raise ValueError(f"batch={batch}: must be >= 1")
    if store is not None and Path(store).exists() and not Path(store).is_dir():
        raise ValueError(f"store={store}: not a folder")
    chunks = [(side, start, list(side.seeds[start:start + batch])) for side in sides
              for start in range(0, len(side.seeds), batch)]
    stats = [None if store is None else kept(store, key or {}, side, start, chunk)
             for side, start, chunk in chunks]
    total = sum(len(c) for (_, _, c), s in zip(chunks, stats) if s is None)
    if log is not None and store is not None:
        log(f"{what}{sum(len(c) for _, _, c in chunks) - total} models restored, "
            f"{total} to train")
    done, rows = 0, []
    t0 = last = time.perf_counter()
    for (side, start, chunk), got in zip(chunks, stats):
        if got is None:
            got = train_score(side, start, chunk)
            if store is not None:
                keep(store, key or {}, side, start, chunk, got)
            done += len(chunk)
            now = time.perf_counter()
            if log is not None and (now - last >= every_s or start + batch >= len(side.seeds)):
                last, rate = now, done / max(now - t0, 1e-9)
                log(f"{what}side {side.name}: {done}/{total} models, {rate:.2f} models/s, "
                    f"about {(total - done) / rate:.0f} s left")
        rows.append(pd.DataFrame({**side.columns, "side": side.name,
                                  "trial": np.arange(start, start + len(chunk)),
                                  "seed": chunk, **got}))
    return pd.concat(rows, ignore_index=True)


def _path(store, side: Side, start: int, count: int) -> Path:
    name = re.sub(r"[^A-Za-z0-9]+", "_", side.name).strip("_")
    return Path(store) / f"{name}_{start:06d}-{start + count:06d}.csv"


def keep(store, key: dict, side: Side, start: int, seeds: Sequence[int], stats: dict) -> None:
    """Keep the statistics of the trials ``start, start + 1, ...`` (``seeds``) of ``side``
    in ``store`` as one table (trial, seed, a column per statistic, ``name.j`` for entry j
    of a vector), its provenance the ``key``, the side, the trials and each statistic's
    width; written atomically (:func:`dpaudit.io.write_table`)."""
    from .io import write_table

    columns, widths = {}, {}
    for name, values in stats.items():
        arr = np.asarray([np.asarray(v) for v in values])
        if arr.ndim not in (1, 2) or len(arr) != len(seeds):
            raise ValueError(f"statistic {name!r}: one value or one vector per model "
                             f"({len(seeds)}), got shape {arr.shape}")
        widths[name] = 0 if arr.ndim == 1 else arr.shape[1]
        columns.update({name: arr} if arr.ndim == 1 else
                       {f"{name}.{j}": arr[:, j] for j in range(arr.shape[1])})
    table = pd.DataFrame({"trial": np.arange(start, start + len(seeds)),
                          "seed": np.asarray(seeds, np.int64), **columns})
    write_table(table, _path(store, side, start, len(seeds)),
                {"key": key, "side": side.name, "trials": [start, start + len(seeds)],
                 "stats": widths})


def kept(store, key: dict, side: Side, start: int, seeds: Sequence[int]) -> dict | None:
    """The statistics :func:`keep` kept for these trials of ``side`` under ``key`` (vectors
    as a list of arrays, one per model), or None if there are none (another key, side or
    seeds, or no table) or the table is damaged (no content hash or another, columns or
    trials other than its header lists: named on stderr). Something other than a file
    where the table goes stops the job (:func:`dpaudit.io.kept_file`)."""
    from .io import BadInputFile, as_recorded, kept_file, read_table

    path = _path(store, side, start, len(seeds))
    if not kept_file(path):
        return None
    try:
        table, prov = read_table(path)
    except (BadInputFile, OSError) as exc:  # damaged since it was kept: say so, train again
        print(f"kept block {path}: {getattr(exc, 'reason', exc)}; training it again",
              file=sys.stderr)
        return None
    if (prov.get("key"), prov.get("side"), prov.get("trials")) != \
            (as_recorded(key), side.name, [start, start + len(seeds)]):
        return None  # kept by another run: not these trials
    widths = prov.get("stats")
    columns = None if not isinstance(widths, dict) else ["trial", "seed"] + [
        c for name, w in widths.items() for c in ([name] if w == 0 else
                                                  [f"{name}.{j}" for j in range(w)])]
    # (the header's JSON sorts the statistics' names, so their columns are compared as a set)
    if columns is None or sorted(table.columns) != sorted(columns) \
            or table.trial.tolist() != list(range(start, start + len(seeds))):
        print(f"kept block {path}: its columns or trials are not those its header lists; "
              f"training it again", file=sys.stderr)
        return None
    if table.seed.tolist() != [int(s) for s in seeds]:
        return None
    return {name: table[name].to_numpy() if width == 0 else
            list(table[[f"{name}.{j}" for j in range(width)]].to_numpy())
            for name, width in widths.items()}


__all__ = ["Side", "run", "keep", "kept"]
