"""The DP-SGD audits of Jagielski, Ullman, Oprea (2020): tasks, trials and their bounds.

The paper's Algorithms 1-4, Figure 2 and Table 2 (as summarised in the CY 7790 Lecture 17
notes, Northeastern 2021) and the authors' code
(``jagielski/auditing-dpsgd``). One *cell* is a training setup (data set, model, clipping
norm C, initialisation, noise multiplier) and one *attack*; it trains T models on each of
the attack's neighbouring data sets (its *sides*) and scores every model:

=========  ===================================  ===========================================
attack     D0 (label 0 = "out")                 D1 (label 1 = "in"), one side per k
=========  ===================================  ===========================================
mi         the task without its last row        the task (its last row is the target)
backdoor   the task                             last k rows -> patched class-0 images,
                                                labelled 1 (Algorithm 3, ``make_old.py``)
clipbkd    last row -> (x_p, 1 - y_p)           last k rows -> (x_p, y_p) (Algorithm 4,
           (``d0="flipped"``, the reference's   ``make_new.py``)
           experiments) or the task (``clean``)
=========  ===================================  ===========================================

Statistics (higher = "in", :mod:`dpaudit.canaries`): ``mi`` = minus the loss on the
target; ``backdoor`` = minus the summed loss of the patched class-0 test images with
label 1; ``clipbkd`` = ``(f(x_p) - f(0))_{y_p}`` (Algorithm 4) and ``clipbkd_logit`` =
``f(x_p)_{y_p}`` (the reference's ``make_nps.py``). The bound (:func:`audit_scores`) is
[JUO20] Algorithm 2 with the reference's threshold split: the first half of each side's
trials choose the threshold, the second half give the Clopper-Pearson eps_LB at
``1 - alpha`` for a group of k rows (``dpaudit.bounds``).

The training-set order is random (FMNIST: the reference's subset draw; CIFAR: a seeded
permutation), so "the last rows" are random rows, as in the reference. Model seeds
depend on the attack, side and trial, never on C, the init or the noise, so every cell
of a grid sees the same batches and noise draws (paired comparisons across the grid).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import partial
from typing import Callable

import numpy as np
import pandas as pd
import torch

from .. import bounds, canaries, dpsgd, seeds

ATTACKS = ("mi", "backdoor", "clipbkd")
DATASETS = ("fmnist", "cifar")
#: Statistic columns of a score table, by attack (the first is the attack's primary one).
STATISTICS = {"mi": ("mi",), "backdoor": ("backdoor",), "clipbkd": ("clipbkd", "clipbkd_logit")}
#: Keys of ``jagielski-train --spec``: what a job's models depend on (the rule passes only
#: these; ``noise``: the multiplier of each eps label the job trains; ``matmul_precision``
#: from the ``jagielski`` section, the rest before ``hidden`` too, the others from the data
#: set's).
TRAIN_KEYS = ("trials", "ks", "sampling", "clipbkd_d0", "epochs", "batch_size", "lr", "hidden",
              "noise", "matmul_precision")
#: Keys of a data set's section that its task depends on (``jagielski-task --spec``).
TASK_KEYS = ("clipbkd_norm", "pretrain_epochs", "pretrain_images")
#: Keys of ``jagielski-audit --spec``.
AUDIT_KEYS = ("alpha", "delta", "select_frac")
#: Keys of the ``jagielski`` section that a Figure 2 or Table 2 table records besides
#: :data:`AUDIT_KEYS` (with its own grid, ``fig2`` or ``table2``): what its cells were
#: trained with, which ``snakemake --report`` compares with the config its captions quote.
MADE_WITH_KEYS = ("trials", "ks", "sampling", "clipbkd_d0", "matmul_precision", "datasets")
#: Arrays of a task file (``dpaudit jagielski-task``).
TASK_ARRAYS = ("X", "y", "X_test", "y_test", "pool_X", "pool_y", "bkd_test_X", "bkd_test_y",
               "x_p", "y_p")


@dataclass(frozen=True)
class Task:
    """A 2-class audit task: training set in random order, test set, and the canaries.

    ``pool_X/pool_y``: backdoor poisons (the last k replace the last k training rows);
    ``bkd_test_X/bkd_test_y``: the patched test points BACKDOORTEST sums the loss over;
    ``x_p/y_p``: the ClipBKD poison.
    """

    X: np.ndarray
    y: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    pool_X: np.ndarray
    pool_y: np.ndarray
    bkd_test_X: np.ndarray
    bkd_test_y: np.ndarray
    x_p: np.ndarray
    y_p: int

    @classmethod
    def from_arrays(cls, arrays: dict) -> "Task":
        missing = [k for k in TASK_ARRAYS if k not in arrays]
        if missing:
            raise ValueError(f"task file lacks arrays {missing}")
        return cls(**{k: (int(arrays[k]) if k == "y_p" else np.asarray(arrays[k]))
                      for k in TASK_ARRAYS})

    def arrays(self) -> dict:
        return {k: np.asarray(getattr(self, k)) for k in TASK_ARRAYS}


def make_task(X, y, X_test, y_test, pool_X, pool_y, bkd_test_X, bkd_test_y,
              clipbkd_norm: float | None = 10.0) -> Task:
    """A :class:`Task` with the ClipBKD poison of ``(X, y)``: ``x_p`` of norm
    ``clipbkd_norm`` along the least-variance direction, ``y_p`` its least likely class
    under a logistic regression fitted on the clean data (:func:`canaries.clipbkd_point`).
    ``clipbkd_norm=None``: the median row norm of ``X`` (CY 7790 Lecture 17: "scaled to a similar
    norm as the rest of the dataset"; used for CIFAR features, whose scale is not pixels')."""
    X = np.asarray(X, dtype=np.float32)
    norm = float(np.median(np.linalg.norm(X, axis=1))) if clipbkd_norm is None else clipbkd_norm
    x_p, y_p = canaries.clipbkd_point(X, y, norm)
    return Task(X, np.asarray(y, np.int64), np.asarray(X_test, np.float32),
                np.asarray(y_test, np.int64), np.asarray(pool_X, np.float32),
                np.asarray(pool_y, np.int64), np.asarray(bkd_test_X, np.float32),
                np.asarray(bkd_test_y, np.int64), x_p.astype(np.float32), y_p)


#: Backdoor poison pool: the reference draws 16 points and inserts the last k.
POOL_SIZE = 16


def fmnist_task(root=None, download: bool = False, seed: int = 0, pool_size: int = POOL_SIZE,
                clipbkd_norm: float | None = 10.0, **data_kw) -> tuple[Task, dict]:
    """The reference's FMNIST task (``make_new.py``, ``make_old.py``): classes 0/1, the
    random half of the 12,000 training images drawn with ``seed`` (n = 6000; seed 0 is
    the reference's subset), the whole 2-class test split, the backdoor pool drawn from the
    same random stream next (as ``make_old.py``), and the ClipBKD poison of norm 10."""
    from .. import data

    X, y = data.load_fmnist(root, (0, 1), seed=seed, download=download, **data_kw)
    X_test, y_test = data.load_fmnist(root, (0, 1), train=False, download=download, **data_kw)
    _, labels = data.fmnist_raw(root, download=download, **data_kw)
    _, stream = data.subset_indices(int(np.isin(labels, (0, 1)).sum()), 0.5, seed)
    pool = canaries.backdoor_pool(X, y, pool_size, rng=stream, image_shape=(28, 28))
    bkd_test = canaries.backdoor_test_set(X_test, y_test, image_shape=(28, 28))
    task = make_task(X, y, X_test, y_test, *pool, *bkd_test, clipbkd_norm=clipbkd_norm)
    return task, {"dataset": "fmnist", "source": "Fashion-MNIST classes 0/1 (torchvision reader)",
                  "n": len(X), "n_test": len(X_test)}


def cifar_task(root=None, download: bool = False, tarball=None, cifar100_root=None,
               pretrain_epochs: int = 20, pretrain_images: int = 0, seed: int = 0,
               pool_size: int = POOL_SIZE, clipbkd_norm: float | None = None, device=None,
               log: Callable[[str], None] | None = None) -> tuple[Task, dict]:
    """The CIFAR-10 task on frozen CNN features (:mod:`dpaudit.features`): pretrain the
    reference's CNN (CIFAR-100, else the 8 CIFAR-10 classes not audited; the first
    ``pretrain_images`` images of a seeded permutation when > 0), then map the audited
    classes' 10,000 training images (seeded random order) and 2,000 test images, the
    patched backdoor pool (white 5x5 top-left patch on class-0 training images, label 1)
    and the patched class-0 test images to 1024-d features. The ClipBKD poison lives in
    feature space (the audited mechanism is DP-SGD on the head)."""
    from .. import data, features

    say = log or (lambda msg: None)
    pre = features.pretraining_data(root, features.AUDIT_CLASSES, cifar100_root, download,
                                    tarball)
    rng = np.random.RandomState(seed)
    keep = rng.permutation(len(pre.labels))
    if pretrain_images:
        keep = keep[:pretrain_images]
    say(f"pretraining the CNN on {len(keep)} images of {pre.source}, {pretrain_epochs} epochs")
    cnn, history = features.pretrain(pre.images[keep], pre.labels[keep], pretrain_epochs, seed,
                                     device)
    train = data.load_cifar10(root, True, features.AUDIT_CLASSES, download, tarball)
    test = data.load_cifar10(root, False, features.AUDIT_CLASSES, download, tarball)
    order = rng.permutation(len(train.labels))
    images, y = train.images[order], train.labels[order]
    pool_img, pool_y = canaries.backdoor_pool(images, y, pool_size, rng=rng, value=255)
    bkd_img, bkd_y = canaries.backdoor_test_set(test.images, test.labels, value=255)
    say("extracting features")
    feats = [features.extract_features(cnn, a, device=device)
             for a in (images, test.images, pool_img, bkd_img)]
    task = make_task(feats[0], y, feats[1], test.labels, feats[2], pool_y, feats[3], bkd_y,
                     clipbkd_norm=clipbkd_norm)
    return task, {"dataset": "cifar", "source": f"CIFAR-10 classes {list(features.AUDIT_CLASSES)}"
                  f" ({train.source})", "pretrained_on": pre.source,
                  "pretrain_images": int(len(keep)), "pretrain_epochs": pretrain_epochs,
                  "pretrain_loss": history, "jpeg_reencoded": train.source != "torchvision",
                  "n": len(y), "n_test": len(test.labels)}


def init_label(value) -> str:
    """File-name form of a config init: ``fixed`` or ``g<s>`` (Glorot-normal weights times s);
    a label is returned as it is."""
    if value == "fixed" or (isinstance(value, str) and value.startswith("g")):
        return value
    return f"g{float(value):g}"


def group_dir(dataset: str, arch: str, attack: str) -> str:
    """Folder of a training group's score tables (an output of the workflow's
    ``jagielski_train``): one group is every cell of one data set, model and attack, the
    cells whose models share their seeds, hence their batches and noise draws."""
    return f"results/jagielski/scores/{dataset}_{arch}_{attack}"


def group_dirs(cells) -> list[str]:
    """The group folders holding ``cells`` (tuples as in :func:`grid_cells`)."""
    return sorted({group_dir(c[0], c[1], c[5]) for c in cells})


def cell_file(clip, init, eps: str) -> str:
    """File name of a cell's score table in its group's folder."""
    return f"c{float(clip):g}_{init_label(init)}_e{eps}.csv"


def cell_path(dataset: str, arch: str, clip, init, eps: str, attack: str) -> str:
    """Score table of one cell (written by its group's ``jagielski_train`` job)."""
    return f"{group_dir(dataset, arch, attack)}/{cell_file(clip, init, eps)}"


#: Where ``jagielski-train`` keeps what it trained, one folder per group and one table per
#: side and block of trials (a column per cell), so that a job Snakemake reruns (the grid
#: grew, the job was interrupted) trains only the blocks and cells it has not finished.
TRAINED_DIR = "results/jagielski/trained"


def check_grid(jag: dict, onerun: dict | None = None) -> None:
    """A ValueError naming the config key if an eps label of Figure 2, Table 2 or the
    one-run comparison (config section ``onerun``) has no noise multiplier in its data
    set's table."""
    f2, t2 = jag["fig2"], jag["table2"]
    wanted = [("jagielski.fig2.eps", d, e) for d in f2["datasets"] for e in f2["eps"]]
    wanted += [("jagielski.table2.eps", t2["dataset"], e) for e in t2["eps"]]
    wanted += [("onerun.eps", "fmnist", e) for e in (onerun or {}).get("eps", [])]
    for key, dataset, label in wanted:
        noise = jag["datasets"][dataset]["noise"]
        if label not in noise:
            raise ValueError(f"config {key}: {label!r} is not a key of "
                             f"jagielski.datasets.{dataset}.noise "
                             f"(allowed: {sorted(noise)})")


def train_spec(jag: dict, dataset: str, labels) -> dict:
    """The ``jagielski-train --spec`` of a group: :data:`TRAIN_KEYS` from the ``jagielski``
    config section and its data set's section, ``noise`` only for ``labels``, nothing else
    (:func:`check_grid` has checked the labels)."""
    ds = jag["datasets"][dataset]
    spec = {**jag, **ds, "noise": {e: ds["noise"][e] for e in labels}}
    return {k: spec[k] for k in TRAIN_KEYS}


def table_spec(jag: dict, experiment: str) -> dict:
    """The ``jagielski-audit --spec`` of ``experiment`` (``fig2`` or ``table2``): the keys
    it uses, :data:`AUDIT_KEYS`, and those it records, :data:`MADE_WITH_KEYS` and its
    grid."""
    return {k: jag[k] for k in (*AUDIT_KEYS, *MADE_WITH_KEYS, experiment)}


def grid_cells(jag: dict, onerun: dict | None = None) -> dict[str, list[tuple]]:
    """The cells (dataset, arch, clip, init label, eps label, attack) of Figure 2, Table 2
    and, given the ``onerun`` config section, of the one-run figure's many-model
    comparison (FMNIST ClipBKD at Figure 2's clip); ``all``: every cell trained, a cell in
    several grids once."""
    f2, t2 = jag["fig2"], jag["table2"]
    fig2 = [(d, a, float(f2["clip"]), init_label(f2["init"]), e, att) for d in f2["datasets"]
            for a in f2["archs"] for e in f2["eps"] for att in f2["attacks"]]
    table2 = [(t2["dataset"], t2["arch"], float(c), init_label(i), e, "clipbkd")
              for c in t2["clips"] for i in t2["inits"] for e in t2["eps"]]
    one = [("fmnist", a, float(f2["clip"]), init_label(onerun["init"]), e, "clipbkd")
           for a in onerun["archs"] for e in onerun["eps"]] if onerun else []
    return {"fig2": fig2, "table2": table2, "onerun": one, "all": sorted(set(fig2 + table2 + one))}


def groups(cells) -> dict[tuple[str, str, str], list[tuple]]:
    """The training groups (dataset, arch, attack) of ``cells`` (tuples as in
    :func:`grid_cells`), each with its sorted cells (clip, init label, eps label)."""
    out: dict[tuple, set] = {}
    for d, a, clip, init, eps, att in cells:
        out.setdefault((d, a, att), set()).add((float(clip), init, eps))
    return {g: sorted(c, key=lambda c: (c[0], c[1], float(c[2])))  # float("inf") is inf
            for g, c in sorted(out.items())}


def grid_models(jag: dict, onerun: dict | None = None) -> dict[str, int]:
    """Models each grid of :func:`grid_cells` trains: ``trials`` per side, sides = D0 and
    one D1 per k (MI: D0 and D1)."""
    per_cell = lambda cell: jag["trials"] * (2 if cell[5] == "mi" else 1 + len(jag["ks"]))  # noqa: E731
    return {name: sum(map(per_cell, cells))
            for name, cells in grid_cells(jag, onerun).items() if name != "onerun"}


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
    from .. import canaries as canaries_mod
    from ..io import source_digest

    return source_digest(dpsgd, canaries_mod, seeds, sides, model_seeds, score_models,
                         run_group)


def _block_rows(side: str, start: int, seeds_: list[int], cell: str, stats: dict) -> pd.DataFrame:
    return pd.DataFrame({"cell": cell, "side": side, "trial": np.arange(start, start + len(seeds_)),
                         "seed": seeds_, **{k: np.asarray(v, np.float64) for k, v in stats.items()}})


def _kept(path, key: dict, cells: dict) -> pd.DataFrame:
    """The rows of a kept block whose shared ``key`` and own cell key match (JSON
    comparison), for every cell it holds, of ``cells`` or not; empty if none."""
    from ..io import as_recorded, read_table

    try:
        table, prov = read_table(path)
    except (OSError, ValueError):
        return pd.DataFrame()
    if prov.get("key") != as_recorded(key):
        return pd.DataFrame()
    held = prov.get("cells", {})
    ok = [c for c, ck in held.items() if c not in cells or ck == as_recorded(cells[c])]
    return table[table.cell.isin(ok)].assign(_key=lambda t: t.cell.map(held))


def run_group(task: Task, attack: str, model: dpsgd.ModelSpec,
              cells: dict[str, dpsgd.DPSGDConfig], ks, trials: int, seed: int,
              name: tuple[str, str], init: dpsgd.Params | None = None,
              clipbkd_d0: str = "flipped", block: int = 100, device=None,
              log: Callable[[str], None] | None = None, store=None, key: dict | None = None,
              cell_keys: dict[str, dict] | None = None,
              on_trained: Callable[[str, int, dict], None] | None = None,
              every_s: float = 15.0, precision: str = "fp32", jobs_per_gpu: int = 1,
              per_call: int | None = None) -> dict[str, pd.DataFrame]:
    """Train and score every cell of a group (one column per cell) on each side of
    ``attack``, ``trials`` models per side and cell.

    ``cells``: {cell id: its DPSGDConfig} (they share epochs, batch size, lr and
    sampling). ``name = (dataset, arch)`` keys the model seeds (:func:`model_seeds`): a
    trial's seed is the same in every cell, so one wide call (:func:`dpaudit.dpsgd.train`)
    trains all of them on one gather of each batch. Trials go in blocks of ``block``
    (trials [0, block), [block, 2 block), ...); with ``store`` (a folder), each finished
    block of a side is written there as one table (rows: cell, trial, seed, statistics;
    cell by cell, trial by trial) with provenance ``key`` (what every cell shares: spec,
    seed, task, device, trainer) and each cell's ``cell_keys`` entry (its noise, init), and
    a block kept there with the same key gives back the cells it holds with the same cell
    key: a rerun trains only the missing cells of each block, an interrupted job loses at
    most the blocks of the call it was in. ``on_trained(side, start, {cell: Params})`` sees
    every trained call's models.

    Calls: the blocks of a side that lack the same cells are trained together, ``per_call``
    seeds per call (default :func:`dpaudit.dpsgd.seeds_per_call`: as many as the device's
    memory holds, a GPU being shared by ``jobs_per_gpu`` jobs), a call spanning several
    blocks or part of one. With "shuffle" sampling every model is the same bit for bit
    whatever the calls (a seed's batches and draws are its own, and each model's products
    are computed alone); "poisson" pads each step's batches to the call's largest, which
    changes the float summation order, so there a call never spans two blocks (as the
    blocks' layout, kept in the restore key, fixes them). ``precision``: the matmul
    precision of training (:func:`dpaudit.dpsgd.matmul_precision`).

    Returns {cell id: one row per model: side, label, k, trial, seed, the statistics and
    the test accuracy}.
    """
    from pathlib import Path

    from ..io import write_table

    say = log or (lambda msg: None)
    cell_keys = cell_keys or {c: {} for c in cells}
    if per_call is not None and (isinstance(per_call, bool) or int(per_call) != per_call
                                 or per_call < 1):
        raise ValueError(f"per_call={per_call!r}: must be an integer >= 1 or None")
    plan = []
    for side, label, k, (X, y) in sides(task, attack, ks, clipbkd_d0):
        X, y = torch.as_tensor(X), torch.as_tensor(y)  # once per side, for all its blocks
        side_seeds = model_seeds(seed, *name, attack, side, trials)
        for start in range(0, trials, block):
            stop = min(start + block, trials)
            path = None if store is None else Path(store) / f"{side}_{start:06d}-{stop:06d}.csv"
            kept = pd.DataFrame() if path is None or on_trained is not None \
                else _kept(path, key or {}, cell_keys)
            todo = [c for c in cells if kept.empty or c not in set(kept.cell)]
            plan.append((side, label, k, X, y, side_seeds[start:stop], start, path, kept, todo))
    total = sum(len(p[5]) * len(p[9]) for p in plan)
    restored = sum(len(p[5]) * len(cells) for p in plan) - total
    say(f"{attack}: {len(cells)} cells x {len(plan)} blocks of trials: {restored} models "
        f"restored, {total} to train")
    span = next(iter(cells.values())).sampling == "shuffle"
    tables: list[pd.DataFrame | None] = [None] * len(plan)
    done, t0 = 0, time.perf_counter()
    last = t0
    i = 0
    while i < len(plan):
        side, label, k, X, y, _, first, _, kept, todo = plan[i]
        j = i + 1
        if not todo:
            tables[i] = kept.drop(columns="_key")
            i = j
            continue
        while span and j < len(plan) and plan[j][0] == side and plan[j][9] == todo:
            j += 1
        run_seeds = [s for p in plan[i:j] for s in p[5]]
        cfgs = [cells[c] for c in todo]
        K = per_call or dpsgd.seeds_per_call(model, len(X), cfgs[0], len(todo), device,
                                             limit=len(run_seeds), jobs_per_gpu=jobs_per_gpu)
        scored, pending = [], list(range(i, j))
        for at in range(0, len(run_seeds), K):
            chunk = run_seeds[at:at + K]
            with dpsgd.matmul_precision(precision):
                trained = dpsgd.train(X, y, model, cfgs, chunk, init=init, device=device)
            if on_trained is not None:
                on_trained(side, first + at, dict(zip(todo, trained)))
            scored += [_block_rows(side, first + at, chunk, c,
                                   score_models(p, model, task, attack))
                       for c, p in zip(todo, trained)]
            trained_to = first + at + len(chunk)  # trials [first, trained_to) are scored
            while pending and plan[pending[0]][6] + len(plan[pending[0]][5]) <= trained_to:
                b = pending.pop(0)
                _, _, _, _, _, block_seeds, start, path, kept, _ = plan[b]
                rows = pd.concat(scored, ignore_index=True)
                mine = rows.trial.between(start, start + len(block_seeds) - 1)
                order = rows[mine].assign(_c=rows.cell.map(todo.index)).sort_values(
                    ["_c", "trial"], kind="stable").drop(columns="_c")
                table = pd.concat(([kept.drop(columns="_key")] if not kept.empty else [])
                                  + [order], ignore_index=True)
                scored = [rows[~mine]]
                if path is not None:
                    held = {c: cell_keys[c] for c in todo}
                    if not kept.empty:
                        held = {**dict(zip(kept.cell, kept._key)), **held}
                    write_table(table, path, {"key": key or {}, "cells": held, "side": side,
                                              "trials": [start, start + len(block_seeds)]})
                tables[b] = table
                done += len(block_seeds) * len(todo)
                now = time.perf_counter()
                if now - last >= every_s or done == total:
                    last, rate = now, done / max(now - t0, 1e-9)
                    say(f"{attack} side {side}, trials {start}-{start + len(block_seeds) - 1}: "
                        f"{done}/{total} models, {rate:.2f} models/s, about "
                        f"{(total - done) / rate:.0f} s left")
        i = j
    out: dict[str, list] = {c: [] for c in cells}
    for (side, label, k, *_), table in zip(plan, tables):
        for c in cells:
            part = table[table.cell == c].drop(columns="cell").sort_values("trial")
            out[c].append(part.assign(label=label, k=k))
    lead = ["side", "label", "k", "trial", "seed"]
    result = {}
    for c, parts in out.items():
        df = pd.concat(parts, ignore_index=True)
        result[c] = df[lead + [col for col in df.columns if col not in lead]]
    return result


def audit_scores(scores: pd.DataFrame, attack: str, alpha: float, delta: float,
                 select_frac: float = 0.5, statistic: str | None = None,
                 split_only: bool = False) -> pd.DataFrame:
    """Bounds of one cell's scores, one row per k (D1 side against the D0 side), each at
    ``1 - alpha`` for that k alone.

    Columns: ``eps_lb`` (Clopper-Pearson, [JUO20] Alg. 2, threshold chosen on the first
    ``select_frac`` of the trials and evaluated on the rest; per row of a group of k
    rows by [JUO20] Lemma 1 with ``delta``), its threshold and counts (``tpr``, ``fpr`` on
    the evaluation trials, and the counts ``ct_eval_pos`` of ``n_eval_pos``, ``ct_eval_neg``
    of ``n_eval_neg``); ``eps_lb_scan`` (every threshold on all trials, union bound over
    count values); ``mu_lb_group`` (Gaussian DP of the whole group, same split) and
    ``mu_lb = mu_lb_group / k``, per row (k rows of a mu-GDP mechanism compose to at most
    k mu); ``eps_lb_gdp`` = ``eps_from_mu(mu_lb, delta)``, which holds only if the models
    are exactly mu-GDP (Nasr et al. 2023's assumption), which subsampled DP-SGD is not: an
    estimate, never a certified bound; ``eps_lb_katz`` (approximate: Katz log intervals)
    and ``eps_lb_bayes`` (lower end of a Bayesian credible interval) from the evaluation
    counts of ``eps_lb``'s threshold, at the same alpha, delta and k.  The attack's ROC
    measures on the evaluation trials (Carlini et al. 2022): ``tpr_at_fpr_0_1pct``,
    ``tpr_at_fpr_1pct`` and ``auc``.  ``split_only``: the split columns alone.
    """
    stat = statistic or STATISTICS[attack][0]
    if stat not in scores:
        raise ValueError(f"scores lack the statistic column {stat!r}")
    neg = bounds.scores_array(f"scores[{stat!r}] of D0", scores.loc[scores.label == 0]
                              .sort_values("trial")[stat], 2)
    out = []
    for k, grp in scores.loc[scores.label == 1].groupby("k"):
        pos = bounds.scores_array(f"scores[{stat!r}] of D1 (k={k})",
                                  grp.sort_values("trial")[stat], 2)
        cp = partial(_cp, delta=delta, k=int(k))
        halves = bounds.split_trials(pos, neg, select_frac)  # select, select, eval, eval
        split = bounds.threshold_holdout_audit(*halves, cp, alpha)
        row = {"statistic": stat, "k": int(k), "eps_lb": split.value,
               "threshold": split.threshold, "tpr": split.ct_pos / split.n_pos,
               "fpr": split.ct_neg / split.n_neg, "ct_eval_pos": split.ct_pos,
               "n_eval_pos": split.n_pos, "ct_eval_neg": split.ct_neg,
               "n_eval_neg": split.n_neg}
        if not split_only:
            counts = (split.ct_pos, split.n_pos, split.ct_neg, split.n_neg, alpha, delta, int(k))
            eval_pos, eval_neg = halves[2:]
            scan = bounds.threshold_scan_audit(pos, neg, cp, alpha)
            gdp = bounds.threshold_holdout_audit(*halves, bounds.mu_lb_gdp, alpha)
            row.update({name: bounds.tpr_at_fpr(eval_pos, eval_neg, level)
                        for name, level in ROC_LEVELS.items()},
                       auc=bounds.auc(eval_pos, eval_neg),
                       eps_lb_katz=bounds.eps_lb_katz(*counts),
                       eps_lb_bayes=bounds.eps_lb_bayes(*counts),
                       eps_lb_scan=scan.value, mu_lb_group=gdp.value, mu_lb=gdp.value / k,
                       eps_lb_gdp=bounds.eps_gdp_estimate(gdp.value / k, delta))
        out.append(row)
    if not out:
        raise ValueError("scores have no D1 trials (label 1)")
    return pd.DataFrame(out)


#: The ROC columns of :func:`audit_scores`: the TPR at each FPR limit (Carlini et al. 2022).
ROC_LEVELS = {"tpr_at_fpr_0_1pct": 0.001, "tpr_at_fpr_1pct": 0.01}


def _cp(ct_pos, n_pos, ct_neg, n_neg, alpha, *, delta, k):
    return bounds.eps_lb_clopper_pearson(ct_pos, n_pos, ct_neg, n_neg, alpha, delta, k)


#: What each bound column of :func:`summarize_cell` is (figures, tables and docs say the same).
COLUMNS = {
    "eps_lb_paper_rule": "the reference code's Table 2 procedure (bounds.eps_lb_paper_rule): "
                         "raw-logit statistic for ClipBKD (the attack's own for MI and "
                         "backdoor), threshold by a DKW-style margin, Clopper-Pearson at 99%, "
                         "delta = 0, largest over k; reproduces the paper's numbers; a maximum "
                         "of several 99% bounds, not itself a 99% bound",
    "eps_lb_best_k": "the largest over k of the per-k bounds, each at 1 - alpha, at eps_lb's "
                     "thresholds; a maximum of several, not itself a 1 - alpha bound",
    "eps_lb": "certified: every k at alpha / len(ks), largest over k (union bound)",
    "eps_lb_split_lo": "diagnostic, not a bound: 5th percentile of eps_lb over random re-splits "
                       "of the same trials into selection and evaluation halves",
    "eps_lb_split_hi": "diagnostic, not a bound: 95th percentile of eps_lb over the same "
                       "re-splits",
    "eps_lb_scan": "certified: every threshold on all trials (union bound over count values) "
                   "and every k (Bonferroni)",
    "mu_lb": "certified per-row mu-GDP lower bound: group mu / k, every k at alpha / len(ks)",
    "eps_lb_gdp": "estimate: eps at delta of mu_lb, assuming the models are exactly mu-GDP",
    "eps_lb_katz": "approximate (asymptotic Katz log intervals for the two rate ratios): "
                   "eps_lb's threshold and evaluation counts, every k at alpha / len(ks), "
                   "largest over k; not certified",
    "eps_lb_bayes": "Bayesian credible interval, lower end (Zanella-Beguelin et al. 2023, "
                    "Jeffreys priors): same counts, level and k as eps_lb_katz; a posterior "
                    "quantile, not a confidence bound",
    "eps_lb_clipbkd_logit": "certified: the reference's raw-logit statistic, as eps_lb",
    "mi_yeom": "estimate: Yeom et al.'s population MI eps (1000 train, 1000 test points), "
               "averaged over models; the paper's MI measure, not a bound",
}

#: The statistic of each attack that the paper's procedure (``eps_lb_paper_rule``) reads:
#: the reference scores ClipBKD by the raw logit ``f(x_p)_{y_p}`` (``make_nps.py`` never
#: subtracts ``f(0)``); MI and the backdoor by their own statistic.
PAPER_STATISTIC = {"mi": "mi", "backdoor": "backdoor", "clipbkd": "clipbkd_logit"}
#: Random re-splits behind ``eps_lb_split_lo`` and ``eps_lb_split_hi``.
RESPLITS = 200
#: Their percentiles.
SPLIT_PERCENTILES = (5.0, 95.0)


def _sides(scores: pd.DataFrame, stat: str) -> tuple[dict[int, np.ndarray], np.ndarray]:
    """``({k: D1 scores}, D0 scores)`` of column ``stat``, each in trial order."""
    if stat not in scores:
        raise ValueError(f"scores lack the statistic column {stat!r}")
    neg = bounds.scores_array(f"scores[{stat!r}] of D0", scores.loc[scores.label == 0]
                              .sort_values("trial")[stat], 2)
    pos = {int(k): bounds.scores_array(f"scores[{stat!r}] of D1 (k={k})",
                                       g.sort_values("trial")[stat], 2)
           for k, g in scores.loc[scores.label == 1].groupby("k")}
    return pos, neg


def summarize_cell(scores: pd.DataFrame, attack: str, alpha: float, delta: float,
                   select_frac: float = 0.5, resplits: int = 0, seed=0) -> dict:
    """One cell's result row (:data:`COLUMNS` says what each bound is).

    Each k's threshold is chosen once, on the first ``select_frac`` of the trials, by the
    primary statistic's Clopper-Pearson bound at ``alpha / len(ks)``, and its evaluation
    counts give both ``eps_lb`` (every k at ``alpha / len(ks)``, the largest over k: valid
    at ``1 - alpha`` by the union bound) and ``eps_lb_best_k`` (every k at ``alpha``, the
    largest over k: not itself a bound), so ``eps_lb <= eps_lb_best_k`` always;
    ``best_k``, ``tpr``, ``fpr``, ``threshold`` and the ROC measures (:data:`ROC_LEVELS`,
    ``auc``, evaluation trials) belong to ``best_k``. ``eps_lb_scan``, ``mu_lb`` (per row),
    the other ClipBKD statistic's ``eps_lb_<stat>``, ``eps_lb_katz`` (approximate) and
    ``eps_lb_bayes`` (credible interval): at ``alpha / len(ks)``, largest over k;
    ``eps_lb_gdp``: the eps of ``mu_lb``, an estimate. ``eps_lb_paper_rule``: the paper's
    own procedure on :data:`PAPER_STATISTIC` (:func:`dpaudit.bounds.eps_lb_paper_rule`,
    the reference's levels; ``select_frac`` as here). With ``resplits`` > 0,
    ``eps_lb_split_lo`` and ``eps_lb_split_hi``: :data:`SPLIT_PERCENTILES` of ``eps_lb``
    over that many random re-splits drawn from ``seed``
    (:func:`dpaudit.bounds.eps_lb_resplits`), a diagnostic of the split, not a bound.
    Also the number of trials per side and the mean test accuracy."""
    n_k = int(scores.loc[scores.label == 1, "k"].nunique())
    level = alpha / max(n_k, 1)
    per_k = audit_scores(scores, attack, level, delta, select_frac)
    at_alpha = np.array([bounds.eps_lb_clopper_pearson(r.ct_eval_pos, r.n_eval_pos,
                                                       r.ct_eval_neg, r.n_eval_neg, alpha,
                                                       delta, int(r.k))
                         for r in per_k.itertuples()])
    i = int(at_alpha.argmax())
    best = per_k.iloc[i]
    mu_lb = float(per_k.mu_lb.max())
    pos, neg = _sides(scores, PAPER_STATISTIC[attack])
    row = {"eps_lb_paper_rule": bounds.eps_lb_paper_rule(pos, neg, select_frac).value,
           "eps_lb_best_k": float(at_alpha[i]), "best_k": int(best.k),
           "tpr": float(best.tpr), "fpr": float(best.fpr), "threshold": float(best.threshold),
           **{name: float(best[name]) for name in [*ROC_LEVELS, "auc"]},
           "eps_lb": float(per_k.eps_lb.max())}
    if resplits:
        pos, neg = _sides(scores, STATISTICS[attack][0])
        spread = bounds.eps_lb_resplits(pos, neg, alpha, delta, select_frac, resplits, seed)
        row["eps_lb_split_lo"], row["eps_lb_split_hi"] = (
            float(v) for v in np.percentile(spread, SPLIT_PERCENTILES))
    row.update({"eps_lb_scan": float(per_k.eps_lb_scan.max()),
                "mu_lb": mu_lb, "eps_lb_gdp": bounds.eps_gdp_estimate(mu_lb, delta),
                "eps_lb_katz": float(per_k.eps_lb_katz.max()),
                "eps_lb_bayes": float(per_k.eps_lb_bayes.max())})
    for stat in STATISTICS[attack][1:]:
        row[f"eps_lb_{stat}"] = float(audit_scores(scores, attack, level, delta, select_frac,
                                                   statistic=stat, split_only=True).eps_lb.max())
    row["trials"] = int((scores.label == 0).sum())
    row["test_acc"] = float(scores.test_acc.mean())
    if "mi_yeom" in scores:  # the paper averages it over 10 models; here over every model
        row["mi_yeom"] = float(scores.mi_yeom.mean())
    return row


def theoretical_eps(noise: float, n: int, cfg: dpsgd.DPSGDConfig, delta: float) -> dict:
    """The cell's theoretical eps (:func:`dpaudit.accounting.dpsgd_epsilons`): sample rate
    ``B / n`` over the trained steps (Poisson subsampling, as the accountants assume)."""
    from .. import accounting  # dp_accounting takes ~1 s to import: only where needed

    return accounting.dpsgd_epsilons(noise, cfg.batch_size / n, cfg.steps(n), delta)


#: [JUO20] Table 2: ClipBKD eps_LB of the FMNIST 2-layer net, the largest over
#: k = 1, 2, 4, 8 of bounds each at 99% confidence: {(eps label, init): (C = 0.5, 1, 2)}.
PAPER_TABLE2 = {
    ("1", "fixed"): (0.13, 0.15, 0.13), ("1", "g0.5"): (0.13, 0.17, 0.13),
    ("1", "g1"): (0.06, 0.12, 0.09), ("1", "g2"): (0.01, 0.06, 0.08),
    ("2", "fixed"): (0.33, 0.37, 0.28), ("2", "g0.5"): (0.27, 0.33, 0.39),
    ("2", "g1"): (0.10, 0.17, 0.27), ("2", "g2"): (0.01, 0.06, 0.17),
    ("4", "fixed"): (0.89, 0.75, 0.71), ("4", "g0.5"): (0.28, 0.52, 0.78),
    ("4", "g1"): (0.08, 0.20, 0.54), ("4", "g2"): (0.02, 0.10, 0.18),
    ("8", "fixed"): (1.61, 1.85, 1.90), ("8", "g0.5"): (0.33, 0.55, 1.27),
    ("8", "g1"): (0.07, 0.25, 0.53), ("8", "g2"): (0.01, 0.05, 0.20),
    ("16", "fixed"): (2.15, 2.16, 2.43), ("16", "g0.5"): (0.36, 0.80, 1.39),
    ("16", "g1"): (0.13, 0.27, 0.72), ("16", "g2"): (0.02, 0.08, 0.16),
    ("inf", "fixed"): (4.54, 4.54, 4.54), ("inf", "g0.5"): (0.29, 0.95, 2.36),
    ("inf", "g1"): (0.10, 0.42, 0.79), ("inf", "g2"): (0.03, 0.09, 0.27),
}
PAPER_CLIPS = (0.5, 1.0, 2.0)


def paper_table2(eps_label: str, init: str, clip: float) -> float:
    """The paper's Table 2 value of a cell, NaN where the paper has none."""
    values = PAPER_TABLE2.get((str(eps_label), init))
    if values is None or float(clip) not in PAPER_CLIPS:
        return math.nan
    return values[PAPER_CLIPS.index(float(clip))]


def with_paper_table2(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with column ``paper_eps_lb`` (:func:`paper_table2`, the paper's best over
    k) beside ``eps_lb_paper_rule``, the paper's procedure on our scores."""
    paper = [paper_table2(r.eps_label, r.init, r.clip) for r in table.itertuples()]
    out = table.copy()
    out.insert(out.columns.get_loc("eps_lb_paper_rule") + 1, "paper_eps_lb", paper)
    return out


def init_name(init: str) -> str:
    """Column name of an init label: ``fixed init`` or ``Glorot x s`` (weights times s)."""
    return "fixed init" if init == "fixed" else f"Glorot x {init[1:]}"


#: How Table 2 is to be read (the Markdown and the heatmap say it).
TABLE2_NOTES = (
    "Each cell: ours by the paper's procedure (the paper's value) [certified; its 5th-95th "
    "percentile over re-splits], one value per clipping norm C.",
    "ours = eps_lb_paper_rule, the reference code's procedure on our models (raw-logit "
    "ClipBKD score; threshold chosen on half the trials with a DKW-style margin; "
    "Clopper-Pearson at 99% on the other half; delta = 0; the largest over k): it exists to "
    "compare with the paper, whose numbers it reproduces; a maximum of several 99% bounds, "
    "not itself a 99% bound.",
    "[certified] = eps_lb, our audit: every k at 1% / len(ks), the largest over k, at "
    "delta = 1e-5; a 99% lower bound, and often a stronger audit than the paper's rule.",
    "After the semicolon: the 5th-95th percentile of eps_lb over 200 random re-splits of the "
    "same trials into selection and evaluation halves: a diagnostic of how much the split "
    "moves the bound, not a bound. The pre-registered split (the first half of the trials "
    "choose) is the one that certifies.",
    "Glorot x s: Glorot-normal weights multiplied by s (variance s^2 times Glorot's), as the "
    "reference code's init_mult does; the lecture's wording 'variance 0.5 sigma ... 2 sigma' "
    "would be s = sqrt(0.5) ... sqrt(2).",
    "eps_th label: the eps the noise multiplier (in brackets) gives at the paper's training "
    "length, for add/remove neighbours (rdp_classic, as the paper); a run that trains fewer "
    "steps sits at a smaller eps_th (column eps_th). ClipBKD replaces rows, and the "
    "theoretical eps for replacing one row is the table's eps_pld_replace (PLD, replace-one "
    "neighbours), larger than eps_th.",
)


#: Distance from the paper's value within which a Table 2 cell counts as reproduced.
PAPER_TOL = 0.5
#: Columns of a Table 2 table that its Markdown and the comparison with the paper read
#: (``eps_lb_best_k``, ``eps_lb_split_lo`` and ``eps_lb_split_hi`` too where present).
TABLE2_COLUMNS = ("eps_label", "init", "clip", "noise", "eps_lb", "eps_lb_paper_rule",
                  "paper_eps_lb")
#: The column each Table 2 view compares with the paper.
PAPER_COLUMN = "eps_lb_paper_rule"
_SPLIT = ("eps_lb_split_lo", "eps_lb_split_hi")


def eps_label(value) -> str:
    """An eps label as written in the config ("4", "inf"), also after a CSV round trip
    (which reads "4" as 4.0 and "inf" as infinity)."""
    try:
        v = float(value)
    except ValueError:
        return str(value)
    return "inf" if math.isinf(v) else f"{v:g}"


def init_order(init: str) -> tuple[bool, str]:
    """Sort key of init labels: the fixed init first, then the Glorot scales."""
    return init != "fixed", init


def _table2(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with its eps labels as in the config, if it has :data:`TABLE2_COLUMNS`."""
    missing = sorted(set(TABLE2_COLUMNS) - set(table.columns))
    if missing:
        raise ValueError("not a Table 2 table from jagielski-audit --experiment table2 of "
                         f"this version (no column {', '.join(missing)})")
    return table.assign(eps_label=table.eps_label.map(eps_label))


def paper_agreement(table: pd.DataFrame, tol: float = PAPER_TOL,
                    column: str = PAPER_COLUMN) -> dict:
    """How ``column`` (default the paper's procedure, ``eps_lb_paper_rule``) compares with
    ``paper_eps_lb`` over the cells that have both: ``cells``, ``within`` (cells with
    |ours - paper| <= ``tol``), ``tol``, ``rms`` (root mean square of ours - paper),
    ``unmeasured`` (cells the paper has and we do not) and ``mean_diff``, the mean of ours -
    paper by ``init``, ``eps_label`` and ``clip`` (where the two differ systematically)."""
    if not tol >= 0:
        raise ValueError(f"tol={tol}: must be >= 0")
    table = _table2(table)
    if column not in table:
        raise ValueError(f"column={column!r}: not a column of the table")
    paper = table[table.paper_eps_lb.notna()]
    t = paper[paper[column].notna()]
    diff = t[column] - t.paper_eps_lb
    keys = {"init": t.init, "eps_label": t.eps_label, "clip": t["clip"]}
    # The paper's values have two decimals: a difference of exactly tol must not fall out
    # by float rounding.
    return {"column": column, "cells": len(t),
            "within": int((diff.abs() <= tol + 1e-9).sum()), "tol": tol,
            "rms": float(np.sqrt((diff ** 2).mean())) if len(t) else math.nan,
            "unmeasured": len(paper) - len(t),
            "mean_diff": {name: {k: float(v) for k, v in diff.groupby(by).mean().items()}
                          for name, by in keys.items()}}


def _agreement_lines(table: pd.DataFrame, tol: float) -> list[str]:
    agree = paper_agreement(table, tol)
    if not agree["cells"]:
        return []
    by = agree["mean_diff"]

    def means(group: str, order, name) -> str:
        return ", ".join(f"{name(k)} {by[group][k]:+.2f}" for k in sorted(by[group], key=order))

    share = agree["within"] / agree["cells"]
    unmeasured = (f" ({agree['unmeasured']} more cells of the paper have no value here)"
                  if agree["unmeasured"] else "")
    others = []
    for column, name in (("eps_lb", "certified eps_lb"),
                         ("eps_lb_best_k", "eps_lb_best_k (our thresholds, each k at 99%)")):
        if column in table:
            a = paper_agreement(table, tol, column)
            others.append(f"{name} {a['within']} of {a['cells']} (RMS {a['rms']:.2f})")
    lines = ["", f"Against the paper, by its procedure: {agree['within']} of {agree['cells']} "
            f"cells ({share:.0%}) within +-{agree['tol']:g} of its value{unmeasured}, RMS of "
            f"ours - paper {agree['rms']:.2f}. Mean of ours - paper, by init: "
            f"{means('init', init_order, init_name)}; "
            f"by eps_th label: {means('eps_label', float, str)}; "
            f"by C: {means('clip', float, lambda c: f'{c:g}')}."]
    if others:
        lines.append(f"Other columns within +-{tol:g} of the paper: " + "; ".join(others) + ".")
    return lines


def table2_markdown(table: pd.DataFrame, tol: float = PAPER_TOL) -> str:
    """Table 2 as Markdown: rows eps_th label, columns init, cells "ours (paper)
    [certified; split range]" for each clipping norm, separated by " / " as in the paper
    (:data:`TABLE2_NOTES`; the split range where the table has it), then how many cells
    the paper's procedure puts within ``tol`` of the paper, with the mean differences
    (:func:`paper_agreement`), and the same count for the certified and best-over-k
    columns. ValueError if ``table`` lacks :data:`TABLE2_COLUMNS`."""
    table = _table2(table)
    inits = sorted(table.init.unique(), key=init_order)
    clips = sorted(table["clip"].unique())
    labels = sorted(table.eps_label.unique(), key=float)  # float("inf") is inf
    split = all(c in table for c in _SPLIT)
    lines = [f"ClipBKD eps_LB, C = {' / '.join(f'{c:g}' for c in clips)}", "",
             *(f"- {note}" for note in TABLE2_NOTES), "",
             "| eps_th label (noise) | " + " | ".join(init_name(i) for i in inits) + " |",
             "|---" * (len(inits) + 1) + "|"]
    for e in labels:
        sub = table[table.eps_label == e]
        noise = sub.noise.iloc[0]
        cells = []
        for i in inits:
            parts = []
            for c in clips:
                r = sub[(sub.init == i) & (sub["clip"] == c)]
                if r.empty:
                    parts.append("-")
                    continue
                r = r.iloc[0]
                spread = f"; {r.eps_lb_split_lo:.2f}-{r.eps_lb_split_hi:.2f}" if split else ""
                parts.append(f"{r[PAPER_COLUMN]:.2f}"
                             + ("" if math.isnan(r.paper_eps_lb) else f" ({r.paper_eps_lb:.2f})")
                             + f" [{r.eps_lb:.2f}{spread}]")
            cells.append(" / ".join(parts))
        lines.append(f"| {e} ({noise:g}) | " + " | ".join(cells) + " |")
    lines += _agreement_lines(table, tol)
    return "\n".join(lines) + "\n"


__all__ = ["ATTACKS", "DATASETS", "STATISTICS", "TRAIN_KEYS", "TASK_KEYS", "AUDIT_KEYS", "MADE_WITH_KEYS", "Task", "make_task", "sides", "model_seeds",
           "score_models", "run_group", "trainer_digest", "audit_scores", "summarize_cell",
           "COLUMNS", "ROC_LEVELS", "init_label", "init_name", "cell_path", "cell_file", "group_dir",
           "group_dirs",
           "TRAINED_DIR", "check_grid", "table_spec", "grid_cells", "groups", "grid_models", "train_spec",
           "TABLE2_NOTES",
           "theoretical_eps", "PAPER_TABLE2", "paper_table2", "with_paper_table2",
           "PAPER_TOL", "TABLE2_COLUMNS", "PAPER_COLUMN", "PAPER_STATISTIC", "RESPLITS",
           "SPLIT_PERCENTILES", "eps_label", "init_order", "paper_agreement",
           "table2_markdown"]
