"""The audit tasks of Jagielski et al. 2020: training and test rows and the canaries."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ... import canaries

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
    from ... import data

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
    from ... import data, features

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
