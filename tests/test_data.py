"""Data loading: tiny files in the real formats (IDX gz, CIFAR pickles, ImageFolder), real FMNIST."""

import hashlib
import pickle
import tarfile
from types import SimpleNamespace

import numpy as np
import pytest
import torchvision

from dpaudit import data
from fakedata import fake_fmnist as _fake_fmnist
from fakedata import idx_bytes as _idx_bytes
from fakedata import write_idx_gz as _write_debian
from fakedata import write_tree as _write_tree

FMNIST_MD5 = {  # decompressed Debian/Zalando files (shared/data/README.md)
    "train-images-idx3-ubyte": "f4a8712d7a061bf5bd6d2ca38dc4d50a",
    "train-labels-idx1-ubyte": "9018921c3c673c538a1fc5bad174d6f9",
    "t10k-images-idx3-ubyte": "8181f5470baa50b63fa0f6fddb340f0a",
    "t10k-labels-idx1-ubyte": "15d484375f8d13e6eb1aabb0c3f46965",
}


def _reference_subset(images, labels):
    """make_new.py verbatim (minus the download): classes < 2, np.random.seed(0), half."""
    inds = np.where(labels < 2)[0]
    x, y = images[inds] / 255., labels[inds]
    np.random.seed(0)
    ss = np.random.choice(x.shape[0], x.shape[0] // 2, replace=False)
    return x[ss].reshape(-1, 784), y[ss]


def test_fmnist_from_debian_gz_matches_reference_subset(tmp_path):
    arrays = _fake_fmnist(np.random.default_rng(0))
    _write_debian(tmp_path / "deb", arrays)
    (tmp_path / "root").mkdir()  # data.root must exist (a mistyped one is refused)
    X, y = data.load_fmnist(tmp_path / "root", debian_dir=tmp_path / "deb")
    ref_x, ref_y = _reference_subset(arrays["train-images-idx3-ubyte"],
                                     arrays["train-labels-idx1-ubyte"])
    assert X.dtype == np.float32 and y.dtype == np.int64 and X.shape == ref_x.shape
    np.testing.assert_allclose(X, ref_x, rtol=1e-6)
    np.testing.assert_array_equal(y, ref_y)
    # decompressed into torchvision's raw folder; later calls need no Debian copy
    raw = tmp_path / "root" / "FashionMNIST" / "raw"
    assert (raw / "train-images-idx3-ubyte").read_bytes() == _idx_bytes(arrays["train-images-idx3-ubyte"])
    X2, _ = data.load_fmnist(tmp_path / "root", debian_dir=tmp_path / "nowhere")
    np.testing.assert_array_equal(X, X2)
    # the .gz files copied straight into the raw folder are read too
    _write_debian(tmp_path / "r2" / "FashionMNIST" / "raw", arrays)
    X3, _ = data.load_fmnist(tmp_path / "r2", debian_dir=tmp_path / "nowhere")
    np.testing.assert_array_equal(X, X3)


def test_fmnist_torchvision_root_relabel_and_test_split(tmp_path):
    arrays = _fake_fmnist(np.random.default_rng(1))
    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for name, arr in arrays.items():
        (raw / name).write_bytes(_idx_bytes(arr))
    imgs, labs = arrays["t10k-images-idx3-ubyte"], arrays["t10k-labels-idx1-ubyte"]
    X, y = data.load_fmnist(tmp_path, classes=(7, 2), train=False, debian_dir=tmp_path / "none")
    keep = np.flatnonzero((labs == 7) | (labs == 2))  # whole test split, file order
    np.testing.assert_array_equal(X * 255, imgs[keep].reshape(len(keep), -1))
    np.testing.assert_array_equal(y, np.where(labs[keep] == 7, 0, 1))


def test_fmnist_missing_says_where_and_how(tmp_path):
    (tmp_path / "root").mkdir()
    with pytest.raises(data.DataNotFound) as err:
        data.load_fmnist(tmp_path / "root", debian_dir=tmp_path / "deb")
    msg = str(err.value)
    assert "apt-get install -y dataset-fashion-mnist" in msg
    assert str(tmp_path / "root" / "FashionMNIST" / "raw") in msg
    assert "set data.download: true" in msg and "docs/data.md, section Offline" in msg


def _write_cifar_pickles(folder, rng, per_batch=6):
    """cifar-10-batches-py: 5 train batches + test batch (dicts with data, labels) + meta."""
    folder.mkdir(parents=True)
    raw = {}
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:
        d = {"data": rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8),
             "labels": rng.integers(0, 10, size=per_batch).tolist()}
        raw[name] = d
        (folder / name).write_bytes(pickle.dumps(d))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": list(data.CIFAR10_CLASSES)}))
    return raw


