"""Training of Jagielski et al. 2020's cells: sides, model seeds, scores, kept blocks."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np
import pandas as pd
import torch

from ... import canaries, dpsgd, seeds
from .grid import ATTACKS, STATISTICS, score_columns
from .tasks import Task


def sides(task: Task, attack: str, ks, clipbkd_d0: str = "flipped"):
    """The data sets an attack trains on: ``[(side, label, k, (X, y)), ...]`` with
    ``label`` 0 for D0 and 1 for D1 (one D1 per k; k = 1 for ``mi``)."""
    X, y = task.X, task.y
    if attack == "mi":
        D0, D1, _ = canaries.mi_datasets(X, y)
        return [("out", 0, 1, D0), ("in", 1, 1, D1)]
    if attack == "backdoor":
        out = [("out", 0, 0, (X, y))]
        return out + [(f"k{k}", 1, k, canaries.backdoor_datasets(X, y, task.pool_X, task.pool_y,
                                                                 k)[1]) for k in ks]
    if attack == "clipbkd":
        D0 = canaries.clipbkd_datasets(X, y, task.x_p, task.y_p, 1, d0=clipbkd_d0)[0]
        out = [("out", 0, 0, D0)]
        return out + [(f"k{k}", 1, k, canaries.clipbkd_datasets(X, y, task.x_p, task.y_p, k,
                                                                 d0=clipbkd_d0)[1]) for k in ks]
    raise ValueError(f"attack={attack!r}: must be one of {ATTACKS}")


def model_seeds(seed: int, dataset: str, arch: str, attack: str, side: str, trials: int) -> list[int]:
    """Distinct seeds of the T trials of one side, from the run seed and the side's name
    (not from C, the init or the noise: a grid's cells are paired)."""
    return seeds.int_seeds(trials, int(seed), f"{dataset}/{arch}/{attack}/{side}")


#: Training and test points of the population MI estimate (the reference's ``mi``).
YEOM_POINTS = 1000


def score_models(params: dpsgd.Params, model: dpsgd.ModelSpec, task: Task,
                 attack: str) -> dict[str, np.ndarray]:
    """The statistics of ``attack`` (:data:`STATISTICS`, higher = "in", module docstring)
    of K trained models, their test accuracy and, for ``mi``, ``mi_yeom``: the population
    MI estimate of the paper's Figure 2 MI line (:func:`canaries.yeom_mi_eps` on the first
    1000 training and test points), a point estimate of a lower bound's kind, not a
    bound. Only what the attack's audit reads is computed and kept."""
    if attack not in STATISTICS:
        raise ValueError(f"attack={attack!r}: must be one of {ATTACKS}")
    dev, dt = params.W[0].device, params.W[0].dtype
    t = lambda a: torch.as_tensor(a).to(dev, dt)  # noqa: E731
    test_logits = dpsgd.logits(params, t(task.X_test), model)
    acc = (test_logits.argmax(-1).cpu() == torch.as_tensor(task.y_test)).float().mean(-1)
    out = {}
    if attack == "clipbkd":
        probe = torch.stack([t(task.x_p), torch.zeros_like(t(task.x_p))])
        z = dpsgd.logits(params, probe, model).cpu().numpy()  # (K, 2, C)
        out["clipbkd"] = canaries.clipbkd_score(z[:, :1], task.y_p, z[:, 1:])
        out["clipbkd_logit"] = canaries.clipbkd_score(z[:, :1], task.y_p)
    elif attack == "backdoor":
        out["backdoor"] = canaries.backdoor_score(dpsgd.losses(
            params, t(task.bkd_test_X), torch.as_tensor(task.bkd_test_y), model))
    else:
        out["mi"] = canaries.mi_score(dpsgd.losses(
            params, t(task.X[-1:]), torch.as_tensor(task.y[-1:]), model))
        m = min(YEOM_POINTS, len(task.X) - 1, len(task.X_test))  # rows every side trains on
        out["mi_yeom"] = canaries.yeom_mi_eps(
            dpsgd.losses(params, t(task.X[:m]), torch.as_tensor(task.y[:m]), model),
            dpsgd.losses(params, t(task.X_test[:m]), torch.as_tensor(task.y_test[:m]), model))
    return {**out, "test_acc": acc.numpy().astype(np.float64)}


def trainer_digest() -> str:
    """SHA-256 of the code that turns a seed into a score: the trainer, the canaries and
    scores, the seed derivation, and this module's sides, seeds, scoring and training
    loop. Kept blocks are reused only under the same digest (an edited trainer retrains)."""
    from ...io import source_digest

    return source_digest(dpsgd, canaries, seeds, sides, model_seeds, score_models,
                         run_group, _span_end, _train_span, _finished_block, _by_cell)


def _block_rows(side: str, start: int, seeds_: list[int], cell: str, stats: dict) -> pd.DataFrame:
    return pd.DataFrame({"cell": cell, "side": side, "trial": np.arange(start, start + len(seeds_)),
                         "seed": seeds_, **{k: np.asarray(v, np.float64) for k, v in stats.items()}})


def _kept(path: Path, key: dict, cells: dict, side: str, start: int, seeds_: list[int],
          attack: str, say: Callable[[str], None]) -> pd.DataFrame:
    """The rows of the kept block at ``path`` whose shared ``key`` and own cell key match
    (JSON comparison), for every cell it holds, of ``cells`` or not; empty if none. A block
    of the same key is restored only whole and intact (:func:`_check_block`); otherwise
    ``say`` names it and why, and it is trained again. Something other than a file at
    ``path`` stops the job (:func:`dpaudit.io.kept_file`)."""
    from ...io import BadInputFile, as_recorded, kept_file, read_provenance, read_table

    if not kept_file(path):
        return pd.DataFrame()
    try:
        if read_provenance(path).get("key") != as_recorded(key):
            return pd.DataFrame()  # trained with another spec, seed, task, device or trainer
        table, prov = read_table(path)
        _check_block(path, table, prov, side, start, seeds_, attack)
    except (OSError, UnicodeDecodeError, BadInputFile) as exc:
        say(f"kept block {path}: {getattr(exc, 'reason', exc)}; training it again")
        return pd.DataFrame()
    held = prov["cells"]
    ok = [c for c, ck in held.items() if c not in cells or ck == as_recorded(cells[c])]
    return table[table.cell.isin(ok)].assign(_key=lambda t: t.cell.map(held))


def _check_block(path: Path, table: pd.DataFrame, prov: dict, side: str, start: int,
                 seeds_: list[int], attack: str) -> None:
    """BadInputFile unless the kept block holds, for each cell its provenance records,
    the rows :func:`run_group` writes: this side's trials ``start`` onwards with their
    seeds ``seeds_``, and a finite number in every score column."""
    from ...io import BadInputFile

    stop = start + len(seeds_)
    if prov.get("side") != side or prov.get("trials") != [start, stop]:
        raise BadInputFile(path, f"records side {prov.get('side')!r}, trials "
                                 f"{prov.get('trials')}, not {side!r}, [{start}, {stop}]")
    columns = ["cell", "side", "trial", "seed", *score_columns(attack)]
    if list(table.columns) != columns:
        raise BadInputFile(path, f"columns {list(table.columns)}, not {columns}")
    held = prov.get("cells")
    if not isinstance(held, dict) or set(table.cell) != set(held):
        raise BadInputFile(path, f"rows of cells {sorted(set(table.cell), key=str)}, but its "
                                 f"provenance records {sorted(held or [])}")
    for cell, rows in table.groupby("cell", sort=False):
        if (list(rows.trial) != list(range(start, stop)) or list(rows.seed) != list(seeds_)
                or (rows.side != side).any()):
            raise BadInputFile(path, f"cell {cell}: {len(rows)} rows, not trials {start} to "
                                     f"{stop - 1} of side {side} with their seeds")
    scores = table[columns[4:]]
    if not all(pd.api.types.is_float_dtype(d) for d in scores.dtypes) \
            or not np.isfinite(scores.to_numpy()).all():
        raise BadInputFile(path, "a score or test accuracy is not a finite number")


@dataclass(frozen=True)
class Calls:
    """How :func:`run_group` trains: trials in blocks of ``block`` (trials [0, block),
    [block, 2 block), ...), ``per_call`` seeds per wide call (default
    :func:`dpaudit.dpsgd.seeds_per_call`: as many as ``device``'s memory holds, a GPU being
    shared by ``jobs_per_gpu`` jobs), at matmul ``precision``
    (:func:`dpaudit.dpsgd.matmul_precision`); progress lines to ``log``, one per
    ``every_s`` seconds at most. ``on_trained(side, start, {cell: Params})`` sees every
    call's trained models (and nothing is restored then: every model is trained)."""

    block: int = 100
    device: Any = None
    per_call: int | None = None
    jobs_per_gpu: int = 1
    precision: str = "fp32"
    log: Callable[[str], None] | None = None
    every_s: float = 15.0
    on_trained: Callable[[str, int, dict], None] | None = None

    def __post_init__(self):
        per_call = self.per_call
        if per_call is not None and (isinstance(per_call, bool) or int(per_call) != per_call
                                     or per_call < 1):
            raise ValueError(f"per_call={per_call!r}: must be an integer >= 1 or None")


@dataclass(frozen=True)
class Store:
    """Where :func:`run_group` keeps each finished block of a side: one table in ``folder``
    (rows: cell, trial, seed, statistics; cell by cell, trial by trial) with provenance
    ``key`` (what every cell shares: spec, seed, task, device, trainer) and each cell's
    ``cell_keys`` entry (its noise, init; none by default). A block kept there with the same
    key gives back the cells it holds with the same cell key."""

    folder: Path
    key: dict = field(default_factory=dict)
    cell_keys: dict | None = None


class _Block(NamedTuple):
    """One block of trials of one side in :func:`run_group`'s plan: its data set, its seeds
    (trials ``start`` to ``stop``), its file in the store, what is kept there and the cells
    still to train."""

    side: str
    label: int
    k: int
    X: torch.Tensor
    y: torch.Tensor
    seeds: list[int]
    start: int
    path: Path | None
    kept: pd.DataFrame
    todo: list[str]

    @property
    def stop(self) -> int:
        return self.start + len(self.seeds)


class _Group(NamedTuple):
    """What :func:`run_group` trains (its arguments), for its steps."""

    task: Task
    attack: str
    model: dpsgd.ModelSpec
    cells: dict[str, dpsgd.DPSGDConfig]
    init: dpsgd.Params | None
    store: Store | None
    cell_keys: dict[str, dict]


def run_group(task: Task, attack: str, model: dpsgd.ModelSpec,
              cells: dict[str, dpsgd.DPSGDConfig], ks, trials: int, seed: int,
              name: tuple[str, str], init: dpsgd.Params | None = None,
              clipbkd_d0: str = "flipped", *, calls: Calls = Calls(),
              store: Store | None = None) -> dict[str, pd.DataFrame]:
    """Train and score every cell of a group (one column per cell) on each side of
    ``attack`` (:func:`sides` with ``ks`` and ``clipbkd_d0``), ``trials`` models per side
    and cell, as ``calls`` says.

    ``cells``: {cell id: its DPSGDConfig} (they share epochs, batch size, lr and
    sampling). ``name = (dataset, arch)`` keys the model seeds (:func:`model_seeds`): a
    trial's seed is the same in every cell, so one wide call (:func:`dpaudit.dpsgd.train`)
    trains all of them on one gather of each batch. With ``store``, each finished block of
    a side is kept there (:class:`Store`), and a rerun trains only the missing cells of
    each block: an interrupted job loses at most the blocks of the call it was in.

    Calls: the blocks of a side that lack the same cells are trained together, a call
    spanning several blocks or part of one. With "shuffle" sampling and gathered batches
    every model is the same bit for bit whatever the calls (a seed's batches and draws are
    its own, and each model's products are computed alone); "poisson" pads each step's
    batches to the call's largest, which changes the float summation order, and a step on
    shared data (:func:`dpaudit.dpsgd.sampling.shares_data`) computes every model of the
    call in one product, whose kernel a GPU may choose by its size: there a call never
    spans two blocks (as the blocks' layout, kept in the restore key, fixes them).

    Returns {cell id: one row per model: side, label, k, trial, seed, the statistics and
    the test accuracy}.
    """
    say = calls.log or (lambda msg: None)
    group = _Group(task, attack, model, cells, init, store,
                   (store and store.cell_keys) or {c: {} for c in cells})
    plan: list[_Block] = []
    for side, label, k, (X, y) in sides(task, attack, ks, clipbkd_d0):
        X, y = torch.as_tensor(X), torch.as_tensor(y)  # once per side, for all its blocks
        side_seeds = model_seeds(seed, *name, attack, side, trials)
        for start in range(0, trials, calls.block):
            plan.append(_planned(group, side, label, k, X, y,
                                 side_seeds[start:start + calls.block], start,
                                 calls.on_trained is None, say))
    total = sum(len(p.seeds) * len(p.todo) for p in plan)
    restored = sum(len(p.seeds) * len(cells) for p in plan) - total
    say(f"{attack}: {len(cells)} cells x {len(plan)} blocks of trials: {restored} models "
        f"restored, {total} to train")
    tables: list[pd.DataFrame | None] = [None] * len(plan)
    progress = _Progress(attack, total, calls.every_s, say)
    i = 0
    while i < len(plan):
        j = _span_end(group, plan, i)
        if not plan[i].todo:
            tables[i] = plan[i].kept.drop(columns="_key")
        else:
            _train_span(group, plan, i, j, calls, tables, progress)
        i = j
    return _by_cell(plan, tables, cells)


def _planned(group: _Group, side: str, label: int, k: int, X, y, block_seeds: list[int],
             start: int, restore: bool, say: Callable[[str], None]) -> _Block:
    """One block of a side: its file in the store, what is kept there (if ``restore``) and
    the cells still to train."""
    stop = start + len(block_seeds)
    path = None if group.store is None \
        else Path(group.store.folder) / f"{side}_{start:06d}-{stop:06d}.csv"
    kept = pd.DataFrame() if path is None or not restore \
        else _kept(path, group.store.key, group.cell_keys, side, start, block_seeds,
                   group.attack, say)
    todo = [c for c in group.cells if kept.empty or c not in set(kept.cell)]
    return _Block(side, label, k, X, y, block_seeds, start, path, kept, todo)


def _span_end(group: _Group, plan: list[_Block], i: int) -> int:
    """The end of the blocks that one run of calls trains from block ``i``: the next block
    only where spanning keeps every model the same bit for bit, i.e. where each model's
    products are its own (gathered batches of fixed size), and the blocks share their side
    and the cells to train."""
    first = plan[i]
    if not first.todo:
        return i + 1
    cfg = group.cells[first.todo[0]]
    span = cfg.sampling == "shuffle" and not dpsgd.sampling.shares_data(
        group.model, cfg, len(first.X), len(first.todo))
    j = i + 1
    while span and j < len(plan) and plan[j].side == first.side and plan[j].todo == first.todo:
        j += 1
    return j


class _Progress:
    """Models trained of ``total``, said at most every ``every_s`` seconds and at the end."""

    def __init__(self, attack: str, total: int, every_s: float, say: Callable[[str], None]):
        self.attack, self.total, self.every_s, self.say = attack, total, every_s, say
        self.done, self.t0 = 0, time.perf_counter()
        self.last = self.t0

    def block_done(self, blk: _Block, models: int) -> None:
        self.done += models
        now = time.perf_counter()
        if now - self.last >= self.every_s or self.done == self.total:
            self.last, rate = now, self.done / max(now - self.t0, 1e-9)
            self.say(f"{self.attack} side {blk.side}, trials {blk.start}-{blk.stop - 1}: "
                     f"{self.done}/{self.total} models, {rate:.2f} models/s, about "
                     f"{(self.total - self.done) / rate:.0f} s left")


def _train_span(group: _Group, plan: list[_Block], i: int, j: int, calls: Calls,
                tables: list, progress: _Progress) -> None:
    """Train the cells to train of blocks ``i`` to ``j`` (one side), ``calls.per_call``
    seeds per call, and fill each block's table (kept and written to the store) as soon as
    its trials are scored."""
    model, todo = group.model, plan[i].todo
    side, X, y, first = plan[i].side, plan[i].X, plan[i].y, plan[i].start
    cfgs = [group.cells[c] for c in todo]
    run_seeds = [s for p in plan[i:j] for s in p.seeds]
    K = calls.per_call or dpsgd.seeds_per_call(model, len(X), cfgs[0], len(todo),
                                               calls.device, limit=len(run_seeds),
                                               jobs_per_gpu=calls.jobs_per_gpu)
    scored, pending = [], list(range(i, j))
    for at in range(0, len(run_seeds), K):
        chunk = run_seeds[at:at + K]
        with dpsgd.matmul_precision(calls.precision):
            trained = dpsgd.train(X, y, model, cfgs, chunk, init=group.init,
                                  device=calls.device)
        if calls.on_trained is not None:
            calls.on_trained(side, first + at, dict(zip(todo, trained)))
        scored += [_block_rows(side, first + at, chunk, c,
                               score_models(p, model, group.task, group.attack))
                   for c, p in zip(todo, trained)]
        trained_to = first + at + len(chunk)  # trials [first, trained_to) are scored
        while pending and plan[pending[0]].stop <= trained_to:
            b = pending.pop(0)
            rows = pd.concat(scored, ignore_index=True)
            mine = rows.trial.between(plan[b].start, plan[b].stop - 1)
            tables[b] = _finished_block(group, plan[b], rows[mine])
            scored = [rows[~mine]]
            progress.block_done(plan[b], len(plan[b].seeds) * len(todo))


def _finished_block(group: _Group, blk: _Block, rows: pd.DataFrame) -> pd.DataFrame:
    """A block's table: what was kept, then its newly scored ``rows`` cell by cell, trial
    by trial; written to the store (its provenance: the key and every cell's key) if one."""
    from ...io import write_table

    order = rows.assign(_c=rows.cell.map(blk.todo.index)).sort_values(
        ["_c", "trial"], kind="stable").drop(columns="_c")
    table = pd.concat(([blk.kept.drop(columns="_key")] if not blk.kept.empty else [])
                      + [order], ignore_index=True)
    if blk.path is not None:
        held = {c: group.cell_keys[c] for c in blk.todo}
        if not blk.kept.empty:
            held = {**dict(zip(blk.kept.cell, blk.kept._key)), **held}
        write_table(table, blk.path, {"key": group.store.key, "cells": held,
                                      "side": blk.side, "trials": [blk.start, blk.stop]})
    return table


def _by_cell(plan: list[_Block], tables: list[pd.DataFrame],
             cells: dict) -> dict[str, pd.DataFrame]:
    """{cell id: its rows of every block, with each block's label and k}."""
    out: dict[str, list] = {c: [] for c in cells}
    for p, table in zip(plan, tables):
        for c in cells:
            part = table[table.cell == c].drop(columns="cell").sort_values("trial")
            out[c].append(part.assign(label=p.label, k=p.k))
    lead = ["side", "label", "k", "trial", "seed"]
    result = {}
    for c, parts in out.items():
        df = pd.concat(parts, ignore_index=True)
        result[c] = df[lead + [col for col in df.columns if col not in lead]]
    return result
