"""Abadi et al. 2016, Figures 3 and 6: the deeper dense head and the per-epoch hooks of the
trainer against torch.func and plain runs, DP-PCA, the composed accountant, the stopping
epoch, the MNIST and CIFAR-subset loaders, and the CLI steps on tiny real-format data."""

from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from dpaudit import accounting, data, dpsgd as D
from dpaudit.dpsgd import philox
from dpaudit.bounds import eps_from_mu
from dpaudit.cli import main
from dpaudit.experiments import abadi
from dpaudit.io import DataNotFound, read_table

F64 = torch.float64


def _deep_problem(n=30, d=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=F64) * torch.exp(3 * torch.rand(n, 1, generator=g,
                                                                             dtype=F64))
    y = torch.randint(0, 3, (n,), generator=g)
    model = D.ModelSpec("fnn", d, (5, 4), 3)
    return X, y, model, D.init_params(model, 1, seed, scale=2.0, dtype=F64, device="cpu")


def _module(model, params):
    dims = [model.in_dim, *model.hidden, model.n_classes]
    layers = []
    for i, o in zip(dims[:-1], dims[1:]):
        layers += [nn.Linear(i, o).to(F64), nn.ReLU()]
    module = nn.Sequential(*layers[:-1])
    with torch.no_grad():
        for lin, W, b in zip([m for m in module if isinstance(m, nn.Linear)], params.W, params.b):
            lin.weight.copy_(W[0].T)
            lin.bias.copy_(b[0])
    return module


def test_model_spec_stacks_hidden_layers_and_keeps_the_one_layer_form():
    assert D.ModelSpec("fnn", 60, 1000, 10).shapes == [(60, 1000), (1000, 10)]
    deep = D.ModelSpec("fnn", 1024, [384, 384], 10)
    assert deep.hidden == (384, 384) and deep.shapes == [(1024, 384), (384, 384), (384, 10)]
    assert deep.n_params == 1025 * 384 + 385 * 384 + 385 * 10
    with pytest.raises(ValueError, match="hidden"):
        D.ModelSpec("fnn", 10, (4, 0))


@pytest.mark.parametrize("noise_std", [0.0, 0.6])
def test_deep_head_step_matches_per_example_autograd(tmp_path, noise_std):
    """One full-batch step of a 3-layer head: theta - lr/B (sum_i clip_C(grad_i) + s z),
    per-example gradients by torch.func (vmap of grad), joint norm over all layers."""
    X, y, model, init = _deep_problem()
    module = _module(model, init)
    params = {k: v.detach() for k, v in module.named_parameters()}

    def loss(p, x, t):
        return nn.functional.cross_entropy(torch.func.functional_call(module, p, (x[None],)),
                                           t[None], reduction="sum")

    grads = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(params, X, y)
    norms = torch.sqrt(sum(g.flatten(1).square().sum(1) for g in grads.values()))
    clip, lr, n = 1.0, 0.3, len(X)
    assert (norms > 3 * clip).sum() >= 5 and (norms < clip).sum() >= 5  # both regimes occur
    torch.testing.assert_close(D.grad_norms(init, X, y, model)[0], norms, rtol=1e-10, atol=0)
    factor = torch.clamp(clip / norms, max=1.0)
    new = {k: params[k] - lr / n * torch.einsum("i,i...->...", factor, grads[k]) for k in params}
    # nn.Linear stores W transposed; the trainer's layout is W_0, b_0, W_1, ... row-major.
    ref = torch.cat([new[f"{2 * l}.{w}"].T.reshape(-1) if w == "weight" else
                     new[f"{2 * l}.{w}"].reshape(-1) for l in range(3) for w in ("weight", "bias")])
    cfg = D.DPSGDConfig(epochs=1, batch_size=n, lr=lr, clip=clip, noise_multiplier=0.0,
                        init="fixed")
    got = D.train_with_noise_std(X, y, model, cfg, [5], noise_std, init=init, device="cpu")
    z = philox.draw("normal", philox.keys([5], "cpu"), philox.NOISE, 0, model.n_params)[0].double()
    torch.testing.assert_close(D.flatten(got)[0], ref - lr / n * noise_std * z,
                               rtol=1e-10, atol=1e-12)
    D.save_params(tmp_path / "p.pt", got, model)  # the spec round-trips with its tuple
    assert D.load_params(tmp_path / "p.pt")[1] == model


