"""Batched DP-SGD trainer (Jagielski et al. 2020, Alg. 1) against torch.func / Opacus / plain SGD references."""

import math

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn

from dpaudit import device
from dpaudit import dpsgd as D
from dpaudit.dpsgd import philox
from dpaudit.dpsgd.model import layer_tensors

F64 = torch.float64


def _h100(free: int = 80 * 2**30) -> device.GpuDescription:
    """An H100 as torch reports one, with ``free`` bytes free (forced on the CPU)."""
    return device.GpuDescription("NVIDIA H100 80GB HBM3", 80 * 2**30, free, "9.0", 132)


def _module(model: D.ModelSpec) -> nn.Sequential:
    if model.arch == "lr":
        return nn.Sequential(nn.Linear(model.in_dim, model.n_classes)).to(F64)
    return nn.Sequential(nn.Linear(model.in_dim, model.hidden), nn.ReLU(),
                         nn.Linear(model.hidden, model.n_classes)).to(F64)


def _load(module: nn.Sequential, params: D.Params, k: int = 0) -> nn.Sequential:
    """Copy model k of ``params`` into an nn.Sequential (nn.Linear stores W transposed)."""
    linears = [m for m in module if isinstance(m, nn.Linear)]
    with torch.no_grad():
        for lin, W, b in zip(linears, params.W, params.b):
            lin.weight.copy_(W[k].T)
            lin.bias.copy_(b[k])
    return module


def _as_params(module: nn.Sequential) -> D.Params:
    linears = [m for m in module if isinstance(m, nn.Linear)]
    return D.Params([l.weight.detach().T[None].clone() for l in linears],
                    [l.bias.detach()[None].clone() for l in linears])


def _problem(arch, n=40, d=7, seed=0, spread=3.0):
    """Small float64 problem whose per-example gradient norms spread over ~2 decades; 3
    classes, 2 for ``arch`` "lr2" (logistic regression: the trainer's two-class step)."""
    classes = 2 if arch == "lr2" else 3
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=F64) * torch.exp(spread * torch.rand(n, 1, generator=g,
                                                                               dtype=F64))
    y = torch.randint(0, classes, (n,), generator=g)
    model = D.ModelSpec("lr" if arch == "lr2" else arch, d, hidden=5, n_classes=classes)
    init = D.init_params(model, 1, seed, scale=2.0, dtype=F64, device="cpu")
    return X, y, model, init


def _reference_step(module, X, y, clip, lr, B):
    """One DP-SGD step without noise via torch.func: vmap(grad) per-example gradients of the
    per-example cross-entropy, joint norm over all parameters, clip to C, sum, / B."""
    params = {k: v.detach() for k, v in module.named_parameters()}

    def loss(p, x, t):
        out = torch.func.functional_call(module, p, (x[None],))
        return nn.functional.cross_entropy(out, t[None], reduction="sum")

    grads = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(params, X, y)
    norms = torch.sqrt(sum(g.flatten(1).square().sum(1) for g in grads.values()))
    factor = torch.clamp(clip / norms, max=1.0)
    new = {k: params[k] - lr / B * torch.einsum("i,i...->...", factor, grads[k]) for k in params}
    return new, norms


def _flat(params: D.Params, k: int) -> torch.Tensor:
    return torch.cat([t[k].reshape(-1) for pair in zip(params.W, params.b) for t in pair])


@pytest.mark.parametrize("noise_std", [0.0, 0.7])
@pytest.mark.parametrize("arch", ["lr", "lr2", "fnn"])
def test_one_step_update_matches_torch_func(arch, noise_std):
    """theta - lr/B (sum_i clip_C(grad_i) + s z), grads by torch.func, z the model's noise draw."""
    X, y, model, init = _problem(arch)
    module = _load(_module(model), init)
    clip, lr, n, seeds = 1.0, 0.3, len(X), [3, 4]
    ref, norms = _reference_step(module, X, y, clip, lr, n)
    assert (norms > 3 * clip).sum() >= 5 and (norms < clip).sum() >= 5  # both regimes occur
    module.load_state_dict(ref)
    ref_flat = _flat(_as_params(module), 0)
    cfg = D.DPSGDConfig(epochs=1, batch_size=n, lr=lr, clip=clip, noise_multiplier=0.0,
                        init="fixed")
    got = D.train_with_noise_std(X, y, model, cfg, seeds, noise_std, init=init, device="cpu")
    for k, seed in enumerate(seeds):
        # The noise of step 0: the model's noise-stream draw at that step, laid out as
        # W_0, b_0, W_1, b_1 (row-major).
        z = philox.draw("normal", philox.keys([seed], "cpu"), philox.NOISE, 0,
                        model.n_params)[0].double()
        torch.testing.assert_close(_flat(got, k), ref_flat - lr / n * noise_std * z,
                                   rtol=1e-10, atol=1e-12)
    if noise_std:
        assert not torch.allclose(_flat(got, 0), _flat(got, 1))
    # The per-example norms the trainer clips with are the torch.func ones.
    torch.testing.assert_close(D.grad_norms(init, X, y, model)[0], norms, rtol=1e-10, atol=0)


def test_noise_is_standard_normal_times_std():
    """(noisy - noiseless) / (-lr s / B): N(0, 1) i.i.d. coordinates, the same at every s."""
    g = torch.Generator().manual_seed(1)
    n, d = 50, 784
    X, y = torch.rand(n, d, generator=g, dtype=F64), torch.randint(0, 2, (n,), generator=g)
    model = D.ModelSpec("fnn", d, hidden=32)
    cfg = D.DPSGDConfig(epochs=1, batch_size=n, lr=0.2, clip=0.5, noise_multiplier=0.0)
    seeds = [11, 12, 13, 14]
    base = D.train_with_noise_std(X, y, model, cfg, seeds, 0.0, device="cpu")
    z = {}
    for s in (0.7, 1.4):
        noisy = D.train_with_noise_std(X, y, model, cfg, seeds, s, device="cpu")
        z[s] = torch.stack([(_flat(noisy, k) - _flat(base, k)) / (-cfg.lr / n * s)
                            for k in range(len(seeds))])
    torch.testing.assert_close(z[0.7], z[1.4], rtol=1e-6, atol=1e-6)
    flat = z[0.7].reshape(-1).numpy()
    # N = 100,744 values: mean within 5/sqrt(N), mean square within 5 sqrt(2/N) (~2% of s^2).
    assert abs(flat.mean()) < 5 / math.sqrt(flat.size)
    assert abs((flat ** 2).mean() - 1) < 5 * math.sqrt(2 / flat.size)
    assert stats.kstest(flat, "norm").pvalue > 1e-3
    c = np.corrcoef(z[0.7].numpy())  # each model its own noise
    assert np.abs(c[np.triu_indices(len(seeds), 1)]).max() < 5 / math.sqrt(z[0.7].shape[1])


@pytest.mark.filterwarnings("ignore:Full backward hook")  # X needs no grad
def test_per_example_norms_match_opacus_grad_sample():
    opacus = pytest.importorskip("opacus")
    X, y, model, init = _problem("fnn", n=12, d=9)
    gsm = opacus.GradSampleModule(_load(_module(model), init), loss_reduction="sum")
    nn.functional.cross_entropy(gsm(X), y, reduction="sum").backward()
    norms = torch.sqrt(sum(p.grad_sample.flatten(1).square().sum(1) for p in gsm.parameters()))
    torch.testing.assert_close(D.grad_norms(init, X, y, model)[0], norms, rtol=1e-10, atol=0)


