"""ClipBKD, pixel backdoor and membership canaries (Jagielski et al. 2020, Algorithms 3-4;
make_new/make_old.py)."""

import numpy as np
import pytest
import torch

from dpaudit import canaries as cn
from dpaudit import data


def _anisotropic(rng, n=400, d=6, small_axis=3):
    """Gaussian rows with one direction of tiny variance (a rotated coordinate axis)."""
    scales = np.linspace(1.0, 3.0, d)
    scales[small_axis] = 1e-2
    Q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    return (rng.normal(size=(n, d)) * scales) @ Q.T, Q[:, small_axis]


def test_least_variance_direction_matches_covariance_eigenvector():
    rng = np.random.default_rng(0)
    X, axis = _anisotropic(rng)
    v = cn.least_variance_direction(X)
    evals, evecs = np.linalg.eigh(np.cov(X, rowvar=False))  # independent: covariance eigh
    assert abs(abs(v @ evecs[:, 0]) - 1) < 1e-10 and abs(abs(v @ axis) - 1) < 1e-3
    # it centres (as sklearn PCA): shifting the data along the axis moves the raw SVD's
    # last direction away from it, not the centred one
    shifted = X + 10.0 * axis
    _, _, Vt = np.linalg.svd(shifted, full_matrices=False)
    assert abs(Vt[-1] @ axis) < 0.5
    np.testing.assert_allclose(cn.least_variance_direction(shifted), v, atol=1e-10)
    # sign: largest |(X - mean) v| entry positive (sklearn svd_flip, u-based)
    u = (X - X.mean(0)) @ v
    assert u[np.argmax(np.abs(u))] > 0


def test_least_variance_direction_with_fewer_rows_than_dims():
    X = np.random.default_rng(1).normal(size=(5, 9))
    v = cn.least_variance_direction(X)
    assert np.isclose(np.linalg.norm(v), 1) and np.abs((X - X.mean(0)) @ v).max() < 1e-10


def _objective(W, b, X, y, C):
    """sklearn's LogisticRegression objective, written in torch (autograd for the KKT test)."""
    Z = X @ W.T + b
    if W.shape[0] == 1:
        ce = torch.nn.functional.binary_cross_entropy_with_logits(Z[:, 0], y.double(), reduction="sum")
    else:
        ce = torch.nn.functional.cross_entropy(Z, y, reduction="sum")
    return C * ce + 0.5 * (W ** 2).sum()


@pytest.mark.parametrize("n_classes", [2, 3])
def test_fit_logreg_is_the_regularised_optimum(n_classes):
    rng = np.random.default_rng(2)
    X = rng.normal(size=(200, 5))
    y = (X @ rng.normal(size=(5, n_classes)) + rng.normal(size=(200, n_classes))).argmax(1)
    W, b = cn.fit_logreg(X, y, C=0.7)
    assert W.shape == (1 if n_classes == 2 else n_classes, 5)
    Wt = torch.tensor(W, requires_grad=True)
    bt = torch.tensor(b, requires_grad=True)
    _objective(Wt, bt, torch.tensor(X), torch.tensor(y), 0.7).backward()
    assert Wt.grad.abs().max() < 1e-5 and bt.grad.abs().max() < 1e-5  # strictly convex: KKT = optimum
    p = cn.logreg_proba(W, b, X)
    np.testing.assert_allclose(p.sum(1), 1.0)
    assert p.shape == (200, n_classes)


def test_fit_logreg_intercept_only_closed_form():
    y = np.array([0] * 30 + [1] * 10)
    W, b = cn.fit_logreg(np.zeros((40, 3)), y)
    np.testing.assert_allclose(W, 0, atol=1e-8)
    np.testing.assert_allclose(b, np.log(10 / 30), atol=1e-6)


def test_clipbkd_point_least_likely_class():
    rng = np.random.default_rng(3)
    X, axis = _anisotropic(rng, n=600)
    y = (X[:, 0] + 0.3 * rng.normal(size=600) > np.quantile(X[:, 0], 0.8)).astype(int)  # 20% ones
    x_p, y_p = cn.clipbkd_point(X, y)
    assert np.isclose(np.linalg.norm(x_p), 10) and abs(abs(x_p @ axis) / 10 - 1) < 1e-3
    W, b = cn.fit_logreg(X, y)
    assert y_p == np.argmin(cn.logreg_proba(W, b, x_p)[0])