def _runs(model, X, y, epochs, **kw):
    cfg = D.DPSGDConfig(epochs, 20, 0.2, 1.0, 0.0, "poisson")
    return D.train(X, y, model, cfg, [3, 4], device="cpu", **kw)


def test_on_epoch_sees_each_epoch_end_and_leaves_the_run_unchanged():
    """n / B = 2.5: Poisson epochs end after round(2.5 e) steps; without noise (the batches
    are a prefix of the longer run's draws) the model at epoch e is the e-epoch run's, and
    the hook changes nothing."""
    X, y, model, _ = _deep_problem(n=50)
    assert D.epoch_ends(D.DPSGDConfig(3, 20, 0.2, 1.0, 0.0, "poisson"), 50) == [2, 5, 8]
    assert D.epoch_ends(D.DPSGDConfig(2, 20, 0.2, 1.0, 0.0), 50) == [3, 6]  # shuffle
    seen = {}
    final = _runs(model, X, y, 3, on_epoch=lambda e, cols: seen.setdefault(
        e, D.flatten(cols[0]).clone()))
    assert sorted(seen) == [1, 2, 3]
    torch.testing.assert_close(seen[3], D.flatten(final), rtol=0, atol=0)
    torch.testing.assert_close(D.flatten(_runs(model, X, y, 3)), D.flatten(final), rtol=0, atol=0)
    for e in (1, 2):
        torch.testing.assert_close(seen[e], D.flatten(_runs(model, X, y, e)), rtol=0, atol=0)


def test_lr_schedule_is_the_rate_of_each_step():
    """Full-batch steps (deterministic) with a schedule equal one-step runs chained by hand
    at each step's rate; a constant schedule is the plain run, bit for bit."""
    X, y, model, init = _deep_problem(n=24)
    cfg = D.DPSGDConfig(3, 24, 0.5, 1.0, 0.0, "shuffle", "fixed")
    rates = [0.5, 0.3, 0.1]
    got = D.train(X, y, model, cfg, [1], init=init, device="cpu",
                  lr_schedule=lambda t: rates[t])
    params = init
    for lr in rates:
        one = D.DPSGDConfig(1, 24, lr, 1.0, 0.0, "shuffle", "fixed")
        params = D.train(X, y, model, one, [1], init=params, device="cpu")
    torch.testing.assert_close(D.flatten(got), D.flatten(params), rtol=1e-12, atol=1e-14)
    plain = D.train(X, y, model, cfg, [1], init=init, device="cpu")
    const = D.train(X, y, model, cfg, [1], init=init, device="cpu", lr_schedule=lambda t: 0.5)
    torch.testing.assert_close(D.flatten(const), D.flatten(plain), rtol=0, atol=0)
    with pytest.raises(ValueError, match="lr_schedule"):
        D.train(X, y, model, cfg, [1], init=init, device="cpu", lr_schedule=lambda t: 0.0)
    sched = abadi.linear_decay(0.1, 0.052, 10, 100)
    assert sched(0) == 0.1 and sched(500) == pytest.approx(0.076) and sched(5000) == 0.052


def test_dp_pca_without_noise_is_the_top_singular_vectors_of_the_unit_rows():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 12)) * np.arange(1, 13)
    X[5] = 0  # an all-zero row is allowed and ignored
    V = abadi.dp_pca(X, 4, 0.0, rng)
    rows = X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-300)
    ref = np.linalg.svd(rows, full_matrices=False)[2][:4].T
    np.testing.assert_allclose(np.abs(V.T @ ref), np.eye(4), atol=1e-5)  # same up to sign
    noisy = abadi.dp_pca(X, 4, 2.0, np.random.default_rng(1))
    np.testing.assert_allclose(noisy.T @ noisy, np.eye(4), atol=1e-5)
    np.testing.assert_array_equal(noisy, abadi.dp_pca(X, 4, 2.0, np.random.default_rng(1)))


