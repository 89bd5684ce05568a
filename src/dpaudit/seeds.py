"""The one seed derivation: every random draw of the project comes from a numpy
``SeedSequence`` keyed by the run seed (config ``seed``) and the names of what it draws.

Keys are ints (used as they are) and strings (by their CRC-32), so a stream is named by
what it is for (``seed, "fmnist/fnn/clipbkd/k4"``), never by a position in a list: adding a
cell, a repeat or a side to a grid leaves every other stream unchanged, and a result row
is reproducible from the seed and the key its table records.  The legacy
``numpy.random.RandomState`` draws that reproduce the reference code's data subsets
(:mod:`dpaudit.data`, the backdoor pool) are the only exception.
"""

from __future__ import annotations

import zlib

import numpy as np

Key = int | str


def sequence(*key: Key) -> np.random.SeedSequence:
    """The ``SeedSequence`` of ``key`` (ints as they are, strings by CRC-32)."""
    if not key:
        raise ValueError("a seed key needs at least one part (the run seed)")
    parts = []
    for part in key:
        if isinstance(part, str):
            parts.append(zlib.crc32(part.encode()))
        elif isinstance(part, (int, np.integer)) and not isinstance(part, bool) and part >= 0:
            parts.append(int(part))
        else:
            raise ValueError(f"seed key part {part!r}: must be an int >= 0 or a string")
    return np.random.SeedSequence(parts)


def rng(*key: Key) -> np.random.Generator:
    """A numpy ``Generator`` on :func:`sequence` ``(*key)``."""
    return np.random.default_rng(sequence(*key))


def int_seeds(count: int, *key: Key) -> list[int]:
    """``count`` distinct 63-bit integer seeds of ``key`` (one per trained model or run)."""
    state = sequence(*key).generate_state(count, np.uint64) >> np.uint64(1)
    seeds = [int(s) for s in state]
    if len(set(seeds)) != count:  # probability ~ count^2 / 2^64
        raise RuntimeError(f"seed collision in {key}; change the seed")
    return seeds


__all__ = ["sequence", "rng", "int_seeds"]