def test_clipping_bounds_each_examples_contribution():
    """One example per batch: the update is exactly lr*C when ||grad|| > C, smaller otherwise."""
    model = D.ModelSpec("fnn", 5, hidden=4)
    init = D.init_params(model, 1, 0, dtype=F64, device="cpu")
    x = torch.tensor([[1e4, -2e4, 3e4, 1e4, 5e3], [1e-3, 0, 0, 0, 2e-3]], dtype=F64)
    y = torch.tensor([1, 0])
    norms = D.grad_norms(init, x, y, model)[0]
    assert norms[0] > 1e3 and 0 < norms[1] < 1.5  # clipped at C = 2 and not
    for i, expect in [(0, 0.3 * 2.0), (1, 0.3 * norms[1])]:
        cfg = D.DPSGDConfig(epochs=1, batch_size=1, lr=0.3, clip=2.0, noise_multiplier=0.0,
                            init="fixed")
        out = D.train(x[i:i + 1], y[i:i + 1], model, cfg, [0], init=init, device="cpu")
        step = torch.linalg.norm(_flat(out, 0) - _flat(init, 0))
        torch.testing.assert_close(step, torch.as_tensor(expect, dtype=F64), rtol=1e-10, atol=0)


@pytest.mark.parametrize("arch", ["lr", "lr2", "fnn"])
def test_no_noise_large_clip_is_plain_sgd(arch):
    """sigma = 0, C = inf: full-batch DP-SGD = torch.optim.SGD on the mean cross-entropy."""
    X, y, model, init = _problem(arch, n=30)
    module = _load(_module(model), init)
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    for _ in range(5):
        opt.zero_grad()
        nn.functional.cross_entropy(module(X), y).backward()
        opt.step()
    cfg = D.DPSGDConfig(epochs=5, batch_size=len(X), lr=0.1, clip=1e12, noise_multiplier=0.0,
                        init="fixed")
    got = D.train(X, y, model, cfg, [5], init=init, device="cpu")
    torch.testing.assert_close(_flat(got, 0), _flat(_as_params(module), 0), rtol=1e-10,
                               atol=1e-12)


def _noisy_problem(sampling):
    """90 random examples, a 6-8-2 net, 3 noisy epochs of batch 20 with ``sampling``."""
    g = torch.Generator().manual_seed(2)
    X, y = torch.randn(90, 6, generator=g), torch.randint(0, 2, (90,), generator=g)
    cfg = D.DPSGDConfig(epochs=3, batch_size=20, lr=0.2, clip=1.0, noise_multiplier=1.3,
                        sampling=sampling)
    return X, y, D.ModelSpec("fnn", 6, hidden=8), cfg


@pytest.mark.parametrize("sampling", ["shuffle", "poisson"])
def test_each_models_randomness_depends_only_on_its_seed(sampling):
    X, y, model, cfg = _noisy_problem(sampling)
    a = D.train(X, y, model, cfg, [7, 8, 9], device="cpu")
    b = D.train(X, y, model, cfg, [7, 8, 9], device="cpu")
    c = D.train(X, y, model, cfg, [9, 1, 7], device="cpu")
    alone = D.train(X, y, model, cfg, [8], device="cpu")
    for k in range(3):
        assert torch.equal(_flat(a, k), _flat(b, k))
    # Same draws whatever the other models; Poisson batches are padded to the largest batch
    # of the step, which can change the float summation order (not the terms).
    same = torch.equal if sampling == "shuffle" else (
        lambda u, v: torch.allclose(u, v, rtol=1e-6, atol=1e-7))
    assert same(_flat(c, 2), _flat(a, 0)) and same(_flat(c, 0), _flat(a, 2))
    assert same(_flat(alone, 0), _flat(a, 1))
    assert not torch.allclose(_flat(a, 0), _flat(a, 1))


@pytest.mark.parametrize("shared", [False, True])
def test_poisson_batches_have_binomial_sizes_and_no_repeats(shared):
    n, B, K, S = 400, 40, 5, 200
    cfg = D.DPSGDConfig(epochs=1, batch_size=B, lr=0.1, clip=1.0, noise_multiplier=1.0,
                        sampling="poisson")
    batches = D.sampling.Batches(cfg, n, philox.keys(range(K), "cpu"), shared, torch.float32)
    sizes, rows = [], []
    for t in range(S):
        idx, valid = batches.step(t)
        for k in range(K):
            if shared:
                chosen = valid[k].nonzero()[:, 0]
            else:
                chosen = idx[k][valid[k] > 0]
                assert len(set(chosen.tolist())) == len(chosen)
                if t < 3:  # exactly the run's own draw: its rows in order, then padding 0
                    own = philox.draw("bernoulli", philox.keys([k], "cpu"), philox.BATCH, t,
                                      n, B / n)[0]
                    assert torch.equal(chosen, own.nonzero()[:, 0])
                    assert valid[k].tolist() == sorted(valid[k].tolist(), reverse=True)
                    assert not idx[k][valid[k] == 0].any()
            sizes.append(len(chosen))
            rows.append(chosen)
    sizes = np.array(sizes)
    q = B / n
    # mean of K*S Binomial(n, q) counts: 5-sigma band around n*q; variance n*q*(1-q).
    assert abs(sizes.mean() - n * q) < 5 * math.sqrt(n * q * (1 - q) / sizes.size)
    assert stats.chi2.sf((sizes.size - 1) * sizes.var(ddof=1) / (n * q * (1 - q)),
                         sizes.size - 1) > 1e-4
    # every row equally likely: its count over the K*S batches is Binomial(K*S, q)
    counts = np.bincount(torch.cat(rows).numpy(), minlength=n)
    assert stats.chisquare(counts).pvalue > 1e-4
    assert cfg.steps(n) == round(1 / q)
    if shared:  # the same batches as gathered, from the same keys
        gathered = D.sampling.Batches(cfg, n, philox.keys(range(K), "cpu"), False, torch.float32)
        idx, valid = gathered.step(S - 1)
        assert [sorted(idx[k][valid[k] > 0].tolist()) for k in range(K)] == \
            [r.tolist() for r in rows[-K:]]


@pytest.mark.parametrize("shared", [False, True])
def test_shuffle_visits_every_example_once_per_epoch(shared):
    n, B = 103, 10
    cfg = D.DPSGDConfig(epochs=1, batch_size=B, lr=0.1, clip=1.0, noise_multiplier=1.0)
    batches = D.sampling.Batches(cfg, n, philox.keys([0, 1], "cpu"), shared, torch.float32)
    steps = [batches.step(t) for t in range(2 * cfg.steps_per_epoch(n))]
    if shared:
        rows = [[w[k].nonzero()[:, 0] for _, w in steps] for k in range(2)]
    else:
        rows = [[idx[k] for idx, _ in steps] for k in range(2)]
    assert [len(r) for r in rows[0]] == ([10] * 10 + [3]) * 2
    for k in range(2):
        for epoch in (rows[k][:11], rows[k][11:]):
            assert sorted(torch.cat(epoch).tolist()) == list(range(n))
    assert not torch.equal(torch.sort(rows[0][0]).values, torch.sort(rows[0][11]).values)
    assert not torch.equal(torch.sort(rows[0][0]).values, torch.sort(rows[1][0]).values)