@pytest.mark.parametrize("sigma_pca", [0.5, 2.0])
def test_dp_pca_adds_noise_of_std_sigma_pca_to_the_unit_row_covariance(sigma_pca):
    """The top eigenvectors of A^T A + (Z + Z^T) / 2, Z i.i.d. N(0, sigma_pca^2) drawn
    again from the same generator: the noise the mechanism's accounting assumes. The same
    draws at half the std give other directions, so the check has the power to tell."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 12)) * np.arange(1, 13)
    A = X / np.linalg.norm(X, axis=1, keepdims=True)

    def top(std):
        Z = np.random.default_rng(1).normal(0.0, std, (12, 12))
        return np.linalg.eigh(A.T @ A + (Z + Z.T) / 2)[1][:, ::-1][:, :4]

    V = abadi.dp_pca(X, 4, sigma_pca, np.random.default_rng(1))
    np.testing.assert_allclose(np.abs(V.T @ top(sigma_pca)), np.eye(4), atol=1e-5)
    assert not np.allclose(np.abs(V.T @ top(sigma_pca / 2)), np.eye(4), atol=1e-2)


@pytest.mark.parametrize("method", ["rdp_classic", "rdp", "gdp"])
def test_epsilon_curve_matches_the_accountant_pointwise(method):
    steps = np.array([0, 1, 300, 5000])
    curve = accounting.epsilon_curve(4.0, 0.01, steps, 1e-5, method)
    assert curve[0] == 0
    for t, e in zip(steps[1:], curve[1:]):
        assert e == pytest.approx(accounting.epsilon(4.0, 0.01, int(t), 1e-5, method), rel=1e-12)


def _classic_eps(rdp, orders, delta):
    """The moments accountant's conversion [Mironov 2017, Prop. 3] of an RDP curve."""
    return float(np.min(np.asarray(rdp) + math.log(1 / delta) / (np.asarray(orders) - 1)))


@pytest.mark.parametrize("method", ["rdp_classic", "rdp"])  # abadi.accountant's choices
def test_epsilon_curve_composes_the_pca_like_dp_accounting(method):
    """The PCA's Gaussian and T subsampled steps composed by dp_accounting as one event at
    the method's orders, converted as the method does: the PCA alone (T = 0) and with T."""
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant as R

    sigma, q, sigma_p, delta = 3.0, 0.02, 5.0, 1e-5
    orders = accounting.CLASSIC_ORDERS if method == "rdp_classic" else R.DEFAULT_RDP_ORDERS
    pca = dp_accounting.GaussianDpEvent(sigma_p)
    sgd = dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        q, dp_accounting.GaussianDpEvent(sigma)), 700)
    refs = []
    for event in (pca, dp_accounting.ComposedDpEvent([pca, sgd])):
        acc = R.RdpAccountant(list(orders)).compose(event)
        refs.append(_classic_eps(acc.rdp, orders, delta) if method == "rdp_classic"
                    else acc.get_epsilon(delta))
    got = accounting.epsilon_curve(sigma, q, [0, 700], delta, method, [sigma_p])
    np.testing.assert_allclose(got, refs, rtol=1e-9)


def test_noise_free_pca_is_not_dp():
    """sigma_pca = 0 (the exact PCA): every eps inf, under every accountant; an eps target
    on such a level is refused naming the key, also when the workflow reads the config."""
    for method in accounting.METHODS:
        assert np.isinf(accounting.epsilon_curve(2.0, 0.01, [0, 100], 1e-5, method,
                                                 [0.0])).all()
    exact = {"name": "exact", "sigma": 2.0, "sigma_pca": 0.0, "eps": 2.0}
    with pytest.raises(ValueError, match=r"abadi\.fig3\.levels\[exact\]\.sigma_pca = 0"):
        abadi.levels({"fig3": {"levels": [exact]}}, "fig3")
    assert abadi.levels({"fig3": {"levels": [{**exact, "eps": None}]}}, "fig3")