def _md5(path):
    return hashlib.md5(path.read_bytes()).hexdigest()


def test_cifar10_from_pickle_batches(tmp_path, monkeypatch):
    folder = tmp_path / "cifar-10-batches-py"
    raw = _write_cifar_pickles(folder, np.random.default_rng(2))
    C = torchvision.datasets.CIFAR10  # torchvision checks md5s: register those of the tiny files
    monkeypatch.setattr(C, "train_list", [[f"data_batch_{i}", _md5(folder / f"data_batch_{i}")]
                                          for i in range(1, 6)])
    monkeypatch.setattr(C, "test_list", [["test_batch", _md5(folder / "test_batch")]])
    monkeypatch.setattr(C, "meta", {**C.meta, "md5": _md5(folder / "batches.meta")})
    d = data.load_cifar10(tmp_path, train=True)
    flat = np.concatenate([raw[f"data_batch_{i}"]["data"] for i in range(1, 6)])
    labels = np.concatenate([raw[f"data_batch_{i}"]["labels"] for i in range(1, 6)])
    assert d.source == "torchvision" and d.images.dtype == np.uint8
    np.testing.assert_array_equal(d.images, flat.reshape(-1, 3, 32, 32))  # rows are R, G, B planes
    np.testing.assert_array_equal(d.labels, labels)
    t = data.load_cifar10(tmp_path, train=False, classes=(3, 5))
    keep = np.isin(raw["test_batch"]["labels"], (3, 5))
    np.testing.assert_array_equal(t.images, raw["test_batch"]["data"][keep].reshape(-1, 3, 32, 32))
    np.testing.assert_array_equal(t.labels, np.where(np.array(raw["test_batch"]["labels"])[keep] == 3, 0, 1))


def test_cifar10_imagefolder_tree_and_tarball(tmp_path):
    tree = _write_tree(tmp_path / "src", np.random.default_rng(3))
    tar = tmp_path / "tiny.tar.gz"
    with tarfile.open(tar, "w:gz") as tf:
        for split in ("train", "test"):
            tf.add(tmp_path / "src" / split, arcname=split)
    root = tmp_path / "root"
    d = data.load_cifar10(root, train=True, tarball=tar)
    assert d.source == f"imagefolder:{root / 'train'}"
    # folders map to canonical CIFAR-10 indices: airplane 0, cat 3, truck 9
    np.testing.assert_array_equal(d.labels, [0] * 3 + [3] * 3 + [9] * 3)
    expected = np.concatenate([tree["train", c] for c in ("airplane", "cat", "truck")])
    np.testing.assert_array_equal(d.images, expected)
    t = data.load_cifar10(root, train=False, classes=(9, 0))
    np.testing.assert_array_equal(t.labels, [1] * 3 + [0] * 3)
    np.testing.assert_array_equal(t.images[3:], tree["test", "truck"])
    # already extracted: the tarball is not needed any more
    assert data.ensure_extracted(tmp_path / "gone.tar.gz", root) == root


