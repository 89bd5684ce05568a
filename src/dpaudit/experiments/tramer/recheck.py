"""The checks after the runs, which the audited function cannot predict: runs re-trained on
seeds the auditor draws only once every run has returned, and probes of what each mode
passes.

A check on seeds fixed in advance (:func:`dpaudit.experiments.tramer.check_seeds`, before
the runs) can be passed by a function that behaves only there (deterministic for the first
calls, or for the seeds it expects). Here the seeds are drawn by a generator keyed by the
audit seed and the SHA-256 of every run's output (:func:`drawn`): reproducible, but unknown
to the function until all its runs are done. They are re-trained in another grouping
(each side's apart, in a random order) and must give their recorded outputs again
(:func:`same`, to 1e-4 of their scale as the seed check); a function whose runs do not all
follow their seeds fails with probability ``1 - (1 - f)^k`` per side, ``f`` the fraction of
its runs that do not and ``k`` the seeds drawn per side.

The probes then change one input of the same seeds, in the same call layout, and require
the output to change (beyond that tolerance): the canary inserted and not (white box: a run
that recorded insertions must move when they are not made, so a function that ignores the
canary, or inserts it into runs without it and records only the included ones, is refused),
the batch mates and none, the auditor's init and a perturbed one (worst-case init). They
catch a function that ignores what it is given; they cannot catch one that fabricates
outputs which depend on it (e.g. scores simulated from the recorded counts).
"""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
import torch

from ... import dpsgd, seeds
from .runs import Unauditable


def drawn(seed: int, out: pd.DataFrame, column: str, k: int,
          prefer: pd.Series | None = None) -> dict[bool, list[int]]:
    """``k`` seeds of each side's runs (``canary_in`` False, True) of ``out``, drawn by a
    generator keyed by ``seed`` and the SHA-256 of every run's seed and ``column``; on
    each side among the runs where ``prefer`` is True, where there are ``k``."""
    h = hashlib.sha256(np.asarray(out.seed, np.uint64).tobytes())
    h.update(np.ascontiguousarray(np.stack(out[column].to_numpy()), np.float64).tobytes())
    gen = seeds.rng(int(seed), "tramer/recheck", int.from_bytes(h.digest()[:8], "big"))
    picked = {}
    for inside in (False, True):
        side = out[out.canary_in == inside]
        if prefer is not None and int(prefer[side.index].sum()) >= k:
            side = side[prefer[side.index]]
        picked[inside] = [int(s) for s in gen.choice(side.seed.to_numpy(), min(k, len(side)),
                                                     replace=False)]
    return picked


def tolerance(*arrays, floor: float = 0.0) -> float:
    """1e-4 of the largest finite magnitude in ``arrays`` (or of ``floor``, if larger):
    what GPU reductions' rounding stays within. Log-probabilities take ``floor`` 1 (those
    of a confident model are near 0, their rounding that of the logits); white-box
    scores none (their scale is the user's step size)."""
    finite = np.concatenate([np.ravel(a)[np.isfinite(np.ravel(a))] for a in arrays])
    return 1e-4 * max(floor, float(np.abs(finite).max(initial=0.0)))


def moved(a, b, atol: float) -> np.ndarray:
    """Per run (first axis): does ``b`` differ from ``a`` by more than ``atol`` (infinities
    of one sign, and NaN, equal)?"""
    a, b = np.asarray(a, float), np.asarray(b, float)
    close = np.isclose(a, b, rtol=0.0, atol=atol, equal_nan=True)
    return ~close.reshape(len(a), -1).all(1)


def same(recorded: dict[int, np.ndarray], chunk: list[int], again: np.ndarray,
         what: str, floor: float = 0.0) -> None:
    """Refuse (:class:`Unauditable`) unless the runs of ``chunk`` re-trained (``again``,
    in chunk order) gave their ``recorded`` outputs (by seed) to :func:`tolerance`."""
    want = np.stack([recorded[s] for s in chunk])
    off = moved(want, again, tolerance(want, again, floor=floor))
    if off.any():
        k = int(np.argmax(off))
        raise Unauditable(
            f"not deterministic in its seed: re-trained after the runs (seeds drawn from "
            f"the outputs of all of them), the run of seed {chunk[k]} gave other {what} "
            f"({np.ravel(want[k])[:4]} in the audit, then {np.ravel(again[k])[:4]}); take "
            "all of a run's randomness from its own seed, e.g. "
            "torch.Generator().manual_seed(seed)")