def test_epsilon_curve_composes_the_pca_gaussian():
    """With q = 1 every step is a Gaussian mechanism, so T steps and the PCA are exactly one
    Gaussian with mu = sqrt(T / sigma^2 + 1 / sigma_p^2): PLD within its discretisation of
    the exact eps, RDP above it."""
    sigma, sigma_p, T, delta = 3.0, 5.0, 20, 1e-5
    exact = eps_from_mu(math.sqrt(T / sigma ** 2 + 1 / sigma_p ** 2), delta)
    pld = accounting.epsilon_curve(sigma, 1.0, [T], delta, "pld", [sigma_p])[0]
    assert exact <= pld <= exact + 1e-3
    for method in ("rdp", "rdp_classic"):
        assert accounting.epsilon_curve(sigma, 1.0, [T], delta, method, [sigma_p])[0] > exact
    mu_clt = 0.02 * math.sqrt(T * math.expm1(sigma ** -2))  # the CLT's mu, then + the PCA's
    assert accounting.epsilon_curve(sigma, 0.02, [T], delta, "gdp", [sigma_p])[0] == \
        pytest.approx(eps_from_mu(math.sqrt(mu_clt ** 2 + sigma_p ** -2), delta), rel=1e-9)


def test_epochs_for_eps_is_the_last_epoch_within_the_target():
    """The paper's medium noise: eps (DP-PCA at sigma_p = 7 included) stays within 2 up to
    the returned epoch and passes it one epoch later; targets below one epoch fail."""
    E = abadi.epochs_for_eps(2.0, 4.0, 60000, 600, 1000, 1e-5, "rdp_classic", [7.0])
    curve = abadi.eps_by_epoch(D.DPSGDConfig(E + 1, 600, 0.1, 4.0, 4.0, "poisson"), 60000,
                               1e-5, "rdp_classic", [7.0])
    assert curve[E] <= 2.0 < curve[E + 1] and 150 < E < 250
    assert abadi.epochs_for_eps(None, 4.0, 60000, 600, 7, 1e-5, "rdp") == 7
    assert abadi.epochs_for_eps(100.0, 4.0, 60000, 600, 7, 1e-5, "rdp") == 7
    with pytest.raises(ValueError, match="eps target 0.5"):
        abadi.epochs_for_eps(0.5, 4.0, 60000, 600, 10, 1e-5, "rdp_classic", [7.0])


def test_mnist_is_read_from_idx_files_and_missing_mnist_names_the_stand_in(tmp_path,
                                                                          monkeypatch):
    from fakedata import fake_fmnist, idx_bytes

    with pytest.raises(DataNotFound) as missing:
        data.mnist_raw(tmp_path, download=False)
    for words in ("set data.download: true", f"data.root = {tmp_path}",
                  "abadi.fig3.dataset: fmnist", "docs/data.md, section Offline"):
        assert words in str(missing.value), words

    def offline(*args, **kwargs):  # torchvision's MNIST without internet
        raise RuntimeError("Error downloading train-images-idx3-ubyte.gz")

    monkeypatch.setattr(data._datasets(), "MNIST", offline)
    with pytest.raises(DataNotFound) as failed:
        data.mnist_raw(tmp_path, download=True)
    text = str(failed.value)
    for words in ("download failed (no internet?): Error downloading", "data.download: false",
                  "abadi.fig3.dataset: fmnist", "docs/data.md, section Offline"):
        assert words in text, words
    assert "set data.download: true" not in text
    monkeypatch.undo()
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    arrays = fake_fmnist(np.random.default_rng(0), n_train=30, n_test=10)
    for name, arr in arrays.items():  # gzipped, as downloaded
        (raw / f"{name}.gz").write_bytes(gzip.compress(idx_bytes(arr)))
    X, y = data.load_ten_class("mnist", tmp_path, train=False)
    assert X.shape == (10, 784) and X.dtype == np.float32 and X.max() <= 1
    np.testing.assert_array_equal(X * 255, arrays["t10k-images-idx3-ubyte"].reshape(10, -1))
    np.testing.assert_array_equal(y, arrays["t10k-labels-idx1-ubyte"])
    assert [r["n"] for r in data.prepare_mnist(tmp_path)] == [30, 10]