def test_shuffle_permutations_are_uniform():
    """Each run's epoch permutation: every row equally likely at every position (chi-square
    over 2,000 permutations of 5 rows: 25 cells), independent across epochs and runs."""
    n, runs = 5, 400
    cfg = D.DPSGDConfig(epochs=5, batch_size=1, lr=0.1, clip=1.0, noise_multiplier=1.0)
    batches = D.sampling.Batches(cfg, n, philox.keys(range(runs), "cpu"), False, torch.float32)
    perms = torch.cat([torch.stack([batches.step(e * n + s)[0][:, 0] for s in range(n)], 1)
                       for e in range(5)])  # (runs * epochs, n)
    table = torch.zeros(n, n)
    for pos in range(n):
        table[pos] = torch.bincount(perms[:, pos], minlength=n)
    assert stats.chisquare(table.reshape(-1).numpy()).pvalue > 1e-4
    ids = (perms * torch.tensor([1, 5, 25, 125, 625])).sum(1)  # all 120 orders occur
    assert len(set(ids.tolist())) == 120


@pytest.mark.parametrize("arch,sampling", [("lr", "shuffle"), ("fnn", "poisson")])
def test_learns_separable_toy_problem(arch, sampling):
    g = torch.Generator().manual_seed(4)
    n, d = 600, 20
    y = torch.randint(0, 2, (n,), generator=g)
    # Class means +-4.5 / sqrt(d) * (1, ..., 1): 4.5 standard deviations from the boundary.
    X = torch.randn(n, d, generator=g) + 4.5 * (2 * y[:, None] - 1) / math.sqrt(d)
    model = D.ModelSpec(arch, d)
    cfg = D.DPSGDConfig(epochs=5, batch_size=50, lr=0.5, clip=1.0, noise_multiplier=0.0,
                        sampling=sampling)
    params = D.train(X, y, model, cfg, [0, 1], device="cpu")
    acc = (D.logits(params, X, model).argmax(-1) == y).double().mean(1)
    assert (acc > 0.97).all(), acc


def test_glorot_init_matches_keras_glorot_normal():
    model = D.ModelSpec("fnn", 300, hidden=100, n_classes=2)
    p = D.init_params(model, 2, [0, 1], scale=2.0, dtype=F64, device="cpu")
    std = math.sqrt(2 / 400)  # variance 2 / (fan_in + fan_out)
    w = p.W[0].reshape(-1).numpy() / 2.0
    trunc = stats.truncnorm(-2, 2, scale=std / stats.truncnorm(-2, 2).std())
    assert stats.kstest(w, trunc.cdf).pvalue > 1e-3
    assert np.abs(w).max() <= trunc.ppf(1.0)
    assert torch.count_nonzero(p.b[0]) == 0
    one = D.init_params(model, 1, [1], scale=2.0, dtype=F64, device="cpu")
    assert torch.equal(one.W[1][0], p.W[1][1])


def test_glorot_init_is_the_trainers_init():
    X, y = torch.randn(20, 4), torch.randint(0, 2, (20,))
    model = D.ModelSpec("fnn", 4, hidden=3)
    cfg = D.DPSGDConfig(epochs=1, batch_size=20, lr=1e-30, clip=1.0, noise_multiplier=0.0,
                        init_scale=0.5)
    got = D.train(X, y, model, cfg, [5, 6], device="cpu")
    torch.testing.assert_close(_flat(got, 1),
                               _flat(D.init_params(model, 1, [6], 0.5, device="cpu"), 0))


def test_fixed_init_is_shared_and_round_trips(tmp_path):
    X, y, model, init = _problem("fnn", n=24)
    D.save_params(tmp_path / "init.pt", init, model)
    loaded, spec = D.load_params(tmp_path / "init.pt")
    assert spec == model and all(torch.equal(a, b) for a, b in zip(loaded.W, init.W))
    cfg = D.DPSGDConfig(epochs=2, batch_size=24, lr=0.1, clip=1.0, noise_multiplier=0.0,
                        init="fixed")
    out = D.train(X, y, model, cfg, [1, 2, 3], init=loaded, device="cpu")
    assert all(torch.equal(a, b) for a, b in zip(loaded.W + loaded.b, init.W + init.b))
    for k in (1, 2):  # same init, full batches, no noise: same model whatever the seed
        torch.testing.assert_close(_flat(out, k), _flat(out, 0), rtol=1e-12, atol=1e-12)
    assert out.select([2]).K == 1
    # The digest a restore key records: the named arrays' (as kept by older versions), the
    # same for the file's copy, another for other weights.
    from dpaudit.io import array_digest

    assert loaded.digest() == init.digest() == array_digest(
        {**{f"W{i}": w for i, w in enumerate(init.W)}, **{f"b{i}": b for i, b in
                                                          enumerate(init.b)}})
    assert out.select([0]).digest() != init.digest()


def test_losses_are_per_example_cross_entropy():
    X, y, model, init = _problem("fnn", n=10)
    module = _load(_module(model), init)
    ref = nn.functional.cross_entropy(module(X), y, reduction="none").detach()
    torch.testing.assert_close(D.losses(init, X, y, model)[0], ref)


@pytest.mark.parametrize("field,value", [("sampling", "uniform"), ("init", "he"), ("clip", 0),
                                         ("noise_multiplier", -1), ("epochs", 1.5)])
def test_config_validation_names_the_field(field, value):
    kw = dict(epochs=1, batch_size=10, lr=0.1, clip=1.0, noise_multiplier=1.0)
    kw[field] = value
    with pytest.raises(ValueError, match=field):
        D.DPSGDConfig(**kw)
    with pytest.raises(ValueError, match="arch"):
        D.ModelSpec("cnn", 3)


# --- Gradient canaries (white-box one-run audits) -------------------------------------------

def _canary_directions(kind, model, m, clip, seed=0):
    """m canary directions of norm ``clip``: Dirac (one coordinate each) or dense random."""
    if kind == "dirac":
        return D.dirac_canaries(model, m, clip, seed, dtype=F64, device="cpu")
    g = torch.Generator().manual_seed(seed)
    d = torch.randn(m, model.n_params, generator=g, dtype=F64)
    return d * (clip / torch.linalg.vector_norm(d, dim=1, keepdim=True))


def _clipped_grad_flat(module, x, t, clip):
    """clip_C of one example's gradient (torch.func), flattened in the trainer's layout."""
    params = {k: v.detach() for k, v in module.named_parameters()}

    def loss(p):
        out = torch.func.functional_call(module, p, (x[None],))
        return nn.functional.cross_entropy(out, t[None], reduction="sum")

    grads = torch.func.grad(loss)(params)
    # nn.Linear stores W^T: the trainer's W_l (fan_in, fan_out) row-major is weight.T.
    flat = torch.cat([(g.T if g.dim() == 2 else g).reshape(-1) for g in grads.values()])
    return flat * min(1.0, clip / float(torch.linalg.vector_norm(flat)))


