"""Frozen CNN features for the CIFAR-10 audits (Jagielski et al. 2020, section 4).

The reference (``code/audit.py: build_model_cifar`` of jagielski/auditing-dpsgd) trains
DP-SGD only on a new head over a frozen Keras CNN pretrained on CIFAR-100:

    Conv2D(32,3,same,relu) Conv2D(32,3,same,relu) MaxPool2D(2)
    Conv2D(64,3,same,relu) Conv2D(64,3,same,relu) MaxPool2D(2)
    Conv2D(128,3,same,relu) Conv2D(128,3,same,relu) MaxPool2D(2)
    Flatten Dense(1024, relu) | Dense(100)

and feeds the ReLU output of ``Dense(1024)`` to the head.  :class:`CifarCNN` is that
network in torch (Keras default init: Glorot-uniform kernels, zero biases).  Its
pretraining script and weights are not public, so :func:`pretrain` uses Adam, lr 1e-3,
batch 128, cross-entropy, no augmentation; the audit task uses CIFAR-10 classes
:data:`AUDIT_CLASSES`, and with no CIFAR-100 copy :func:`pretraining_data` falls back to
the other eight CIFAR-10 classes (disjoint from the audited task).  Features are computed
once (:func:`extract_features`) and cached with their provenance
(:func:`save_features`).
"""

from __future__ import annotations

import json
import os
import zipfile
import zlib
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from .device import deterministic, resolve
from .data import DataNotFound, ImageData, load_cifar10, load_cifar100, to_float
from .io import (BadInputFile, atomic_path, checked_content, forcerun, input_file,
                 read_torch, save_torch, with_content_digest)

#: CIFAR-10 classes of the audited 2-class task: airplane (0) vs automobile (1).  The
#: reference's CIFAR data script is not public; this mirrors its FMNIST choice
#: (``trn_y < 2``, the first two classes).
AUDIT_CLASSES = (0, 1)
FEATURE_DIM = 1024