def test_cifar_sample_decodes_a_seeded_subset(tmp_path):
    from fakedata import write_tree

    tree = write_tree(tmp_path, np.random.default_rng(0), classes=data.CIFAR10_CLASSES,
                      per_class=2)
    whole = data.load_cifar10(tmp_path, train=False)
    part = data.load_cifar10(tmp_path, train=False, sample=5, sample_seed=3)
    assert len(part.labels) == 5
    assert part.images.tobytes() == data.load_cifar10(tmp_path, False, sample=5,
                                                      sample_seed=3).images.tobytes()
    for img, label in zip(part.images, part.labels):
        assert any((img == w).all() and label == wl for w, wl in zip(whole.images, whole.labels))
    assert len(tree) == 20
    with pytest.raises(ValueError, match="sample"):
        data.load_cifar10(tmp_path, train=False, sample=21)


def test_cli_trains_both_figures_on_tiny_data(tmp_path, monkeypatch):
    """abadi-train (Figure 3 on IDX files, Figure 6 on features from abadi-features over a
    JPEG-free ImageFolder tree), abadi-table and abadi-plot, as the rules call them."""
    from fakedata import fake_fmnist, idx_bytes, write_tree

    root = tmp_path / "data"
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for name, arr in fake_fmnist(np.random.default_rng(0), n_train=120, n_test=30).items():
        (raw / name).write_bytes(idx_bytes(arr))
    write_tree(root, np.random.default_rng(1), classes=data.CIFAR10_CLASSES, per_class=8)
    monkeypatch.chdir(tmp_path)
    shared = {"delta": 1e-5, "accountant": "rdp_classic"}
    dspec = {"root": str(root), "download": False, "cifar10_tarball": None,
             "cifar100_root": str(tmp_path / "none")}
    fig3 = {"dataset": "fmnist", "n_train": 100, "n_test": 0, "train_eval_images": 50,
            "pca_dims": 8, "hidden": 16, "lot_size": 20, "clip": 4.0, "lr": 0.1,
            "lr_end": 0.05, "lr_decay_epochs": 1, "max_epochs": 2, **shared}
    level3 = {"name": "small", "sigma": 2.0, "sigma_pca": 4.0, "eps": 8.0}
    assert main(["abadi-train", "--figure", "fig3", "--spec", json.dumps(fig3), "--level",
                 json.dumps(level3), "--data", json.dumps(dspec), "--seed", "1", "--device",
                 "cpu", "--out", "fig3_small.csv"]) == 0
    fig6 = {"public_images": 30, "private_images": 40, "test_images": 20, "pretrain_epochs": 1,
            "train_eval_images": 0, "hidden": [8, 8], "sigma": 6.0, "clip": 3.0, "lr": 0.1,
            "max_epochs": 2, **shared}
    feature_keys = ("public_images", "private_images", "test_images", "pretrain_epochs")
    assert main(["abadi-features", "--spec", json.dumps(
        {k: fig6[k] for k in (*feature_keys, *shared)}), "--data", json.dumps(dspec),
        "--seed", "1", "--device", "cpu", "--out", "feat.npz"]) == 0
    level6 = {"name": "eps8", "lot_size": 10, "eps": 8.0}
    assert main(["abadi-train", "--figure", "fig6", "--spec", json.dumps(fig6), "--level",
                 json.dumps(level6), "--features", "feat.npz", "--seed", "1", "--device",
                 "cpu", "--out", "fig6_eps8.csv"]) == 0
    assert main(["abadi-table", "--tables", "fig3_small.csv", "fig6_eps8.csv", "--out",
                 "acc.csv"]) == 0
    table, prov = read_table("acc.csv")
    assert list(table.columns) == list(abadi.COLUMNS)
    f3, f6 = table[table.figure == "fig3"], table[table.figure == "fig6"]
    assert list(f3.epoch) == [0, 1, 2] and list(f6.epoch) == [0, 1, 2]
    assert (f3.dataset == "fmnist").all() and (f3.n_train == 100).all()
    assert (f6.dataset == "cifar10").all() and (f6.n_train == 40).all()
    assert f6.pretrained_on.str.startswith("cifar10-heldout[30]").all()
    # an ImageFolder tree is read as the JPEG re-encoding (docs/data.md): every row says so
    assert f6.jpeg_reencoded.all() and not f3.jpeg_reencoded.any()
    # eps: the PCA's alone at epoch 0 (Figure 3: a Gaussian's RDP a / (2 sigma_p^2) at the
    # moments accountant's orders), none at epoch 0 of Figure 6, then growing
    orders = np.array(accounting.CLASSIC_ORDERS)
    pca_alone = np.min(orders / (2 * 4.0 ** 2) + math.log(1e5) / (orders - 1))
    assert f3.eps.iloc[0] == pytest.approx(pca_alone, rel=1e-9)
    assert f3.eps.is_monotonic_increasing
    assert f6.eps.iloc[0] == 0 and f6.eps.is_monotonic_increasing
    assert table.train_acc.between(0, 1).all() and table.test_acc.between(0, 1).all()
    # lr of each epoch's last step: 0.1 falling to 0.05 over the first epoch's 5 steps
    assert list(f3.lr) == [0.1, pytest.approx(0.06), pytest.approx(0.05)]
    # the summed table records each level's config, data or features, and seeds
    assert set(prov["levels"]) == {"fig3_small.csv", "fig6_eps8.csv"}
    small, eps8 = prov["levels"]["fig3_small.csv"], prov["levels"]["fig6_eps8.csv"]
    assert small["spec"] == fig3 and small["level"] == level3 and small["seed"] == 1
    assert {k: small["data"][k] for k in dspec} == dspec and "features" not in small
    assert eps8["spec"] == fig6 and eps8["level"] == level6 and "data" not in eps8
    assert eps8["features"]["pretrained_on"].startswith("cifar10-heldout[30]")
    assert small["model_seed"] != eps8["model_seed"]
    for fig in ("fig3", "fig6"):
        assert main(["abadi-plot", "--figure", fig, "--table", "acc.csv", "--out",
                     f"{fig}.pdf"]) == 0
        assert (tmp_path / f"{fig}.png").stat().st_size > 0
    from dpaudit.plots import abadi as abadi_plots

    titles = []
    monkeypatch.setattr(abadi_plots, "save", lambda fig, out: titles.append(
        fig._suptitle.get_text()))
    for fig in ("fig3", "fig6"):
        abadi_plots.plot_abadi("acc.csv", fig, "unused.pdf")
    assert "(JPEG re-encoded)" in titles[1] and "JPEG" not in titles[0]
    # the exact PCA: a non-private baseline with eps = inf, refused with an eps target
    exact = {"name": "exact", "sigma": 2.0, "sigma_pca": 0.0, "eps": None}
    args = ["abadi-train", "--figure", "fig3", "--spec", json.dumps({**fig3, "max_epochs": 1}),
            "--data", json.dumps(dspec), "--seed", "1", "--device", "cpu", "--out"]
    assert main([*args, "exact.csv", "--level", json.dumps(exact)]) == 0
    assert np.isinf(read_table("exact.csv")[0].eps).all()
    assert main([*args, "x.csv", "--level", json.dumps({**exact, "eps": 8.0})]) == 2
    assert not (tmp_path / "x.csv").exists()
    bad = {**level3, "sigma": -1}
    assert main(["abadi-train", "--figure", "fig3", "--spec", json.dumps(fig3), "--level",
                 json.dumps(bad), "--data", json.dumps(dspec), "--seed", "1", "--out",
                 "x.csv"]) == 2