@pytest.mark.parametrize("noise_std", [0.0, 0.7])
@pytest.mark.parametrize("kind", ["dirac", "dense"])
def test_canaries_enter_the_update_as_clipped_sum_terms(kind, noise_std):
    """Rate 1, one full-batch step: theta_1 = theta_1(no canaries) - lr/B sum_{j in} g_j, the
    noise (and batches) of each model unchanged by the canary stream."""
    X, y, model, init = _problem("fnn")
    n, lr, clip, m = len(X), 0.3, 1.0, 6
    cfg = D.DPSGDConfig(epochs=1, batch_size=n, lr=lr, clip=clip, noise_multiplier=0.0,
                        init="fixed")
    seeds = [3, 4, 5]
    dirs = _canary_directions(kind, model, m, clip)
    included = torch.tensor([[True] * m, [True, False] * (m // 2), [False] * m])
    canaries = D.GradientCanaries(dirs, included, rate=1.0)
    base = D.train_with_noise_std(X, y, model, cfg, seeds, noise_std, init=init, device="cpu")
    run = D.train_with_noise_std(X, y, model, cfg, seeds, noise_std, init=init, device="cpu",
                                 canaries=canaries)
    assert isinstance(run, D.CanaryRun) and isinstance(base, D.Params)
    want = D.flatten(base) - lr / n * included.to(F64) @ dirs
    torch.testing.assert_close(D.flatten(run.params), want, rtol=0, atol=1e-12)
    assert torch.equal(D.flatten(run.params)[2], D.flatten(base)[2])  # nothing included


def test_dirac_canaries_read_and_move_their_coordinates_in_place():
    """A Dirac canary's coordinates read from, and moved in, the layer tensors themselves
    (the trainer's first layer a transposed view): the same values as the flattened copy,
    and the same bits as a sub_ of a (K, P) tensor zero but at them (repeated coordinates
    summed), the other weights untouched."""
    from dpaudit.dpsgd.gradient_canaries import _Coordinates

    model = D.ModelSpec("fnn", 5, hidden=3)
    g = torch.Generator().manual_seed(0)
    K = 4
    W0 = torch.randn(K, 3, 5, generator=g).transpose(1, 2)  # strided, as the trainer's
    params = D.Params([W0, torch.randn(K, 3, 2, generator=g)],
                      [torch.randn(K, 3, generator=g), torch.randn(K, 2, generator=g)])
    assert not W0.is_contiguous() and D.flatten(params).shape == (K, model.n_params)
    coords = torch.tensor([14, 0, 16, 20, 25, 14])  # W_0's last, first; b_0; W_1; b_1; again
    at = _Coordinates(coords, params)
    flat = D.flatten(params)
    assert torch.equal(at.read(params), flat[:, coords].double())
    values = torch.randn(K, len(coords), generator=g)
    want = flat.clone().sub_(torch.zeros_like(flat).index_add_(1, coords, values), alpha=0.37)
    at.sub(params, values, 0.37)
    assert torch.equal(D.flatten(params), want)


def test_canary_equals_an_extra_clipped_example():
    """A canary equal to an extra example's clipped gradient at theta_0 moves one full-batch
    step exactly as that example does (same divisor: lr scaled by n / (n + 1))."""
    X, y, model, init = _problem("fnn", n=41)
    module = _load(_module(model), init)
    norms = D.grad_norms(init, X, y, model)[0]
    extra = int(norms.argmax())  # clipped: its contribution has norm exactly C
    clip, lr = 1.0, 0.3
    assert norms[extra] > 3 * clip
    rest = torch.arange(len(X)) != extra
    Xr, yr, n = X[rest], y[rest], int(rest.sum())
    g = _clipped_grad_flat(module, X[extra], y[extra], clip)
    torch.testing.assert_close(torch.linalg.vector_norm(g), torch.tensor(clip, dtype=F64))

    cfg_all = D.DPSGDConfig(epochs=1, batch_size=n + 1, lr=lr, clip=clip, noise_multiplier=0.0,
                            init="fixed")
    cfg_rest = D.DPSGDConfig(epochs=1, batch_size=n, lr=lr * n / (n + 1), clip=clip,
                             noise_multiplier=0.0, init="fixed")
    with_example = D.train(X, y, model, cfg_all, [0], init=init, device="cpu")
    with_canary = D.train(Xr, yr, model, cfg_rest, [0], init=init, device="cpu",
                          canaries=D.GradientCanaries(g[None], torch.ones(1, 1, dtype=torch.bool),
                                                      rate=1.0))
    without = D.train(Xr, yr, model, cfg_rest, [0], init=init, device="cpu")
    torch.testing.assert_close(D.flatten(with_canary.params), D.flatten(with_example),
                               rtol=0, atol=1e-12)
    assert not torch.allclose(D.flatten(without), D.flatten(with_example), rtol=0, atol=1e-4)


@pytest.mark.parametrize("kind", ["dirac", "dense"])
def test_all_iterates_scores_sum_the_steps(kind):
    """Noise 0, rate 1, full batches: scores = sum_t <theta_t - theta_{t+1}, g_j>, theta_t
    recorded by a reference loop (t steps = t epochs); = the last-iterate score."""
    X, y, model, init = _problem("fnn", n=30)
    clip, T, m = 1.0, 4, 8
    dirs = _canary_directions(kind, model, m, clip, seed=1)
    included = torch.tensor([[True, False] * (m // 2), [False, True] * (m // 2)])
    canaries = D.GradientCanaries(dirs, included, rate=1.0)
    seeds = [1, 2]

    def run(epochs):
        cfg = D.DPSGDConfig(epochs=epochs, batch_size=len(X), lr=0.2, clip=clip,
                            noise_multiplier=0.0, init="fixed")
        return D.train(X, y, model, cfg, seeds, init=init, device="cpu", canaries=canaries)

    thetas = [D.flatten(init).expand(2, -1)] + [D.flatten(run(t).params) for t in range(1, T + 1)]
    ref = sum((thetas[t] - thetas[t + 1]) @ dirs.T for t in range(T))
    got = run(T)
    assert got.scores.dtype == F64 and got.scores.shape == (2, m)
    torch.testing.assert_close(got.scores, ref, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(got.scores, D.last_iterate_scores(init, got.params, dirs),
                               rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("kind", ["dirac", "dense"])
def test_all_iterates_likelihood_ratio(kind):
    """llr = sum_t log(1 - q + q exp(mu z_t - mu^2/2)), z_t the step's inner product in noise
    units (lr / B * noise_std * C^2), mu = C / noise_std. At q = 1 every term is linear, so
    it telescopes to mu Z - T mu^2 / 2 with Z the last-iterate score in noise units; at
    q < 1 each term lies above both log(1 - q) and log q + mu z - mu^2 / 2. None without
    noise."""
    X, y, model, init = _problem("fnn", n=30)
    clip, T, m, sigma, lr = 1.0, 4, 8, 0.8, 0.2
    dirs = _canary_directions(kind, model, m, clip, seed=1)
    included = torch.tensor([[True, False] * (m // 2), [False, True] * (m // 2)])
    mu, unit = 1 / sigma, lr / len(X) * sigma * clip * clip

    def run(q, noise=sigma):
        cfg = D.DPSGDConfig(epochs=T, batch_size=len(X), lr=lr, clip=clip,
                            noise_multiplier=noise, init="fixed")
        return D.train(X, y, model, cfg, [1, 2], init=init, device="cpu",
                       canaries=D.GradientCanaries(dirs, included, rate=q))

    got = run(1.0)
    Z = D.last_iterate_scores(init, got.params, dirs) / unit
    torch.testing.assert_close(got.llr, mu * Z - T * mu ** 2 / 2, rtol=1e-5, atol=1e-4)
    got = run(0.3)
    Z = D.last_iterate_scores(init, got.params, dirs) / unit
    assert (got.llr >= T * math.log(0.7) - 1e-9).all()
    assert (got.llr >= T * math.log(0.3) + mu * Z - T * mu ** 2 / 2 - 1e-4).all()
    assert run(0.3, noise=0.0).llr is None


@pytest.mark.parametrize("kind", ["dirac", "dense"])
def test_scores_telescope_with_noise_poisson_and_several_chunks(kind):
    """Noise, Poisson sampling of data and canaries, 2 chunks of draws (float32): the summed
    step scores equal <theta_0 - theta_T, g_j> up to rounding."""
    g = torch.Generator().manual_seed(3)
    X, y = torch.randn(40, 6, generator=g), torch.randint(0, 2, (40,), generator=g)
    model = D.ModelSpec("fnn", 6, hidden=5)
    cfg = D.DPSGDConfig(epochs=20, batch_size=10, lr=0.2, clip=1.0, noise_multiplier=1.0,
                        sampling="poisson")
    assert cfg.steps(40) > cfg.chunk_steps(40)
    dirs = _canary_directions(kind, model, 10, 1.0).float()
    included = torch.rand(3, 10, generator=g) < 0.5
    run = D.train(X, y, model, cfg, [4, 5, 6], device="cpu",
                  canaries=D.GradientCanaries(dirs, included, rate=0.3))
    init = D.init_params(model, 3, [4, 5, 6], device="cpu")
    last = D.last_iterate_scores(init, run.params, dirs)
    torch.testing.assert_close(run.scores, last, rtol=1e-4, atol=1e-5)


def test_flatten_is_the_noise_layout():
    model = D.ModelSpec("fnn", 5, hidden=3, n_classes=4)
    params = D.init_params(model, 2, [0, 1], dtype=F64, device="cpu")
    flat = D.flatten(params)
    assert flat.shape == (2, model.n_params)
    for k in range(2):
        assert torch.equal(flat[k], _flat(params, k))
    views = D.model.noise_views(flat, params)
    assert all(torch.equal(v, t) for v, t in zip(views, layer_tensors(params)))
    dirac = D.dirac_canaries(model, 7, 2.5, 0, device="cpu")
    assert dirac.shape == (7, model.n_params) and (dirac.count_nonzero(1) == 1).all()
    coords = dirac.nonzero()[:, 1]
    assert len(set(coords.tolist())) == 7 and (coords < 5 * 3).all()  # first layer's W
    assert torch.equal(dirac.sum(1), torch.full((7,), 2.5))


@pytest.mark.parametrize("sampling", ["shuffle", "poisson"])
def test_canaries_none_or_excluded_leave_training_unchanged(sampling):
    X, y, model, cfg = _noisy_problem(sampling)
    seeds = [7, 8, 9]
    plain = D.train(X, y, model, cfg, seeds, device="cpu")
    none = D.train(X, y, model, cfg, seeds, device="cpu", canaries=None)
    assert isinstance(none, D.Params) and torch.equal(D.flatten(none), D.flatten(plain))
    dirs = D.dirac_canaries(model, 20, 1.0, 0, device="cpu")
    excluded = D.train(X, y, model, cfg, seeds, device="cpu",
                       canaries=D.GradientCanaries(dirs, torch.zeros(3, 20, dtype=torch.bool)))
    # Adding nothing changes no bit: the canary stream leaves batches and noise alone.
    assert torch.equal(D.flatten(excluded.params), D.flatten(plain))
    torch.testing.assert_close(
        excluded.scores,
        D.last_iterate_scores(D.init_params(model, 3, seeds, device="cpu"), plain, dirs),
        rtol=1e-4, atol=1e-6)


def test_included_dirac_canaries_score_higher():
    """Noise 0: included canaries score above excluded ones (each model: AUC >= 0.95; the
    data's gradients at a canary's coordinate can exceed a few canary insertions)."""
    g = torch.Generator().manual_seed(5)
    n, d, clip, B = 20, 10, 2.0, 5
    y = torch.randint(0, 2, (n,), generator=g)
    X = (torch.randn(n, d, generator=g) + (2 * y[:, None] - 1)).double()
    model = D.ModelSpec("fnn", d, hidden=8)
    cfg = D.DPSGDConfig(epochs=40, batch_size=B, lr=0.1, clip=clip, noise_multiplier=0.0,
                        sampling="poisson")
    K, m = 4, 40
    dirs = D.dirac_canaries(model, m, clip, 5, dtype=F64, device="cpu")
    included = torch.stack([torch.randperm(m, generator=g) < m // 2 for _ in range(K)])
    scores = D.train(X, y, model, cfg, [1, 2, 3, 4], device="cpu",
                     canaries=D.GradientCanaries(dirs, included)).scores
    for k in range(K):
        auc = stats.mannwhitneyu(scores[k][included[k]], scores[k][~included[k]]).statistic
        assert auc / (m // 2) ** 2 >= 0.95
    # Mean "in" score near lr C^2 / B * (expected sampled steps = epochs, rate B/n).
    assert 0.5 < scores[included].mean() / (cfg.lr * clip ** 2 / B * cfg.epochs) < 1.5


def test_canary_sampling_is_poisson_with_the_data_rate():
    """Canaries on weights of always-zero input features get no data gradient and do not
    change the forward pass: with noise 0 the score is lr C^2 / B * #steps sampled, an
    integer count, Binomial(T, q) when included (q = B/n by default), 0 when excluded;
    the draws depend on the model's seed, not on which canaries are included."""
    g = torch.Generator().manual_seed(6)
    n, d, hidden, B, clip = 50, 8, 6, 10, 1.5
    X = torch.randn(n, d, generator=g, dtype=F64)
    X[:, :5] = 0  # features 0..4: rows 0..4 of W_0 = coordinates 0 .. 5 * hidden - 1
    y = torch.randint(0, 2, (n,), generator=g)
    model = D.ModelSpec("fnn", d, hidden=hidden)
    cfg = D.DPSGDConfig(epochs=40, batch_size=B, lr=0.1, clip=clip, noise_multiplier=0.0,
                        sampling="poisson")
    m, T, q = 5 * hidden, cfg.steps(n), B / n
    dirs = D.dirac_canaries(model, m, clip, 0, candidates=range(5 * hidden), dtype=F64,
                            device="cpu")
    inc_a = torch.rand(3, m, generator=g) < 0.5
    inc_b = ~inc_a
    inc_b[:, 0] = inc_a[:, 0] = True
    counts = {}
    for name, inc in (("a", inc_a), ("b", inc_b)):
        s = D.train(X, y, model, cfg, [1, 2, 3], device="cpu",
                    canaries=D.GradientCanaries(dirs, inc)).scores / (cfg.lr * clip ** 2 / B)
        counts[name] = s.round()
        torch.testing.assert_close(s, counts[name], rtol=0, atol=1e-9)
        assert (counts[name][~inc] == 0).all()
    both = inc_a & inc_b
    assert torch.equal(counts["a"][both], counts["b"][both])
    c = torch.where(inc_a, counts["a"], counts["b"])  # every (model, canary) once
    assert abs(c.mean() - T * q) < 5 * math.sqrt(T * q * (1 - q) / c.numel())
    assert stats.chi2.sf((c.numel() - 1) * c.var() / (T * q * (1 - q)), c.numel() - 1) > 1e-4
    assert not torch.equal(c[0], c[1])  # each model its own draws
    s1 = D.train(X, y, model, cfg, [1], device="cpu",
                 canaries=D.GradientCanaries(dirs, inc_a[:1], rate=1.0)).scores
    torch.testing.assert_close(s1[inc_a[:1]], torch.full_like(s1[inc_a[:1]],
                                                              T * cfg.lr * clip ** 2 / B))


def test_canary_validation_names_the_argument():
    X, y, model, init = _problem("fnn", n=10)
    cfg = D.DPSGDConfig(epochs=1, batch_size=5, lr=0.1, clip=1.0, noise_multiplier=1.0)
    P, inc = model.n_params, torch.ones(2, 3, dtype=torch.bool)
    good = D.dirac_canaries(model, 3, 1.0, 0, dtype=F64, device="cpu")
    for bad, field in [
        (lambda: D.GradientCanaries(good[0], inc), "canaries.directions"),
        (lambda: D.GradientCanaries(good.long(), inc), "canaries.directions"),
        (lambda: D.GradientCanaries(good, inc.float()), "canaries.included"),
        (lambda: D.GradientCanaries(good, inc[:, :2]), "canaries.included"),
        (lambda: D.GradientCanaries(good, inc, rate=0.0), "canaries.rate"),
        (lambda: D.GradientCanaries(good, inc, rate=1.5), "canaries.rate"),
    ]:
        with pytest.raises(ValueError, match=field):
            bad()
    for canaries, field in [
        (D.GradientCanaries(good[:, :-1], inc), "canaries.directions"),  # wrong P
        (D.GradientCanaries(good * 1.001, inc), "canaries.directions"),  # norm != C
        (D.GradientCanaries(good * float("nan"), inc), "canaries.directions"),
        (D.GradientCanaries(good, inc[:1]), "canaries.included"),  # K rows
        ((good, inc), "canaries"),
    ]:
        with pytest.raises(ValueError, match=field):
            D.train(X, y, model, cfg, [1, 2], device="cpu", canaries=canaries)
    D.train(X, y, model, cfg, [1, 2], device="cpu",
            canaries=D.GradientCanaries(good * (1 + 1e-7), inc))  # within 1e-5
    with pytest.raises(ValueError, match="m=0"):
        D.dirac_canaries(model, 0, 1.0, 0, device="cpu")
    with pytest.raises(ValueError, match="m=31"):
        D.dirac_canaries(model, 31, 1.0, 0, candidates=range(30), device="cpu")
    with pytest.raises(ValueError, match="candidates"):
        D.dirac_canaries(model, 1, 1.0, 0, candidates=[P], device="cpu")


def _columns(arch, sampling):
    X, y, model, init = _problem(arch, n=30)
    base = dict(epochs=3, batch_size=7, lr=0.4, sampling=sampling)
    cols = [D.DPSGDConfig(clip=0.5, noise_multiplier=1.3, **base),
            D.DPSGDConfig(clip=2.0, noise_multiplier=0.0, init_scale=0.5, **base),
            D.DPSGDConfig(clip=1.0, noise_multiplier=0.4, init="fixed", **base),
            D.DPSGDConfig(clip=3.0, noise_multiplier=2.0, init="fixed", **base)]
    return X, y, model, init, cols


@pytest.mark.parametrize("sampling", ["shuffle", "poisson"])
@pytest.mark.parametrize("arch", ["lr", "lr2", "fnn"])
def test_columns_are_the_models_each_config_trains_alone(arch, sampling):
    """One wide call of four columns (clips, noise, Glorot scales and the fixed init mixed)
    gives, column by column, the models a call with that column's config alone trains."""
    X, y, model, init, cols = _columns(arch, sampling)
    seeds = [3, 11, 12]
    wide = D.train(X, y, model, cols, seeds, init=init, device="cpu")
    assert len(wide) == len(cols)
    for cfg, got in zip(cols, wide):
        alone = D.train(X, y, model, cfg, seeds, init=init if cfg.init == "fixed" else None,
                        device="cpu")
        assert got.W[0].shape == (3, *model.shapes[0]) and got.W[0].is_contiguous()
        for a, b in zip(layer_tensors(got), layer_tensors(alone)):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_explicit_noise_stds_per_column():
    X, y, model, init, cols = _columns("fnn", "shuffle")
    got = D.train_with_noise_std(X, y, model, cols[:2], [4], [0.3, 0.0], device="cpu")
    for cfg, std, p in zip(cols[:2], [0.3, 0.0], got):
        alone = D.train_with_noise_std(X, y, model, cfg, [4], std, device="cpu")
        torch.testing.assert_close(_flat(p, 0), _flat(alone, 0), rtol=1e-10, atol=1e-12)


def test_columns_must_share_the_batches():
    X, y, model, init, cols = _columns("lr", "shuffle")
    other = D.DPSGDConfig(epochs=3, batch_size=8, lr=0.4, clip=1.0, noise_multiplier=0.0)
    with pytest.raises(ValueError, match=r"same batch_size .* column 1 has 8"):
        D.train(X, y, model, [cols[0], other], [1], device="cpu")
    with pytest.raises(ValueError, match="one column at a time with gradient canaries"):
        dirs = D.dirac_canaries(model, 2, 0.5, 0, dtype=F64, device="cpu")
        D.train(X, y, model, cols[:2], [1], device="cpu",
                canaries=D.GradientCanaries(dirs, torch.ones(1, 2, dtype=torch.bool)))
    with pytest.raises(ValueError, match="2 noise stds for 1 columns"):
        D.train_with_noise_std(X, y, model, [cols[0]], [1], [0.1, 0.2], device="cpu")


def test_seeds_per_call_and_step_bytes():
    model = D.ModelSpec("fnn", 784, hidden=32)
    cfg = D.DPSGDConfig(epochs=24, batch_size=250, lr=0.15, clip=1.0, noise_multiplier=1.0)
    assert D.seeds_per_call(model, 6000, cfg, 1, "cpu") == 128
    assert D.seeds_per_call(model, 6000, cfg, 72, "cpu") == 2
    assert D.seeds_per_call(model, 6000, cfg, 1, "cpu", limit=10) == 10
    # A step's noise draw (24 bytes per parameter unfused) + an epoch's permutation (keys,
    # argsort, ranks: 56 bytes per row) + weights + the gathered batch (b = 250 rows of
    # indices and features) with its activations: grows by ~P*8 + activations per column
    P = model.n_params
    one, many = (D.step_bytes(model, 6000, cfg, m) for m in (1, 72))
    assert not D.sampling.shares_data(model, cfg, 6000, 1)
    assert one == 24 * P + 56 * 6000 + 8 * P + 250 * (8 + 4 * (784 + 6 * 34))
    assert many - one == 71 * (8 * P + 4 * 250 * 6 * 34)
    # Full batches share the data: no draw, every row's activations and weights
    full = D.DPSGDConfig(epochs=24, batch_size=6000, lr=0.15, clip=1.0, noise_multiplier=1.0)
    assert D.step_bytes(model, 6000, full, 1) == 24 * P + 8 * P + 6000 * 4 * (1 + 6 * 34)


def test_seeds_per_call_shares_half_the_card_between_its_jobs():
    """CUDA (a forced H100 description, on the CPU): half the card's memory split between
    jobs_per_gpu jobs, at most 90% of what is free, by step_bytes; the CPU ignores the
    sharing."""
    model = D.ModelSpec("fnn", 784, hidden=32)
    cfg = D.DPSGDConfig(epochs=24, batch_size=250, lr=0.15, clip=1.0, noise_multiplier=1.0)
    per_seed = D.step_bytes(model, 6000, cfg, 6)
    with device.forced_gpu(_h100()):
        for jobs in (1, 2, 4):
            want = 40 * 2**30 // jobs // per_seed
            assert D.seeds_per_call(model, 6000, cfg, 6, "cuda", 10**6, jobs) == want
        assert D.seeds_per_call(model, 6000, cfg, 6, "cuda", 100, 4) == 100
    with device.forced_gpu(_h100(free=2**30)):  # other processes hold the rest: 90% of it
        assert D.seeds_per_call(model, 6000, cfg, 6, "cuda", 10**6, 1) == \
            int(0.9 * 2**30) // per_seed
    assert D.seeds_per_call(model, 6000, cfg, 6, "cpu", 10**6, 4) == math.ceil(128 / 6)
    with pytest.raises(ValueError, match="jobs_per_gpu=0: must be an integer >= 1"):
        D.seeds_per_call(model, 6000, cfg, 6, "cpu", jobs_per_gpu=0)


def test_seeds_per_block_does_not_follow_the_free_memory():
    """A kept block's size fixes the store's layout: on the CPU one call's worth, on CUDA
    (a forced H100 description) GPU_BLOCK whatever is free, though a call's width there
    follows the free memory."""
    model = D.ModelSpec("fnn", 784, hidden=32)
    cfg = D.DPSGDConfig(epochs=24, batch_size=250, lr=0.15, clip=1.0, noise_multiplier=1.0)
    for columns, limit in ((1, 4096), (2, 4096), (72, 4096), (1, 10)):
        assert D.seeds_per_block(columns, "cpu", limit) == \
            D.seeds_per_call(model, 6000, cfg, columns, "cpu", limit)
    widths = []
    for free in (80 * 2**30, 2**20):
        with device.forced_gpu(_h100(free)):
            assert D.seeds_per_block(1, "cuda", 10**6) == D.memory.GPU_BLOCK == 1024
            assert D.seeds_per_block(2, "cuda", 300) == 300
            widths.append(D.seeds_per_call(model, 6000, cfg, 1, "cuda", 10**6))
    per_seed = D.step_bytes(model, 6000, cfg, 1)
    assert widths == [40 * 2**30 // per_seed, max(1, int(0.9 * 2**20) // per_seed)]


def _tf32_round(t: torch.Tensor, mode: str) -> torch.Tensor:
    """float32 values rounded to TF32's 10 fraction bits: toward zero, or to nearest with
    ties away from zero (the two roundings a TF32 tensor core may apply to its inputs)."""
    bits = t.to(torch.float32).contiguous().view(torch.int32)
    if mode == "nearest":
        bits = bits + 0x1000
    return (bits & ~0x1FFF).view(torch.float32).double()


@pytest.mark.parametrize("mode", ["zero", "nearest"])
def test_tf32_clip_margin_keeps_every_examples_contribution_within_the_clip(mode):
    """The wide step's clip-and-sum with TF32 products, simulated in float64: each layer's
    weight part of example i is (round a_i) (round c_i g_i)^T, its bias part c_i g_i in
    float32. Clipping to C, some examples add more than C (inputs on a rounding tie are
    rounded up by 2^-11); clipping to C / (1 + 2^-10)^2, as the trainer does under TF32,
    none does, whichever rounding the tensor cores apply."""
    g = torch.Generator().manual_seed(4)
    n, d, C = 400, 64, 1.0
    # entries exactly halfway between two TF32 values: the worst case of rounding up
    X = (1 + 2.0 ** -11) * 2.0 ** torch.randint(-2, 3, (n, d), generator=g).float()
    X = X * torch.sign(torch.randn(n, d, generator=g))
    y = torch.randint(0, 2, (n,), generator=g)
    model = D.ModelSpec("fnn", d, hidden=16)
    params = D.init_params(model, 2, [3, 4], scale=4.0, device="cpu")
    wide = D.wide.Wide.of(params)
    xb = X.expand(2, -1, -1)
    acts, z = D.wide._forward(wide, xb)
    onehot = torch.nn.functional.one_hot(y, 2).float().T.expand(2, -1, -1)
    gs = D.wide._backprop(wide, acts, z, onehot)
    sq = D.wide._sq_grad_norms(acts, gs, xb.square().sum(-1) + 1)
    cpu = torch.device("cpu")

    def largest(clip):
        c = torch.div(torch.tensor([[clip]]), sq.sqrt()).clamp(max=1.0)  # as _train
        total = 0
        for l, (a, gl) in enumerate(zip(acts, gs)):
            cg = gl * c.unsqueeze(2)  # (K, M, fan_out, b), float32 as the trainer forms it
            a = a.unsqueeze(1) if l == 0 else a  # (K, 1 or M, fan_in, b)
            weight = _tf32_round(a, mode).square().sum(2) * _tf32_round(cg, mode).square().sum(2)
            total = total + weight + cg.double().square().sum(2)
        assert float((c < 1).float().mean()) > 0.3  # many clipped: each of them adds ~C
        return float(total.sqrt().max())

    with device.forced_gpu(_h100()), D.matmul_precision("tf32"):  # TF32's branch, on the CPU
        margin = D.precision.clip_scale(cpu)
    assert margin == (1 + 2.0 ** -10) ** -2
    assert largest(C * margin) <= C * (1 + 1e-6)  # float32 rounding of the norms only
    if mode == "nearest":
        assert largest(C) > C * (1 + 2.0 ** -12)


def test_matmul_precision_scope_margin_and_refusals():
    """matmul_precision names one of fp32/tf32 and is restored on exit; the CPU has no TF32
    (the same models as fp32); where TF32 is on (a forced H100 description: its branch on
    the CPU), the trainer clips to C / (1 + 2^-10)^2 with the noise of C unchanged, and
    refuses gradient canaries."""
    X, y, model, cfg = _noisy_problem("shuffle")
    with pytest.raises(ValueError, match=r"matmul_precision='bf16': must be one of \('fp32',"):
        with D.matmul_precision("bf16"):
            pass
    fp32 = D.train(X, y, model, cfg, [1, 2], device="cpu")
    with D.matmul_precision("tf32"):
        assert D.precision._PRECISION.get() == "tf32"
        assert not D.precision.uses_tf32(torch.device("cpu"))
        same = D.train(X, y, model, cfg, [1, 2], device="cpu")
    assert D.precision._PRECISION.get() == "fp32"
    assert all(torch.equal(a, b) for a, b in zip(layer_tensors(fp32), layer_tensors(same)))
    with device.forced_gpu(_h100()), D.matmul_precision("tf32"):  # as on CUDA under TF32
        assert D.precision.uses_tf32(torch.device("cpu"))
        tf32 = D.train(X, y, model, cfg, [1, 2], device="cuda")
        dirs = D.dirac_canaries(model, 2, cfg.clip, 0, device="cuda")
        with pytest.raises(ValueError, match=r"canaries: train with matmul_precision\('fp32'\)"):
            D.train(X, y, model, cfg, [1], device="cuda",
                    canaries=D.GradientCanaries(dirs, torch.ones(1, 2, dtype=torch.bool)))
    # fp32 at the lowered clip with C's noise, drawn as the forced GPU draws (fused)
    lower = D.DPSGDConfig(**{**vars(cfg), "clip": cfg.clip * (1 + 2.0 ** -10) ** -2})
    with device.forced_gpu(_h100()):
        want = D.train_with_noise_std(X, y, model, lower, [1, 2],
                                      cfg.noise_multiplier * cfg.clip, device="cuda")
    assert all(torch.equal(a, b) for a, b in zip(layer_tensors(tf32), layer_tensors(want)))
    assert not torch.equal(_flat(tf32, 0), _flat(fp32, 0))


# --- Shared data, constant work per step ----------------------------------------------------

def _forced_data(monkeypatch, shared: bool) -> None:
    monkeypatch.setattr(D.sampling, "shares_data", lambda *args: shared)


@pytest.mark.parametrize("sampling", ["shuffle", "poisson", "full"])
@pytest.mark.parametrize("arch", ["lr", "lr2", "fnn"])
def test_shared_step_equals_the_gathered_step(arch, sampling, monkeypatch):
    """Every row computed once for all runs, each run's batch as 0/1 weights on its clip
    factors: the models the gathered batches train (same seeds: same batches and noise),
    every column, to float64 rounding; with gradient canaries, the same scores."""
    X, y, model, init, cols = _columns(arch, "shuffle" if sampling == "full" else sampling)
    if sampling == "full":
        cols = [D.DPSGDConfig(**{**vars(c), "batch_size": len(X)}) for c in cols]
    seeds = [3, 11, 12]
    dirs = D.dirac_canaries(model, 4, cols[0].clip, 0, dtype=F64, device="cpu")
    canaries = D.GradientCanaries(dirs, torch.tensor([[True, False, True, True]] * 3),
                                  rate=0.5)
    got = {}
    for shared in (False, True):
        _forced_data(monkeypatch, shared)
        got[shared] = (D.train(X, y, model, cols, seeds, init=init, device="cpu"),
                       D.train(X, y, model, cols[0], seeds, device="cpu", canaries=canaries))
    for a, b in zip(got[False][0], got[True][0]):
        torch.testing.assert_close(D.flatten(a), D.flatten(b), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(D.flatten(got[False][1].params), D.flatten(got[True][1].params),
                               rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got[False][1].scores, got[True][1].scores, rtol=1e-9, atol=1e-12)
    assert not torch.allclose(D.flatten(got[True][0][0]), D.flatten(got[True][0][2]))


def test_the_cost_rule_shares_the_data_where_the_copy_costs_more():
    """n F <= b (F + 8 bytes x 8 d): full batches and Tramer et al.'s audit (n = 501, b =
    100, 784 -> 2, two subjects as columns) share; the Jagielski grid (n = 6000, b = 250,
    784 -> 32 -> 2) gathers, one column or 72."""
    lr, fnn = D.ModelSpec("lr", 784), D.ModelSpec("fnn", 784, hidden=32)
    F = D.sampling.step_flops(lr, 2)
    assert F == 2 * 4 * 785 * 2
    assert D.sampling.step_flops(fnn, 1) == 4 * 785 * 32 + 6 * 33 * 2
    tramer = D.DPSGDConfig(20, 100, 50.0, 0.1, 1.0, "poisson")
    rate = D.sampling.FLOPS_PER_BYTE
    largest = int(100 * (F + rate * 8 * 784) / F)  # the most rows that still share
    assert 501 <= largest < 2000
    assert D.sampling.shares_data(lr, tramer, 501, 2)
    assert D.sampling.shares_data(lr, tramer, largest, 2)
    assert not D.sampling.shares_data(lr, tramer, largest + 1, 2)
    grid = D.DPSGDConfig(24, 250, 0.15, 1.0, 1.0)
    for columns in (1, 72):
        assert not D.sampling.shares_data(fnn, grid, 6000, columns)
    full = D.DPSGDConfig(100, 1000, 0.1, 1.0, 1.0)
    assert D.sampling.shares_data(fnn, full, 1000, 2) and D.sampling.full_batch(full, 1000)


#: torch operations that launch no computation: allocations and views.
_NO_KERNEL = {"empty", "empty_like", "empty_strided", "view", "reshape", "_reshape_alias",
              "as_strided", "expand", "select", "slice", "transpose", "unsqueeze", "squeeze",
              "t", "permute", "detach", "alias", "unflatten", "flatten", "_unsafe_view",
              "lift_fresh", "resolve_conj", "resolve_neg", "numpy_T", "split", "narrow"}


def _ops_per_call(X, y, model, cfg, K, canaries=False):
    """aten operations that compute, launched by one training call of K seeds
    (torch.profiler; allocations and views left out)."""
    from torch.profiler import ProfilerActivity, profile

    kw = {}
    if canaries:
        dirs = D.dirac_canaries(model, 3, cfg.clip, 0, device="cpu")
        kw["canaries"] = D.GradientCanaries(dirs, torch.ones(K, 3, dtype=torch.bool))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        D.train(X, y, model, cfg, list(range(K)), device="cpu", **kw)
    return sum(1 for e in prof.events()
               if e.name.startswith("aten::") and e.name[6:] not in _NO_KERNEL)


@pytest.mark.parametrize("sampling,batch", [("poisson", 10), ("shuffle", 10), ("shuffle", 60)])
@pytest.mark.parametrize("shared", [False, True])
def test_operations_per_call_do_not_depend_on_the_runs(sampling, batch, shared, monkeypatch):
    """No loop over runs: the same operations are launched for 1 or 16 runs (noise,
    batches, canaries, the step), whichever form the step takes."""
    _forced_data(monkeypatch, shared)
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(60, 5, generator=g), torch.randint(0, 2, (60,), generator=g)
    model = D.ModelSpec("fnn", 5, hidden=4)
    cfg = D.DPSGDConfig(epochs=2, batch_size=batch, lr=0.1, clip=1.0, noise_multiplier=1.0,
                        sampling=sampling)
    for canaries in (False, True):
        counts = {K: _ops_per_call(X, y, model, cfg, K, canaries) for K in (1, 16)}
        assert len(set(counts.values())) == 1, counts


def test_a_shared_step_run_beside_others_is_the_run_alone_to_float_rounding():
    """Data shared by all runs: one product over the call's runs, which the BLAS blocks by
    its size, so the runs beside a run change its bits (784 features), not its model: the
    same to float rounding over 20 steps, whatever the others and their order."""
    g = torch.Generator().manual_seed(7)
    X, y = torch.rand(300, 784, generator=g), torch.randint(0, 2, (300,), generator=g)
    model = D.ModelSpec("lr", 784)
    cfg = D.DPSGDConfig(20, 60, 0.5, 1.0, 1.0, "poisson")
    assert D.sampling.shares_data(model, cfg, 300, 1)
    alone = D.train(X, y, model, cfg, [7], device="cpu")
    for seeds, k in (([1, 2, 7, 3, 4], 2), ([7] + list(range(100, 130)), 0)):
        beside = D.train(X, y, model, cfg, seeds, device="cpu")
        torch.testing.assert_close(D.flatten(beside)[k], D.flatten(alone)[0], rtol=1e-5,
                                   atol=1e-6)