def test_clipbkd_datasets_match_reference_construction():
    rng = np.random.default_rng(4)
    X, y = rng.normal(size=(50, 4)), rng.integers(0, 2, 50)
    x_p, y_p = np.full(4, 7.0), 1
    X_before, y_before = X.copy(), y.copy()
    for k in (1, 2, 4, 8):
        # make_new.py, "new" variant at k, and its k=1 D0 (exp_run.py trains D0 with n_pois=1)
        cp_x, cp_y = np.copy(X), np.copy(y)
        cp_x[-k:], cp_y[-k:] = x_p, y_p
        d0_x, d0_y = np.copy(X), np.copy(y)
        d0_x[-1:], d0_y[-1:] = x_p, 1 - y_p
        (X0, y0), (X1, y1) = cn.clipbkd_datasets(X, y, x_p, y_p, k)
        np.testing.assert_array_equal(X1, cp_x), np.testing.assert_array_equal(y1, cp_y)
        np.testing.assert_array_equal(X0, d0_x), np.testing.assert_array_equal(y0, d0_y)
        differ = np.any(X0 != X1, axis=1) | (y0 != y1)
        assert differ.sum() == k and differ[-k:].all()
        (C0, c0), (C1, _) = cn.clipbkd_datasets(X, y, x_p, y_p, k, d0="clean")
        np.testing.assert_array_equal(C0, X), np.testing.assert_array_equal(c0, y)
        np.testing.assert_array_equal(C1, X1)
    np.testing.assert_array_equal(X, X_before), np.testing.assert_array_equal(y, y_before)
    with pytest.raises(ValueError):
        cn.clipbkd_datasets(X, y + 1, x_p, 2, 1)  # flipping needs two classes


def test_clipbkd_statistic_separates_non_private_models():
    """A trained (non-private) LR scores higher on x_p's poison class when trained on D1."""
    rng = np.random.default_rng(5)
    X, _ = _anisotropic(rng, n=300)
    y = (X[:, 0] > np.median(X[:, 0])).astype(int)
    x_p, y_p = cn.clipbkd_point(X, y)
    scores = []
    for D in cn.clipbkd_datasets(X, y, x_p, y_p, k=4):
        W, b = cn.fit_logreg(*D, C=100.0)
        at_p = np.array([[[0.0, x_p @ W[0] + b[0]]]])  # (K=1, m=1, C=2): class-0 logit 0
        at_0 = np.array([[[0.0, b[0]]]])
        scores.append(cn.clipbkd_score(at_p, y_p, logits_zero=at_0)[0])
    assert scores[1] > scores[0] + 1.0


def test_scores_on_hand_made_outputs():
    logits = torch.tensor([[[1.0, 3.0]], [[2.0, -1.0]]])  # K=2 models, m=1 point, C=2
    zero = torch.tensor([[[0.5, 0.5]], [[0.0, 1.0]]])
    np.testing.assert_allclose(cn.clipbkd_score(logits, 1), [3.0, -1.0])
    np.testing.assert_allclose(cn.clipbkd_score(logits, 1, logits_zero=zero), [2.5, -2.0])
    np.testing.assert_allclose(cn.clipbkd_score(logits.numpy(), 0), [1.0, 2.0])
    losses = torch.tensor([[0.1, 0.2, 0.3], [1.0, 2.0, 3.0]])
    np.testing.assert_allclose(cn.backdoor_score(losses), [-0.6, -6.0])
    np.testing.assert_allclose(cn.mi_score(losses[:, :1]), [-0.1, -1.0])
    # reference MI: conf = exp(-loss); threshold = mean train conf
    conf_in = np.array([[0.9, 0.8, 0.4, 0.7]])   # mean 0.7 -> 3 of 4 members called in
    conf_out = np.array([[0.75, 0.2, 0.1, 0.5]])  # 3 of 4 below 0.7
    np.testing.assert_allclose(cn.yeom_mi_eps(-np.log(conf_in), -np.log(conf_out)), [np.log(1.5)])


