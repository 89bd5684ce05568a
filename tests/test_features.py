"""CIFAR feature extractor (reference audit.py build_model_cifar): shapes, training, caching."""

import numpy as np
import torch

from dpaudit import data
from dpaudit import features as F


def _images(n, seed):
    """Random uint8 images whose class (0/1/2) is the brightness band of the red channel."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 3, n)
    imgs = rng.integers(0, 80, size=(n, 3, 32, 32)).astype(np.uint8)
    imgs[:, 0] += (80 * labels)[:, None, None].astype(np.uint8)
    return imgs, labels


def test_architecture_matches_keras_parameter_count():
    model = F.CifarCNN(100)
    # Keras summary of the reference model: conv (3*3*in+1)*out, dense (in+1)*out
    convs = [(3, 32), (32, 32), (32, 64), (64, 64), (64, 128), (128, 128)]
    n_features = sum((9 * i + 1) * o for i, o in convs) + (4 * 4 * 128 + 1) * 1024
    assert sum(p.numel() for p in model.features.parameters()) == n_features == 2_385_184
    assert sum(p.numel() for p in model.head.parameters()) == 1025 * 100
    x = torch.rand(2, 3, 32, 32)
    assert model.features(x).shape == (2, 1024) and model(x).shape == (2, 100)
    assert (model.features(x) >= 0).all()  # ReLU output, as the reference's 'dense' layer
    assert all((m.bias == 0).all() for m in model.modules() if hasattr(m, "bias") and m.bias is not None)


def test_pretrain_deterministic_and_learns():
    imgs, labels = _images(96, seed=0)
    m1, hist = F.pretrain(imgs, labels, epochs=3, seed=3, device="cpu", batch_size=16)
    m2, hist2 = F.pretrain(imgs, labels, epochs=3, seed=3, device="cpu", batch_size=16)
    m3, _ = F.pretrain(imgs, labels, epochs=1, seed=4, device="cpu", batch_size=32)
    assert hist == hist2 and len(hist) == 3
    for (k, a), b in zip(m1.state_dict().items(), m2.state_dict().values(), strict=True):
        assert torch.equal(a, b), k
    assert not torch.equal(m1.head.weight, m3.head.weight)
    assert m1.head.out_features == 3 and not m1.training
    # chance-level cross-entropy is log 3 = 1.10; a few epochs on this easy task go well below
    assert hist[0] > 0.9 * np.log(3) and hist[-1] < 0.5 * hist[0]


def test_pretrain_and_features_run_deterministic_on_cuda_without_a_sync_per_step(monkeypatch):
    """On CUDA, pretraining and feature extraction run with torch's deterministic
    algorithms, cuDNN's deterministic mode and the cuBLAS workspace torch asks for (the
    task's features decide which cells are restored), restored afterwards; the loss is
    read back once per epoch, not per step. No GPU here: the CUDA scope is forced around
    a CPU run and the flags are read inside the model's forward."""
    import os

    from dpaudit import device

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    scopes, seen = [], []

    def cuda_scope(dev):
        scopes.append(torch.device(dev))
        return device.deterministic(torch.device("cuda"))

    def record(module, inputs):
        seen.append((torch.are_deterministic_algorithms_enabled(),
                     torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
                     os.environ.get("CUBLAS_WORKSPACE_CONFIG")))

    reads = []  # (reads a loss of the autograd graph, dtype); Adam reads its step counts
    item = torch.Tensor.item
    monkeypatch.setattr(torch.Tensor, "item",
                        lambda t: reads.append((t.grad_fn is not None, t.dtype)) or item(t))
    monkeypatch.setattr(F, "deterministic", cuda_scope)
    monkeypatch.setattr(F.CifarCNN, "__call__",
                        lambda self, x: (record(self, x), torch.nn.Module.__call__(self, x))[1])
    imgs, labels = _images(40, seed=2)
    model, hist = F.pretrain(imgs, labels, epochs=2, seed=0, device="cpu", batch_size=8)
    assert len(seen) == 10 and set(seen) == {(True, True, False, ":4096:8")}
    # the epoch's summed loss (float64) read once per epoch, no step's loss (5 steps each)
    assert not any(graph for graph, _ in reads)
    assert [dtype for _, dtype in reads].count(torch.float64) == len(hist) == 2
    monkeypatch.setattr(F.nn.Sequential, "__call__",
                        lambda self, x: (record(self, x), torch.nn.Module.__call__(self, x))[1])
    F.extract_features(model, imgs, batch_size=20, device="cpu")
    assert scopes == [torch.device("cpu")] * 2 and len(seen) == 12
    assert set(seen) == {(True, True, False, ":4096:8")}
    assert not torch.are_deterministic_algorithms_enabled()
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ


def test_extract_features_batches_and_cache_roundtrip(tmp_path):
    imgs, labels = _images(23, seed=1)
    torch.manual_seed(0)
    model = F.CifarCNN(3)
    feats = F.extract_features(model, imgs, batch_size=5, device="cpu")
    with torch.no_grad():
        direct = model.features(torch.tensor(imgs, dtype=torch.float32) / 255).numpy()
    assert feats.shape == (23, 1024) and feats.dtype == np.float32
    np.testing.assert_allclose(feats, direct, rtol=1e-5, atol=1e-6)
    prov = {"source": "test", "seed": 0}
    F.save_features(tmp_path / "f.npz", {"train_x": feats, "train_y": labels}, prov)
    arrays, meta = F.load_features(tmp_path / "f.npz")
    assert meta == prov and set(arrays) == {"train_x", "train_y"}
    np.testing.assert_array_equal(arrays["train_x"], feats)
    F.save_extractor(tmp_path / "cnn.pt", model, prov)
    model2, meta2 = F.load_extractor(tmp_path / "cnn.pt")
    assert meta2 == prov
    np.testing.assert_allclose(F.extract_features(model2, imgs, batch_size=5, device="cpu"), feats,
                               rtol=0, atol=0)  # same weights, same batches: bitwise equal


def test_pretraining_data_prefers_cifar100_else_other_cifar10_classes(monkeypatch):
    imgs = np.zeros((10, 3, 32, 32), np.uint8)
    calls = {}

    def cifar10(root, train, classes, download, tarball):
        calls["classes"] = classes
        return data.ImageData(imgs[:len(classes)], np.arange(len(classes)), "imagefolder:x")

    def missing(root, download):
        raise data.DataNotFound("no CIFAR-100")

    monkeypatch.setattr(F, "load_cifar10", cifar10)
    monkeypatch.setattr(F, "load_cifar100", missing)
    d = F.pretraining_data("root", audit_classes=(0, 1))
    assert calls["classes"] == [2, 3, 4, 5, 6, 7, 8, 9]
    assert d.source == "cifar10-other-classes[2, 3, 4, 5, 6, 7, 8, 9]:imagefolder:x"

    monkeypatch.setattr(F, "load_cifar100",
                        lambda root, download: data.ImageData(imgs, np.arange(10), "torchvision"))
    assert F.pretraining_data("root").source == "cifar100:torchvision"

