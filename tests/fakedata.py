"""Small data sets written in the real on-disk formats (IDX, ImageFolder), for tests."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
from PIL import Image

#: CIFAR-10's classes in torchvision's order, as dpaudit.data names them (a test checks it);
#: here so that writing the tiny data imports no torch (the GPU check's dry run).
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                   "ship", "truck")
FMNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def idx_bytes(arr: np.ndarray) -> bytes:
    """IDX file: magic 0x0000080N (uint8, N dims), big-endian dims, then the bytes."""
    return struct.pack(">I", 0x800 + arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.tobytes()


def fake_fmnist(rng, n_train=60, n_test=20) -> dict[str, np.ndarray]:
    """Random 28x28 uint8 images with labels in 0..9, keyed by the IDX file names."""
    out = {}
    for split, n in (("train", n_train), ("t10k", n_test)):
        out[f"{split}-images-idx3-ubyte"] = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        out[f"{split}-labels-idx1-ubyte"] = rng.integers(0, 10, size=n).astype(np.uint8)
    return out


def write_learnable_fmnist(root: Path, n_train: int, n_test: int = 100) -> None:
    """Fashion-MNIST as torchvision keeps it (ROOT/FashionMNIST/raw, plain IDX files) with
    labels 0/1 alternating and class 1 the brighter, so that a model learns the task:
    random images halved, class 1 shifted up by 128."""
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    arrays = fake_fmnist(np.random.default_rng(0), n_train=n_train, n_test=n_test)
    for split, n in (("train", n_train), ("t10k", n_test)):
        labels = (np.arange(n) % 2).astype(np.uint8)
        arrays[f"{split}-labels-idx1-ubyte"] = labels
        arrays[f"{split}-images-idx3-ubyte"] //= 2
        arrays[f"{split}-images-idx3-ubyte"] += 128 * labels[:, None, None]
    for name, arr in arrays.items():
        (raw / name).write_bytes(idx_bytes(arr))


def write_idx_gz(folder: Path, arrays: dict[str, np.ndarray]) -> None:
    """The four IDX files gzipped under their names + .gz (Debian's layout)."""
    folder.mkdir(parents=True)
    for name, arr in arrays.items():
        with gzip.open(folder / f"{name}.gz", "wb") as fh:
            fh.write(idx_bytes(arr))


def write_tree(root: Path, rng, classes=("airplane", "cat", "truck"), per_class=3,
               fmt: str = "png") -> dict:
    """ImageFolder tree train/<class>/*, test/<class>/*; returns {(split, class): images}."""
    out = {}
    for split in ("train", "test"):
        for name in classes:
            imgs = rng.integers(0, 256, size=(per_class, 3, 32, 32), dtype=np.uint8)
            (root / split / name).mkdir(parents=True)
            for i, img in enumerate(imgs):
                Image.fromarray(img.transpose(1, 2, 0)).save(root / split / name / f"{i:04d}.{fmt}")
            out[split, name] = imgs
    return out


def tiny_image_data(root: Path) -> None:
    """The tiny data of the tests' whole-DAG run and of the GPU check's dry run: Fashion-MNIST
    (IDX files, torchvision's raw layout: 120 training images, 80 of classes 0/1, and 40
    test images) and CIFAR-10 (an ImageFolder PNG tree, all ten classes, 18 per class)."""
    rng = np.random.default_rng(0)
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    arrays = fake_fmnist(rng, n_train=120, n_test=40)
    arrays["train-labels-idx1-ubyte"] = (np.arange(120) % 3).astype(np.uint8)  # 80 of 0/1
    for name, arr in arrays.items():
        (raw / name).write_bytes(idx_bytes(arr))
    write_tree(root, rng, classes=CIFAR10_CLASSES, per_class=18)
