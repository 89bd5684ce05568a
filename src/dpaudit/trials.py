"""The trials loop of every many-model audit: train batches of models on each side of a
neighbouring pair (or of several), score them, and report progress.

An experiment describes its sides (:class:`Side`: a name, the seeds of its trials and any
columns to carry) and one function ``train_score(side, seeds) -> {statistic: array}`` that
trains ``len(seeds)`` models at once and returns one value per model for each statistic;
:func:`run` does the batching, the bookkeeping (trial index, seed) and the progress lines.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class Side:
    """One data set an audit trains on: ``seeds`` of its trials, ``columns`` of its rows."""

    name: str
    seeds: Sequence[int]
    columns: dict = field(default_factory=dict)


TrainScore = Callable[[Side, list[int]], dict]


def run(sides: Sequence[Side], train_score: TrainScore, batch: int,
        log: Callable[[str], None] | None = None, what: str = "",
        every_s: float = 15.0) -> pd.DataFrame:
    """Every side's trials, ``batch`` models per call of ``train_score``: one row per model
    with the side's ``columns``, ``side``, ``trial`` (0.. within the side), ``seed`` and
    the statistics. ``log`` gets a progress line (models done, rate, time left) at most
    every ``every_s`` seconds and at the end of each side."""
    if batch < 1:
        raise ValueError(f"batch={batch}: must be >= 1")
    total, done = sum(len(s.seeds) for s in sides), 0
    t0 = last = time.perf_counter()
    rows = []
    for side in sides:
        n = len(side.seeds)
        for start in range(0, n, batch):
            chunk = list(side.seeds[start:start + batch])
            stats = train_score(side, chunk)
            rows.append(pd.DataFrame({**side.columns, "side": side.name,
                                      "trial": np.arange(start, start + len(chunk)),
                                      "seed": chunk, **stats}))
            done += len(chunk)
            now = time.perf_counter()
            if log is not None and (now - last >= every_s or start + batch >= n):
                last, rate = now, done / max(now - t0, 1e-9)
                log(f"{what}side {side.name}: {done}/{total} models, {rate:.2f} models/s, "
                    f"about {(total - done) / rate:.0f} s left")
    return pd.concat(rows, ignore_index=True)


__all__ = ["Side", "run"]
