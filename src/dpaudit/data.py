"""Data sets of the DP-SGD audits (Jagielski et al. 2020) and of Abadi et al. 2016's
training curves: Fashion-MNIST, MNIST, CIFAR.

Every loader goes through torchvision's own readers, so a copy torchvision downloads
(``download=True``, needs internet) and a local copy are read by the same code:

- Fashion-MNIST: ``ROOT/FashionMNIST/raw/*-idx?-ubyte`` (torchvision's layout; ``.gz``
  copies there are decompressed), else
  Debian's ``dataset-fashion-mnist`` package (``/usr/share/datasets/fashion-mnist/*.gz``,
  decompressed once into ``ROOT/FashionMNIST/raw/``), else a torchvision download.
- MNIST: ``ROOT/MNIST/raw/*-idx?-ubyte`` (torchvision's layout; ``.gz`` copies there are
  decompressed), else a torchvision download. No package registry ships it whole (Debian
  has none; the PyPI "mnist" loaders download it), so offline, copy the four IDX files
  there.
- CIFAR-10: ``ROOT/cifar-10-batches-py/`` (torchvision's pickle batches, md5-checked by
  torchvision), else an ImageFolder tree ``ROOT/train/<class>/*``, ``ROOT/test/<class>/*``
  (the layout of the JPEG tarball of docs/data.md; :func:`ensure_extracted` unpacks it),
  else a torchvision download.
- CIFAR-100: ``ROOT/cifar-100-python/`` or a torchvision download.

Missing data raises :class:`DataNotFound`, whose message lists the places looked at and
how to obtain the files.

Fashion-MNIST subset of the reference (``datasets/fmnist/make_new.py``, ``make_old.py`` of
jagielski/auditing-dpsgd): the training images of classes 0 and 1 (T-shirt/top,
Trouser; 12,000 images) in file order, then ``np.random.seed(0);
np.random.choice(12000, 6000, replace=False)``, kept in that (random) order, pixels
``/255``.  :func:`load_fmnist` reproduces that subset exactly (same legacy RandomState
stream); the test split is used whole.
"""

from __future__ import annotations

import gzip
import lzma
import os
import shutil
import struct
import tarfile
import tempfile
import zlib
from pathlib import Path
from typing import NamedTuple, Sequence

import numpy as np
import torch

from .io import BadInputFile, DataNotFound, atomic_path, unwritable

def _datasets():
    """``torchvision.datasets``, imported on first use: importing torchvision takes seconds
    (docs/scale.md), which every training job (that reads a task file, not images) would
    pay."""
    import torchvision.datasets

    return torchvision.datasets


FMNIST_DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")
FMNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer",
                   "dog", "frog", "horse", "ship", "truck")
#: Default data root: ``$DPAUDIT_DATA`` or ``~/.cache/dpaudit/data``.
DEFAULT_ROOT = Path(os.environ.get("DPAUDIT_DATA", Path.home() / ".cache" / "dpaudit" / "data"))


class ImageData(NamedTuple):
    """Images ``(n, 3, 32, 32)`` uint8, labels ``(n,)`` int64, and where they came from."""

    images: np.ndarray
    labels: np.ndarray
    source: str


def _root(root: str | os.PathLike | None) -> Path:
    return Path(root).expanduser() if root is not None else DEFAULT_ROOT


def _data_root(root: str | os.PathLike | None, download: bool) -> Path:
    """:func:`_root`; a ``root`` that is not a folder, where nothing is to be downloaded
    into it, is a mistyped ``data.root`` (refused before anything is written there)."""
    path = _root(root)
    if root is not None and not download and not path.is_dir():
        raise DataNotFound(f"data.root = {root}: no such folder, and data.download is false. "
                           "Correct data.root, or create the folder and put the data there "
                           "(docs/data.md, section Offline).")
    why = None if path.is_dir() else unwritable(path)
    if why:  # the data would be decompressed or downloaded into it
        raise DataNotFound(f"data.root = {path}: must be a folder that exists or can be made "
                           f"and written; {why}")
    return path