class CifarCNN(nn.Module):
    """The reference's CIFAR CNN: ``features`` (to the 1024-d ReLU layer) and ``head``."""

    def __init__(self, n_classes: int):
        super().__init__()
        layers: list[nn.Module] = []
        in_ch = 3
        for ch in (32, 64, 128):
            layers += [nn.Conv2d(in_ch, ch, 3, padding=1), nn.ReLU(),
                       nn.Conv2d(ch, ch, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
            in_ch = ch
        layers += [nn.Flatten(), nn.Linear(128 * 4 * 4, FEATURE_DIM), nn.ReLU()]
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(FEATURE_DIM, n_classes)
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def pretrain(images: np.ndarray, labels: np.ndarray, epochs: int, seed: int,
             device: str | torch.device | None = None, batch_size: int = 128,
             lr: float = 1e-3) -> tuple[CifarCNN, list[float]]:
    """Train :class:`CifarCNN` on uint8 images ``(n, 3, 32, 32)`` (scaled to [0, 1]) with
    cross-entropy and Adam; returns the model (eval mode) and the mean training loss of
    each epoch.  Initialisation and batch order depend only on ``seed``; the result is
    bitwise reproducible on the CPU and, run in :func:`~dpaudit.device.deterministic`, on
    a GPU of the same model and software (the task's features, hence its SHA-256, which
    decides whether finished cells are restored, must not change between reruns)."""
    dev = resolve(device)
    with deterministic(dev):
        # The images stay on the device (uint8: 150 MB for CIFAR-100's 50,000) and the
        # loss is summed there: no host transfer or sync per step.
        images_t = torch.as_tensor(np.asarray(images)).to(dev)
        labels_t = torch.as_tensor(np.asarray(labels), dtype=torch.long)
        n_classes = int(labels_t.max()) + 1
        # One-hot targets: cross-entropy on class indices is NLLLoss, which has no
        # deterministic CUDA kernel; on probabilities it is log-softmax, product and sum.
        targets = torch.eye(n_classes, device=dev)[labels_t.to(dev)]
        gen = torch.Generator().manual_seed(seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = CifarCNN(n_classes)
        model.to(dev).train()
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        history = []
        for _ in range(epochs):
            order = torch.randperm(len(labels_t), generator=gen).to(dev)
            total = torch.zeros((), dtype=torch.float64, device=dev)
            for start in range(0, len(order), batch_size):
                idx = order[start:start + batch_size]
                loss = nn.functional.cross_entropy(model(to_float(images_t[idx])), targets[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                total += loss.detach() * len(idx)
            history.append(total.item() / len(order))
    return model.eval(), history


@torch.inference_mode()
def extract_features(model: CifarCNN, images: np.ndarray, batch_size: int = 1000,
                     device: str | torch.device | None = None) -> np.ndarray:
    """1024-d ReLU features ``(n, 1024)`` float32 of uint8 images, in batches (on a GPU
    in :func:`~dpaudit.device.deterministic`: the features are the task)."""
    dev = resolve(device)
    model = model.to(dev).eval()
    out = np.empty((len(images), FEATURE_DIM), dtype=np.float32)
    with deterministic(dev):
        for start in range(0, len(images), batch_size):
            xb = to_float(images[start:start + batch_size]).to(dev)
            out[start:start + len(xb)] = model.features(xb).cpu().numpy()
    return out


def pretraining_data(root: str | os.PathLike | None = None,
                     audit_classes: Sequence[int] = AUDIT_CLASSES,
                     cifar100_root: str | os.PathLike | None = None, download: bool = False,
                     tarball: str | os.PathLike | None = None) -> ImageData:
    """Training images for the feature extractor: CIFAR-100 (train split, as the
    reference) when available, else the CIFAR-10 training images of the classes *not*
    in ``audit_classes`` (relabelled 0..). ``source`` says which: ``"cifar100:..."`` or
    ``"cifar10-other-classes[2, 3, ...]:..."``."""
    try:
        d = load_cifar100(cifar100_root if cifar100_root is not None else root,
                          download=download)
        return ImageData(d.images, d.labels, f"cifar100:{d.source}")
    except DataNotFound:
        others = [c for c in range(10) if c not in set(audit_classes)]
        d = load_cifar10(root, train=True, classes=others, download=download, tarball=tarball)
        return ImageData(d.images, d.labels, f"cifar10-other-classes{others}:{d.source}")


def save_extractor(path: str | os.PathLike, model: CifarCNN, provenance: dict[str, Any]) -> None:
    """Save the pretrained weights and their provenance (atomic ``torch.save``)."""
    state = {k: v.cpu() for k, v in model.state_dict().items()}
    save_torch(path, {"state_dict": state, "n_classes": model.head.out_features,
                      "provenance": provenance})


def load_extractor(path: str | os.PathLike) -> tuple[CifarCNN, dict[str, Any]]:
    """Inverse of :func:`save_extractor`: ``(model in eval mode, provenance)``; any other
    file raises :class:`dpaudit.io.BadInputFile`."""
    kind = "a feature extractor saved by dpaudit (.pt)"
    blob = read_torch(path, kind)
    try:
        model = CifarCNN(blob["n_classes"])
        model.load_state_dict(blob["state_dict"])
        return model.eval(), blob["provenance"]
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise BadInputFile(path, f"not {kind} ({type(exc).__name__}: {exc})") from None


def save_features(path: str | os.PathLike, arrays: dict[str, np.ndarray],
                  provenance: dict[str, Any]) -> None:
    """Cache feature arrays (e.g. ``train_x, train_y, test_x, test_y``) in an ``.npz``
    with the provenance as JSON and the content hash of both (atomic)."""
    content = with_content_digest({**{k: np.asarray(v) for k, v in arrays.items()},
                                   "provenance": np.array(json.dumps(provenance, default=str))})
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, **content)


def load_features(path: str | os.PathLike,
                  keys: Sequence[str] = ()) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Inverse of :func:`save_features`: ``(arrays, provenance)``. A file that is not such
    an ``.npz``, is truncated, lacks any of the arrays ``keys``, or was altered since it
    was written (its content hash, :func:`dpaudit.io.checked_content`) raises
    :class:`dpaudit.io.BadInputFile`."""
    kind = "an .npz of arrays saved by dpaudit"
    path = input_file(path, kind)
    try:
        f = np.load(path)
    except ValueError:  # numpy's "pickled data" refusal: neither .npz nor .npy
        raise BadInputFile(path, f"not {kind} (not a zip archive of arrays)") from None
    except (OSError, EOFError, zipfile.BadZipFile) as exc:
        raise BadInputFile(path, f"not {kind}, or truncated ({exc})") from None
    if not isinstance(f, np.lib.npyio.NpzFile):
        raise BadInputFile(path, f"not {kind} (a single .npy array)")
    with f:
        if "provenance" not in f.files:
            raise BadInputFile(path, f"not {kind} (no provenance)")
        missing = [k for k in keys if k not in f.files]
        if missing:
            raise BadInputFile(path, f"lacks the arrays {missing} (holds {sorted(f.files)}): "
                                     "not the file this step reads")
        try:
            content = {k: f[k] for k in f.files}
        except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
            raise BadInputFile(path, f"truncated or altered ({exc})", forcerun(path)) from None
    arrays = checked_content(path, content)
    return arrays, json.loads(str(arrays.pop("provenance")))