def perturbed(init: dpsgd.Params, std: float = 0.1) -> dpsgd.Params:
    """``init`` with Gaussian noise of ``std`` added to every weight and bias (a fixed
    draw; not one shift for all, which a softmax would not see): the init probe's other
    start."""
    g = torch.Generator().manual_seed(0)

    def noisy(t):
        return t + std * torch.randn(t.shape, generator=g, dtype=t.dtype).to(t.device)
    return dpsgd.Params([noisy(w) for w in init.W], [noisy(b) for b in init.b])


def recheck_blackbox(train, out: pd.DataFrame, seed: int, k: int,
                     extra: dict | None) -> None:
    """The black-box runs' re-check: ``train(chunk, inside, extra, named)`` re-trains runs
    and returns their canary log-probabilities (runs, C); ``out`` holds every run's
    ``canary_in``, ``seed`` and ``log_prob``. With ``extra["init"]`` (worst-case init) the
    runs with the canary are trained again from :func:`perturbed` init, and refused if no
    run's log-probabilities moved (the init ignored)."""
    picked = drawn(seed, out, "log_prob", k)
    recorded = dict(zip(out.seed, out.log_prob))
    for inside in (False, True):
        chunk = picked[inside]
        name = f"re-check's {len(chunk)} runs {'with' if inside else 'without'} canary"
        again = train(chunk, inside, extra, name)
        same(recorded, chunk, again, "canary log-probabilities", floor=1.0)
    if extra and extra.get("init") is not None:
        other = train(chunk, True, {**extra, "init": perturbed(extra["init"])},
                      f"init probe's {len(chunk)} runs")
        if not moved(again, other, tolerance(again, other, floor=1.0)).any():
            raise Unauditable(
                f"worst-case-init mode: the function ignores init: the runs of seeds {chunk} "
                "gave the same canary log-probabilities from the auditor's init and from it "
                "with noise of std 0.1 added to every parameter; start every run from init")


def recheck_whitebox(scores_of, out: pd.DataFrame, seed: int, k: int, mates: float) -> None:
    """The white-box runs' re-check: ``scores_of(chunk, inside, named, mates)`` re-trains
    runs (their ``dot_sum`` and recorded ``insertions`` per run); ``out`` holds every run's
    ``canary_in``, ``seed``, ``dot_sum`` and ``insertions``. Each side's drawn runs must
    give their scores and insertion counts again; those with the canary (drawn among runs
    that recorded insertions) are trained again without it, where each one that recorded
    insertions must move; with ``mates``, again with none, where one must move."""
    picked = drawn(seed, out, "dot_sum", k, prefer=out.insertions > 0)
    dots, counts = dict(zip(out.seed, out.dot_sum)), dict(zip(out.seed, out.insertions))
    scores = dict(zip(out.seed, out.score))
    for inside in (False, True):
        chunk = picked[inside]
        name = f"re-check's {len(chunk)} runs {'with' if inside else 'without'} canary"
        again = scores_of(chunk, inside, name, mates)
        same(dots, chunk, again["dot_sum"], "canary scores")
        same(scores, chunk, again["score"], "canary likelihood ratios (the audit's score)")
        same(counts, chunk, np.asarray(again["insertions"], float), "insertion counts")
    without = scores_of(chunk, False, f"canary probe's {len(chunk)} runs", mates)["dot_sum"]
    still = (np.asarray(again["insertions"]) > 0) & ~moved(
        again["dot_sum"], without, tolerance(again["dot_sum"], without))
    if still.any():
        s = chunk[int(np.argmax(still))]
        raise Unauditable(
            f"white-box mode: the canary changed nothing: the run of seed {s} recorded "
            f"{int(again['insertions'][int(np.argmax(still))])} insertions, yet gave the "
            f"same canary score {again['dot_sum'][int(np.argmax(still))]:.6g} when trained "
            "again without the canary (included False); insert the canary into the runs "
            "it is included in, and only those")
    if mates:
        none = scores_of(chunk, True, f"mates probe's {len(chunk)} runs", 0.0)["dot_sum"]
        if not moved(again["dot_sum"], none, tolerance(again["dot_sum"], none)).any():
            raise Unauditable(
                f"white-box mode: the function ignores canaries.mates: the runs of seeds "
                f"{chunk} gave the same canary scores with mates={mates:g} and with none; "
                "add mates * g per row of each step's batch")