def subset_indices(n: int, frac: float, seed: int) -> tuple[np.ndarray, np.random.RandomState]:
    """``RandomState(seed).choice(n, int(n * frac), replace=False)`` and the advanced stream.

    Identical to the reference's ``np.random.seed(seed); np.random.choice(...)``.  The
    stream is returned because the reference draws its backdoor points from it next
    (``make_old.py``); pass it to :func:`dpaudit.canaries.backdoor_pool` to reproduce them.
    """
    if not 0 < frac <= 1:
        raise ValueError(f"subset_frac must be in (0, 1], got {frac!r}")
    rng = np.random.RandomState(seed)
    return rng.choice(n, int(n * frac), replace=False), rng


def select_classes(y: np.ndarray, classes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Indices (file order) of the examples whose label is in ``classes``, and the labels
    relabelled to their position in ``classes`` (0..len(classes)-1)."""
    classes = np.asarray(classes)
    if len(np.unique(classes)) != len(classes):
        raise ValueError(f"classes must be distinct, got {classes.tolist()}")
    idx = np.flatnonzero(np.isin(y, classes))
    relabel = np.searchsorted(np.sort(classes), y[idx])
    return idx, np.argsort(classes)[relabel].astype(np.int64)


# ----------------------------------------------------------------------------- FMNIST

def _fmnist_missing(root: Path, debian_dir: Path, download_error: Exception | None) -> DataNotFound:
    raw = root / "FashionMNIST" / "raw"
    msg = (f"Fashion-MNIST not found. Looked in {raw} (data.root = {root}; torchvision layout: "
           f"{', '.join(FMNIST_FILES)}, optionally .gz) and in {debian_dir} (Debian package).")
    if download_error is not None:
        msg += (f" The torchvision download failed (no internet?): {download_error}. Offline: "
                "install the Debian package and set data.download: false.")
    else:
        msg += (" To get it: set data.download: true (needs internet), or install the Debian "
                "package.")
    msg += (" The package: `sudo apt-get install -y dataset-fashion-mnist` (or, without root, "
            "`apt-get download dataset-fashion-mnist && dpkg-deb -x dataset-fashion-mnist_*.deb "
            f"DIR` and copy DIR{FMNIST_DEBIAN_DIR}/*.gz into {raw}). Offline set-up: "
            "docs/data.md, section Offline.")
    return DataNotFound(msg)


#: Bytes per element of the IDX type codes (LeCun et al.'s MNIST database format).
_IDX_ITEMSIZE = {0x08: 1, 0x09: 1, 0x0B: 2, 0x0C: 4, 0x0D: 4, 0x0E: 8}
_REFETCH = ("delete it, then let it be decompressed again (from the Debian package or the "
            "other .gz copy) or downloaded again (data.download: true), or copy in a good one")


def _idx_count(path: Path) -> int:
    """The number of items of an IDX file, after checking that its header accounts for
    every byte of it (torchvision would fail on a truncated file with a bare reshape
    error); else :class:`BadInputFile`."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(4)
        ndim = head[3] if len(head) == 4 else 0
        dims = fh.read(4 * ndim)
    if (len(head) < 4 or head[:2] != b"\0\0" or head[2] not in _IDX_ITEMSIZE or ndim == 0
            or len(dims) < 4 * ndim):
        raise BadInputFile(path, f"not an IDX file (no IDX header): {_REFETCH}")
    shape = struct.unpack(f">{ndim}I", dims)
    want = 4 + 4 * ndim + int(np.prod(shape)) * _IDX_ITEMSIZE[head[2]]
    if size != want:
        raise BadInputFile(path, f"{'truncated' if size < want else 'altered'} IDX file: "
                                 f"{size} bytes where its header, shape {list(shape)}, "
                                 f"needs {want}: {_REFETCH}")
    return shape[0]


#: Size (bytes) and md5 of each uncompressed IDX file of the official releases (LeCun et
#: al.'s MNIST, Zalando's Fashion-MNIST; the Debian package dataset-fashion-mnist
#: decompresses to the same bytes). torchvision checks the md5 of the .gz files it
#: downloads, never of the raw files it reads, so a copy edited in place (a flipped pixel
#: or label) would be read as the real data. A file of the real size must have the real
#: md5; a file of another size is another data set (the tests' small IDX files), checked
#: for whole items and labels in range only.
IDX_SIZES = {"train-images-idx3-ubyte": 47_040_016, "train-labels-idx1-ubyte": 60_008,
             "t10k-images-idx3-ubyte": 7_840_016, "t10k-labels-idx1-ubyte": 10_008}
IDX_MD5 = {
    "FashionMNIST": {"train-images-idx3-ubyte": "f4a8712d7a061bf5bd6d2ca38dc4d50a",
                     "train-labels-idx1-ubyte": "9018921c3c673c538a1fc5bad174d6f9",
                     "t10k-images-idx3-ubyte": "8181f5470baa50b63fa0f6fddb340f0a",
                     "t10k-labels-idx1-ubyte": "15d484375f8d13e6eb1aabb0c3f46965"},
    "MNIST": {"train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
              "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
              "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
              "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637"}}
#: Classes of both data sets: labels 0..9.
IDX_CLASSES = 10


def _md5(path: Path) -> str:
    import hashlib

    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _check_idx(raw: Path, train: bool, dataset: str = "FashionMNIST") -> None:
    """The images and labels of a split of ``dataset`` in ``raw`` are whole IDX files of as
    many items, with labels in 0..9, and a file of the real one's size is the real file
    (:data:`IDX_MD5`); else :class:`BadInputFile`."""
    split = "train" if train else "t10k"
    paths = [raw / f"{split}-{kind}" for kind in ("images-idx3-ubyte", "labels-idx1-ubyte")]
    counts = [_idx_count(p) for p in paths]
    if counts[0] != counts[1]:
        raise BadInputFile(paths[1], f"{counts[1]} labels for the {counts[0]} images of "
                                     f"{paths[0].name}: {_REFETCH}")
    for path in paths:
        want = IDX_MD5[dataset][path.name]
        if path.stat().st_size == IDX_SIZES[path.name] and _md5(path) != want:
            raise BadInputFile(path, f"altered {dataset} file: the size of the official one "
                                     f"but not its md5 {want}: {_REFETCH}")
    labels = np.fromfile(paths[1], np.uint8, offset=8)
    if labels.size and labels.max() >= IDX_CLASSES:
        raise BadInputFile(paths[1], f"label {int(labels.max())} at item "
                                     f"{int(labels.argmax())}: must be in 0..{IDX_CLASSES - 1}: "
                                     f"{_REFETCH}")


def _decompress_idx_gz(gz_dir: Path, raw: Path) -> bool:
    """Decompress the four ``*.gz`` IDX files of ``gz_dir`` into torchvision's raw folder
    (atomically, with the umask's file mode); False if any is missing."""
    srcs = [gz_dir / f"{name}.gz" for name in FMNIST_FILES]
    if not all(s.is_file() for s in srcs):
        return False
    for src, name in zip(srcs, FMNIST_FILES, strict=True):
        try:
            with atomic_path(raw / name) as tmp, open(tmp, "wb") as out, \
                    gzip.open(src, "rb") as inp:
                shutil.copyfileobj(inp, out)
        except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
            raise BadInputFile(src, f"truncated or corrupt gzip file ({exc}): replace it with "
                                    "a good copy (for Debian's, `apt-get install --reinstall "
                                    "dataset-fashion-mnist`), or delete it and let torchvision "
                                    "download the data (data.download: true)") from None
    return True


def fmnist_raw(root: str | os.PathLike | None = None, train: bool = True, download: bool = False,
               debian_dir: str | os.PathLike = FMNIST_DEBIAN_DIR) -> tuple[np.ndarray, np.ndarray]:
    """All Fashion-MNIST images ``(N, 28, 28)`` uint8 and labels ``(N,)`` int64 of a split,
    read by ``torchvision.datasets.FashionMNIST`` (sources in the module docstring)."""
    root, debian_dir = _data_root(root, download), Path(debian_dir)
    raw = root / "FashionMNIST" / "raw"
    have = all((raw / n).is_file() for n in FMNIST_FILES)
    for gz_dir in (raw, debian_dir):  # .gz copies (as downloaded, or Debian's): decompress
        have = have or _decompress_idx_gz(gz_dir, raw)
    return _read_idx("FashionMNIST", root, have, train, download,
                     lambda err: _fmnist_missing(root, debian_dir, err))


def _read_idx(dataset: str, root: Path, have: bool, train: bool, download: bool,
              missing) -> tuple[np.ndarray, np.ndarray]:
    """Images and labels of torchvision's ``dataset`` (``"FashionMNIST"``, ``"MNIST"``)
    from its raw IDX files under ``root``; where they are not there (``have`` false),
    downloaded first when ``download``, else ``missing(download_error)`` is raised."""
    download_error = None
    if not have and download:
        try:
            getattr(_datasets(), dataset)(root, train=train, download=True)
            have = True
        except Exception as err:  # noqa: BLE001 - any network/mirror failure means "not found"
            download_error = err
    if not have:
        raise missing(download_error)
    _check_idx(root / dataset / "raw", train, dataset)
    ds = getattr(_datasets(), dataset)(root, train=train, download=False)
    return ds.data.numpy(), ds.targets.numpy().astype(np.int64)


def load_fmnist(root: str | os.PathLike | None = None, classes: Sequence[int] = (0, 1),
                subset_frac: float | None = None, seed: int = 0, train: bool = True,
                download: bool = False,
                debian_dir: str | os.PathLike = FMNIST_DEBIAN_DIR) -> tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST task of the reference: ``X`` float32 ``(n, 784)`` in [0, 1], ``y`` int64.

    Keeps the images of ``classes`` (file order), relabels them ``0..len(classes)-1``, then
    takes ``RandomState(seed).choice(n, int(n * subset_frac), replace=False)`` in draw order.
    ``subset_frac=None`` means the reference's choice: 0.5 for train (n = 6000 for classes
    0, 1 with seed 0, the exact reference subset) and 1.0 (whole split, no draw) for test.
    """
    images, labels = fmnist_raw(root, train=train, download=download, debian_dir=debian_dir)
    idx, y = select_classes(labels, classes)
    X = images[idx].reshape(len(idx), -1).astype(np.float32) / np.float32(255)
    frac = (0.5 if train else 1.0) if subset_frac is None else subset_frac
    if frac < 1:
        sub, _ = subset_indices(len(idx), frac, seed)
        X, y = X[sub], y[sub]
    return X, y


# ----------------------------------------------------------------------------- CIFAR

def ensure_extracted(tar: str | os.PathLike, dest: str | os.PathLike) -> Path:
    """Unpack an ImageFolder tarball (``train/<class>/*``, ``test/<class>/*``) into ``dest``.

    Does nothing when ``dest/train`` and ``dest/test`` exist.  Extracts into a temporary
    sibling folder and renames the two trees into place, so an interrupted run leaves no
    half tree that would later pass for complete.
    """
    tar, dest = Path(tar), Path(dest)
    if (dest / "train").is_dir() and (dest / "test").is_dir():
        return dest
    if not tar.is_file():
        raise DataNotFound(f"data.cifar10_tarball = {tar}: no such file (an ImageFolder tarball, "
                           "train/<class>/*, test/<class>/*, e.g. cifar10-jpeg.tar.gz; "
                           "docs/data.md, section Offline).")
    why = unwritable(dest)
    if why:
        raise DataNotFound(f"data.root = {dest}: must be a folder that exists or can be made "
                           f"and written, to unpack data.cifar10_tarball into; {why}")
    made = [p for p in (dest, *dest.parents) if not p.exists()]  # to remove on failure
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with tempfile.TemporaryDirectory(prefix=".extract-", dir=dest) as tmp:
            _extract(tar, Path(tmp))
            for split in ("train", "test"):
                if not (dest / split).is_dir():
                    os.replace(Path(tmp) / split, dest / split)
    except BaseException:
        for folder in made:  # the folders made here, if empty again: no trace of a failure
            try:
                folder.rmdir()
            except OSError:
                break
        raise
    return dest


def _extract(tar: Path, tmp: Path) -> None:
    """Unpack the ImageFolder tarball ``tar`` into ``tmp``; BadInputFile naming it unless it
    reads to its end and holds ``train/`` and ``test/``."""
    try:
        with tarfile.open(tar) as tf:
            tf.extractall(tmp, filter="data")
            _read_to_end(tf)
    except (tarfile.TarError, EOFError, gzip.BadGzipFile, zlib.error, lzma.LZMAError) as exc:
        # tarfile lists every compression it tried, one per line
        why = ("no tar format, plain or compressed, fits" if
               str(exc).startswith("file could not be opened successfully") else exc)
        raise BadInputFile(tar, f"not a readable tarball, or truncated or corrupt ({why}): "
                                "fetch data.cifar10_tarball again") from None
    for split in ("train", "test"):
        if not (tmp / split).is_dir():
            raise BadInputFile(tar, f"no top-level '{split}/' folder: data.cifar10_tarball "
                                    "must be an ImageFolder tarball (train/<class>/*, "
                                    "test/<class>/*)")


def _read_to_end(tf: tarfile.TarFile) -> None:
    """Read what follows the archive's last member: only zero padding in a whole tarball.
    tarfile takes a damaged member header for the end of the archive, and a compressed
    stream's checksum is only checked at its end."""
    tf.fileobj.seek(tf.offset)  # where the member headers end
    while chunk := tf.fileobj.read(1 << 20):
        if chunk.count(0) != len(chunk):
            raise tarfile.ReadError("a damaged member header ends the archive early")


def _cifar_missing(name: str, root: Path, download_error: Exception | None,
                   extra: str) -> DataNotFound:
    """What the user of the workflow can do, in its config keys (docs/data.md, Offline)."""
    folder = {"CIFAR-10": "cifar-10-batches-py", "CIFAR-100": "cifar-100-python"}[name]
    msg = (f"{name} not found. Looked for torchvision's {root / folder}/{extra} "
           f"(data.root = {root}{'' if root.is_dir() else ': no such folder'}).")
    tarball = ("data.cifar10_tarball: an ImageFolder tarball (train/<class>/*, test/<class>/*, "
               "e.g. cifar10-jpeg.tar.gz), unpacked into data.root once" if name == "CIFAR-10"
               else f"data.root or data.cifar100_root: a folder holding {folder}/")
    if download_error is not None:
        msg += (f" The torchvision download failed (no internet?): {download_error}. Offline, "
                f"set {tarball}, and data.download: false.")
    else:
        msg += (f" To get it: set data.download: true (torchvision downloads it into data.root; "
                f"needs internet), or {tarball}, or copy an existing {folder}/ into data.root.")
    return DataNotFound(msg + " Offline set-up: docs/data.md, section Offline.")


def _torchvision_cifar(cls, root: Path, train: bool, download: bool):
    """The torchvision data set, or the download error (None when absent, no download)."""
    if download:
        try:
            return cls(root, train=train, download=True), None
        except Exception as err:  # noqa: BLE001 - any network/mirror failure means "not found"
            return None, err
    try:
        return cls(root, train=train, download=False), None
    except RuntimeError:  # torchvision: "Dataset not found or corrupted"
        if (root / cls.base_folder).is_dir():
            raise BadInputFile(root / cls.base_folder, "fails torchvision's md5 check (a file "
                               "missing, truncated or altered): delete the folder, then let "
                               "torchvision download it again (data.download: true) or copy "
                               "in a good one") from None
        return None, None


def _sampled(labels: np.ndarray, classes: Sequence[int] | None, sample: int | None,
             seed: int) -> np.ndarray:
    """Positions of the images of ``classes`` (all if None), or a seeded random ``sample``
    of them in random order."""
    keep = np.arange(len(labels)) if classes is None else np.flatnonzero(np.isin(labels, classes))
    if sample is None:
        return keep
    if not 1 <= sample <= len(keep):
        raise ValueError(f"sample={sample}: must be in [1, {len(keep)}] (the images available)")
    return keep[np.random.default_rng(seed).permutation(len(keep))[:sample]]


def _imagefolder(split_dir: Path, classes: Sequence[int] | None, sample: int | None = None,
                 seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Decode an ImageFolder split whose folder names are CIFAR-10 class names; labels are
    canonical CIFAR-10 indices.  Only images of ``classes`` (all if None), or a seeded
    random ``sample`` of them (:func:`_sampled`), are decoded."""
    folder = _datasets().ImageFolder(split_dir)  # loader: PIL, converted to RGB
    unknown = set(folder.classes) - set(CIFAR10_CLASSES)
    if unknown:
        raise ValueError(f"{split_dir}: folders {sorted(unknown)} are not CIFAR-10 classes")
    to_canonical = np.array([CIFAR10_CLASSES.index(c) for c in folder.classes])
    labels = to_canonical[np.array(folder.targets, dtype=np.int64)]
    keep = _sampled(labels, classes, sample, seed)
    images = np.stack([_image(folder, folder.samples[i][0]) for i in keep]) if len(keep) \
        else np.empty((0, 3, 32, 32), np.uint8)
    return images, labels[keep]


def _image(folder, path: str) -> np.ndarray:
    """One 32x32 RGB image of an ImageFolder tree, ``(3, 32, 32)`` uint8; a file PIL cannot
    decode, or of another size, raises :class:`BadInputFile`."""
    again = ("delete data.root's train/ and test/ folders to unpack data.cifar10_tarball "
             "again, or replace the file")
    try:
        image = np.asarray(folder.loader(path))
    except (OSError, SyntaxError, ValueError) as exc:  # PIL: unidentified or damaged image
        raise BadInputFile(path, f"not a readable image ({exc}): {again}") from None
    if image.shape != (32, 32, 3):
        raise BadInputFile(path, f"a {image.shape} image, not 32x32 RGB (CIFAR-10): {again}")
    return image.transpose(2, 0, 1)


def load_cifar10(root: str | os.PathLike | None = None, train: bool = True,
                 classes: Sequence[int] | None = None, download: bool = False,
                 tarball: str | os.PathLike | None = None, *, sample: int | None = None,
                 sample_seed: int = 0) -> ImageData:
    """CIFAR-10 images ``(n, 3, 32, 32)`` uint8 (scale by 1/255 for [0, 1]) and labels.

    ``classes`` (canonical CIFAR-10 indices, :data:`CIFAR10_CLASSES`) keeps those classes,
    relabelled ``0..len(classes)-1`` in the given order; ``None`` keeps all ten unchanged.
    ``source`` is ``"torchvision"`` for the pickle batches and ``"imagefolder:<dir>"`` for
    the JPEG tree (a lossy re-encoding: results made from it must say so). ``sample``:
    only a seeded random sample of that many images (of ``classes``), in random order
    (``numpy.random.default_rng(sample_seed)``); from the JPEG tree only those are decoded.
    """
    root = _root(root)
    ds, download_error = _torchvision_cifar(_datasets().CIFAR10, root, train, download)
    if ds is not None:
        images = np.ascontiguousarray(ds.data.transpose(0, 3, 1, 2))
        labels, source = np.asarray(ds.targets, dtype=np.int64), "torchvision"
        if sample is not None:
            keep = _sampled(labels, classes, sample, sample_seed)
            images, labels = images[keep], labels[keep]
    else:
        if tarball is not None:
            ensure_extracted(tarball, root)
        split_dir = root / ("train" if train else "test")
        if not split_dir.is_dir():
            raise _cifar_missing("CIFAR-10", root, download_error,
                                 f" and an ImageFolder tree {split_dir}/<class>/*")
        (images, labels), source = (_imagefolder(split_dir, classes, sample, sample_seed),
                                    f"imagefolder:{split_dir}")
    if classes is not None:
        idx, labels = select_classes(labels, classes)
        images = images[idx]
    return ImageData(images, labels, source)


def load_cifar100(root: str | os.PathLike | None = None, train: bool = True,
                  download: bool = False) -> ImageData:
    """CIFAR-100 images ``(n, 3, 32, 32)`` uint8 and fine labels (0..99) via torchvision."""
    root = _root(root)
    ds, download_error = _torchvision_cifar(_datasets().CIFAR100, root, train, download)
    if ds is None:
        raise _cifar_missing("CIFAR-100", root, download_error, "")
    images = np.ascontiguousarray(ds.data.transpose(0, 3, 1, 2))
    return ImageData(images, np.asarray(ds.targets, dtype=np.int64), "torchvision")


def to_float(images: np.ndarray | torch.Tensor) -> torch.Tensor:
    """uint8 images -> float32 tensor in [0, 1] (the reference divides pixels by 255)."""
    return torch.as_tensor(images).to(torch.float32).div_(255)


# ----------------------------------------------------------------------------- preparation

def mnist_raw(root: str | os.PathLike | None = None, train: bool = True,
              download: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """All MNIST images ``(N, 28, 28)`` uint8 and labels ``(N,)`` int64 of a split, read by
    ``torchvision.datasets.MNIST`` from ``ROOT/MNIST/raw/`` (the IDX files, or their
    ``.gz`` copies, decompressed once), else downloaded by torchvision when ``download``."""
    root = _data_root(root, download)
    raw = root / "MNIST" / "raw"
    have = all((raw / n).is_file() for n in FMNIST_FILES) or _decompress_idx_gz(raw, raw)
    return _read_idx("MNIST", root, have, train, download, lambda err: _mnist_missing(root, err))


def _mnist_missing(root: Path, download_error: Exception | None) -> DataNotFound:
    """What the user of the workflow can do, in its config keys (docs/data.md, Offline)."""
    raw = root / "MNIST" / "raw"
    msg = (f"MNIST not found. Looked in {raw} (data.root = {root}; torchvision layout: "
           f"{', '.join(FMNIST_FILES)}, optionally .gz).")
    copy = (f"copy the four IDX files of the MNIST database (LeCun, Cortes & Burges) into "
            f"{raw}")
    if download_error is not None:
        msg += (f" The torchvision download failed (no internet?): {download_error}. Offline: "
                f"{copy}, and set data.download: false.")
    else:
        msg += (" To get it: set data.download: true (torchvision downloads it into "
                f"data.root; needs internet), or {copy}.")
    return DataNotFound(msg + " Offline without them, run Abadi et al.'s Figure 3 on "
                        "Fashion-MNIST instead: abadi.fig3.dataset: fmnist. Offline set-up: "
                        "docs/data.md, section Offline.")


#: The 28x28 grey-level data sets with ten classes (Abadi et al.'s MNIST task, and
#: Fashion-MNIST in its place where MNIST is not available).
DIGIT_LIKE = ("mnist", "fmnist")


def load_ten_class(dataset: str, root=None, train: bool = True,
                   download: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """A whole split of MNIST or Fashion-MNIST (``dataset`` in :data:`DIGIT_LIKE`), all ten
    classes in file order: ``X`` float32 ``(N, 784)`` in [0, 1] (pixels / 255), ``y``
    int64."""
    if dataset not in DIGIT_LIKE:
        raise ValueError(f"dataset={dataset!r}: must be one of {DIGIT_LIKE}")
    images, labels = (mnist_raw(root, train, download) if dataset == "mnist"
                      else fmnist_raw(root, train, download))
    return images.reshape(len(images), -1).astype(np.float32) / np.float32(255), labels


def prepare_mnist(root=None, download: bool = False) -> list[dict]:
    """Make MNIST readable at ``root`` (decompress, or download once) and read both splits;
    one row per split."""
    rows = []
    for split, train in (("train", True), ("test", False)):
        images, _ = mnist_raw(root, train=train, download=download)
        rows.append({"data_set": "mnist", "split": split, "n": len(images),
                     "source": str(_root(root) / "MNIST" / "raw")})
    return rows


def prepare_fmnist(root=None, download: bool = False,
                   debian_dir: str | os.PathLike = FMNIST_DEBIAN_DIR) -> list[dict]:
    """Make Fashion-MNIST readable at ``root`` (decompress, or download once) and read both
    splits, so a corrupt or truncated copy fails here; one row per split."""
    rows = []
    for split, train in (("train", True), ("test", False)):
        images, _ = fmnist_raw(root, train=train, download=download, debian_dir=debian_dir)
        rows.append({"data_set": "fmnist", "split": split, "n": len(images),
                     "source": str(_root(root) / "FashionMNIST" / "raw")})
    return rows


def _count_imagefolder(split_dir: Path) -> int:
    """Images of an ImageFolder split, listed (not decoded); its folders must be CIFAR-10
    class names."""
    folder = _datasets().ImageFolder(split_dir, loader=lambda p: p)
    unknown = set(folder.classes) - set(CIFAR10_CLASSES)
    if unknown:
        raise ValueError(f"{split_dir}: folders {sorted(unknown)} are not CIFAR-10 classes")
    return len(folder.samples)


def prepare_cifar(root=None, download: bool = False, tarball=None, cifar100_root=None) -> list[dict]:
    """Make CIFAR-10 readable at ``root`` (torchvision's batches, downloaded once if need be
    and md5-checked by torchvision, else the ImageFolder tree, unpacked from ``tarball``
    once) and find CIFAR-100 for pretraining (optional: without it the extractor is
    pretrained on CIFAR-10's other classes, :func:`dpaudit.features.pretraining_data`).
    One row per split found."""
    root = _root(root)
    rows = []
    for split, train in (("train", True), ("test", False)):
        ds, error = _torchvision_cifar(_datasets().CIFAR10, root, train, download)
        if ds is not None:
            rows.append({"data_set": "cifar10", "split": split, "n": len(ds.targets),
                         "source": "torchvision:" + str(root / "cifar-10-batches-py")})
            continue
        if tarball is not None:
            ensure_extracted(tarball, root)
        split_dir = root / split
        if not split_dir.is_dir():
            raise _cifar_missing("CIFAR-10", root, error,
                                 f" and an ImageFolder tree {split_dir}/<class>/*")
        rows.append({"data_set": "cifar10", "split": split,
                     "n": _count_imagefolder(split_dir), "source": f"imagefolder:{split_dir}"})
    root100 = _root(cifar100_root) if cifar100_root is not None else root
    ds, _ = _torchvision_cifar(_datasets().CIFAR100, root100, True, download)
    if ds is not None:
        rows.append({"data_set": "cifar100", "split": "train", "n": len(ds.targets),
                     "source": "torchvision:" + str(root100 / "cifar-100-python")})
    return rows