def test_apply_patch_flat_and_channels_first():
    X = np.random.default_rng(6).uniform(0, 0.5, size=(3, 784)).astype(np.float32)
    P = cn.apply_patch(X, image_shape=(28, 28))
    patch = np.array([r * 28 + c for r in range(5) for c in range(5)])
    assert (P[:, patch] == 1).all()
    np.testing.assert_array_equal(np.delete(P, patch, axis=1), np.delete(X, patch, axis=1))
    assert (X < 1).all()  # input untouched
    imgs = np.zeros((2, 3, 32, 32), np.uint8)
    Q = cn.apply_patch(imgs, value=255)
    assert (Q[:, :, :5, :5] == 255).all() and Q.sum() == 2 * 3 * 25 * 255
    with pytest.raises(ValueError):
        cn.apply_patch(X)


def test_backdoor_pool_reproduces_reference_stream():
    """make_old.py: np.random.seed(0); subset choice; then choice(#class-0, 16) on the same stream."""
    rng = np.random.default_rng(7)
    pool_n = 200
    X = rng.uniform(0, 0.9, size=(pool_n, 784))
    y = rng.integers(0, 2, pool_n)
    np.random.seed(0)
    ss = np.random.choice(pool_n, pool_n // 2, replace=False)
    trn_x, trn_y = X[ss].reshape(-1, 28, 28, 1), y[ss]
    bkd_x = trn_x[np.where(trn_y == 0)[0]]
    bkd_x[:, :5, :5] = 1
    ref = bkd_x[np.random.choice(bkd_x.shape[0], 16, replace=False)].reshape(16, 784)

    idx, stream = data.subset_indices(pool_n, 0.5, seed=0)
    px, py = cn.backdoor_pool(X[idx], y[idx], rng=stream, image_shape=(28, 28))
    np.testing.assert_array_equal(px, ref)
    assert (py == 1).all()
    for k in (1, 2, 4, 8, 16):
        (X0, y0), (X1, y1) = cn.backdoor_datasets(X[idx], y[idx], px, py, k)
        np.testing.assert_array_equal(X0, X[idx])
        np.testing.assert_array_equal(X1[-k:], ref[-k:]), np.testing.assert_array_equal(X1[:-k], X[idx][:-k])
        assert (y1[-k:] == 1).all() and (y1[:-k] == y[idx][:-k]).all()


def test_backdoor_test_set_and_mi_datasets():
    rng = np.random.default_rng(8)
    X, y = rng.uniform(size=(30, 784)), rng.integers(0, 2, 30)
    tx, ty = cn.backdoor_test_set(X, y, image_shape=(28, 28))
    assert len(tx) == (y == 0).sum() and (ty == 1).all()
    np.testing.assert_array_equal(tx, cn.apply_patch(X[y == 0], image_shape=(28, 28)))
    (X0, y0), (X1, y1), (xt, yt) = cn.mi_datasets(X, y, index=4)
    assert len(X0) == 29 and len(X1) == 30
    np.testing.assert_array_equal(xt, X[4]), np.testing.assert_array_equal(X0, np.delete(X, 4, 0))
    assert yt == y[4] and (y0 == np.delete(y, 4)).all()


@pytest.mark.skipif(not (data.FMNIST_DEBIAN_DIR / "train-images-idx3-ubyte.gz").is_file(),
                    reason="Debian dataset-fashion-mnist not installed")
def test_clipbkd_point_on_real_fmnist(tmp_path):
    X, y = data.load_fmnist(tmp_path)
    x_p, y_p = cn.clipbkd_point(X, y)
    # make_new.py prints max |<x_i, x_p>|: the poison is nearly orthogonal to every image
    assert np.isclose(np.linalg.norm(x_p), 10, rtol=1e-5) and np.abs(X @ x_p).max() < 0.05
    assert y_p in (0, 1)


def test_checkerboard_alternates_between_data_extremes():
    X = torch.rand(10, 784) * 0.8 + 0.1
    img = cn.checkerboard(X).reshape(28, 28)
    lo, hi = X.min(), X.max()
    i, j = np.indices((28, 28))
    np.testing.assert_allclose(img.numpy(), np.where((i + j) % 2, hi, lo), rtol=1e-6)
    assert cn.checkerboard(torch.rand(3, 5)).shape == (5,)