def test_cifar_missing_says_how_in_config_keys(tmp_path, monkeypatch):
    """The message names the config keys that fix it and the docs' offline section; with
    download on and no internet it does not say to turn download on."""
    with pytest.raises(data.DataNotFound) as err:
        data.prepare_cifar(tmp_path)
    msg = str(err.value)
    for words in ("set data.download: true", "data.cifar10_tarball", "cifar10-jpeg.tar.gz",
                  f"data.root = {tmp_path}", "docs/data.md, section Offline"):
        assert words in msg, words
    with pytest.raises(data.DataNotFound, match="cifar-100-python"):
        data.load_cifar100(tmp_path)

    class Offline:  # torchvision's CIFAR10 on a machine without internet
        base_folder = "cifar-10-batches-py"

        def __init__(self, root, train, download):
            raise (OSError("<urlopen error [Errno -3] name resolution>") if download
                   else RuntimeError("Dataset not found or corrupted"))

    monkeypatch.setattr(data, "_datasets", lambda: SimpleNamespace(CIFAR10=Offline))
    with pytest.raises(data.DataNotFound) as err:
        data.prepare_cifar(tmp_path, download=True)
    msg = str(err.value)
    assert "download failed (no internet?): <urlopen error" in msg
    assert "set data.download: true" not in msg
    for words in ("data.cifar10_tarball", "data.download: false", "docs/data.md"):
        assert words in msg, words
    with pytest.raises(data.DataNotFound, match=r"data.cifar10_tarball = \S*none.tar.gz: no"):
        data.prepare_cifar(tmp_path, tarball=tmp_path / "none.tar.gz")


def test_select_classes_relabels_in_given_order():
    idx, y = data.select_classes(np.array([3, 1, 4, 1, 5, 9, 2, 6]), (9, 1))
    np.testing.assert_array_equal(idx, [1, 3, 5]), np.testing.assert_array_equal(y, [1, 1, 0])
    with pytest.raises(ValueError):
        data.select_classes(np.arange(5), (0, 0))


def test_subset_indices_is_the_legacy_global_stream():
    idx, rng = data.subset_indices(100, 0.5, seed=7)
    np.random.seed(7)
    np.testing.assert_array_equal(idx, np.random.choice(100, 50, replace=False))
    assert rng.randint(1 << 30) == np.random.randint(1 << 30)  # the stream continues alike


@pytest.mark.skipif(not all((data.FMNIST_DEBIAN_DIR / f"{n}.gz").is_file() for n in data.FMNIST_FILES),
                    reason="Debian dataset-fashion-mnist not installed")
def test_the_md5s_checked_are_the_published_ones():
    """The md5s the reader checks the raw Fashion-MNIST files against are those listed
    here (shared/data/README.md), and the sizes those of the official files (16- and
    8-byte headers, 28 x 28 images)."""
    assert data.IDX_MD5["FashionMNIST"] == FMNIST_MD5
    for split, n in (("train", 60_000), ("t10k", 10_000)):
        assert data.IDX_SIZES[f"{split}-images-idx3-ubyte"] == 16 + n * 28 * 28
        assert data.IDX_SIZES[f"{split}-labels-idx1-ubyte"] == 8 + n


def test_real_fmnist_from_debian(tmp_path):
    X, y = data.load_fmnist(tmp_path)
    raw = tmp_path / "FashionMNIST" / "raw"
    assert {n: _md5(raw / n) for n in FMNIST_MD5} == FMNIST_MD5
    assert X.shape == (6000, 784) and X.dtype == np.float32
    assert X.min() == 0.0 and X.max() == 1.0
    counts = np.bincount(y)
    # random half of 6000 + 6000: hypergeometric sd ~27, so each class within 3000 +- 150
    assert len(counts) == 2 and abs(counts[0] - 3000) < 150
    Xt, yt = data.load_fmnist(tmp_path, train=False)
    assert Xt.shape == (2000, 784) and np.bincount(yt).tolist() == [1000, 1000]
