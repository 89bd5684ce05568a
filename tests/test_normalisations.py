"""The trainer's normalisations (DPSGDConfig.normalisation; "Rethinking the Security of
DP-SGD", 2026): what one step divides the noisy clipped sum by, against a closed form
computed with autograd, and the ``easgm`` / ``asgm`` subjects."""

from __future__ import annotations

import pytest
import torch

from dpaudit import dpsgd as D, subjects
from dpaudit.dpsgd import philox, sampling
from dpaudit.dpsgd.spec import floored_expected_batch

F64 = torch.float64
MODEL = D.ModelSpec("fnn", 4, 3, 2)


def _data(n):
    g = torch.Generator().manual_seed(1)
    X = torch.randn(n, 4, generator=g, dtype=F64) * 3  # norms above the clip
    return X, torch.randint(0, 2, (n,), generator=g)


def _clipped_sum(init, X, y, rows, clip):
    """sum over ``rows`` of each example's gradient (autograd), clipped to ``clip``."""
    total = [torch.zeros_like(t[0]) for t in (*init.W, *init.b)]
    for i in rows.tolist():
        ts = [t[0].clone().requires_grad_() for t in (*init.W, *init.b)]
        W, b = ts[:len(init.W)], ts[len(init.W):]
        h = X[i:i + 1] @ W[0] + b[0]
        z = torch.relu(h) @ W[1] + b[1]
        loss = torch.nn.functional.cross_entropy(z, y[i:i + 1])
        gs = torch.autograd.grad(loss, ts)
        norm = torch.sqrt(sum(g.square().sum() for g in gs))
        for t, g in zip(total, gs):
            t += g * min(1.0, clip / float(norm))
    return total


@pytest.mark.parametrize("n, B", [(10, 5), (11, 5), (23, 4)])
@pytest.mark.parametrize("normalisation", ["sgm", "easgm", "asgm"])
def test_one_noiseless_step_divides_the_clipped_sum_by_the_normaliser(normalisation, n, B):
    """theta_0 - theta_1 = lr / divisor * (sum of the batch's clipped gradients): divisor B
    (sgm), int(n * (1 / ceil(n / B))) (easgm), the sampled batch's size (asgm)."""
    X, y = _data(n)
    seed, lr, clip = 7, 0.5, 0.3
    cfg = D.DPSGDConfig(B / n, B, lr, clip, 0.0, "poisson", "fixed",
                        normalisation=normalisation)
    assert cfg.steps(n) == 1
    init = D.init_params(MODEL, 1, 3, device="cpu", dtype=F64)
    out = D.train(X, y, MODEL, cfg, [seed], init=init, device="cpu")
    idx, valid = sampling.Batches(cfg, n, philox.keys([seed], "cpu"), False, F64).step(0)
    rows = idx[0][valid[0] > 0]
    divisor = {"sgm": B, "easgm": int(n * (1 / -(-n // B))), "asgm": max(1, len(rows))}
    want = _clipped_sum(init, X, y, rows, clip)
    for t0, t1, w in zip((*init.W, *init.b), (*out.W, *out.b), want):
        torch.testing.assert_close(t0[0] - t1[0], lr / divisor[normalisation] * w,
                                   rtol=1e-10, atol=1e-12)


def test_asgm_divides_the_noise_by_the_sampled_size_too():
    """The same seed with and without noise: the noise's part of the update is that of
    sgm times B / the batch's size, run by run."""
    n, B, seeds = 12, 4, [1, 2, 3, 4, 5]
    X, y = _data(n)
    init = D.init_params(MODEL, 1, 3, device="cpu", dtype=F64)

    def noise_part(normalisation):
        cfgs = [D.DPSGDConfig(B / n, B, 0.5, 1.0, s, "poisson", "fixed",
                              normalisation=normalisation) for s in (0.0, 2.0)]
        a, b = (D.flatten(D.train(X, y, MODEL, c, seeds, init=init, device="cpu"))
                for c in cfgs)
        return b - a

    sizes = sampling.Batches(D.DPSGDConfig(B / n, B, 0.5, 1.0, 0.0, "poisson"), n,
                             philox.keys(seeds, "cpu"), False, F64).step(0)[1].sum(1)
    ratio = (B / sizes.clamp(min=1)).unsqueeze(1)
    torch.testing.assert_close(noise_part("asgm"), noise_part("sgm") * ratio, rtol=1e-9,
                               atol=1e-12)


def test_the_floored_expected_batch_is_opacus_make_private_s():
    """Opacus' own make_private on n rows and DataLoader(batch_size=B): its optimizer's
    expected_batch_size (the notes' 499, 500, 501 at B = 100: 99, 100, 83)."""
    opacus = pytest.importorskip("opacus")
    import warnings

    for n, B in [(499, 100), (500, 100), (501, 100), (10, 5), (11, 5), (21, 5), (7, 3)]:
        model = torch.nn.Linear(2, 2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, opt, _ = opacus.PrivacyEngine().make_private(
                module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                data_loader=torch.utils.data.DataLoader(
                    torch.utils.data.TensorDataset(torch.zeros(n, 2)), batch_size=B),
                noise_multiplier=1.0, max_grad_norm=1.0)
        assert floored_expected_batch(n, B) == opt.expected_batch_size, (n, B)
    assert [floored_expected_batch(n, 100) for n in (499, 500, 501)] == [99, 100, 83]


def test_the_normalisation_subjects_differ_from_fixed_only_in_the_divisor():
    """One step on 10 and 11 rows at B = 5: easgm's update is fixed's times 5 / 5 and 5 / 3
    (its divisor 5 on 10 rows, 3 on 11), noise included; asgm trains no gradient canary."""
    spec = {"epochs": 0.5, "batch_size": 5, "lr": 0.5, "clip": 1.0, "eps": 4.0, "delta": 1e-5,
            "n": 10, "device": "cpu", "arch": "lr"}
    for rows, factor in ((10, 1.0), (11, 5 / 3)):
        X, y = _data(rows)
        X, init = X.float(), D.init_params(subjects.model_spec(spec, 4, 2), 1, 0, device="cpu")
        got, ref = (fn(X, y, [3, 4], spec, init=init)(X) for fn in
                    (subjects.dpsgd_easgm, subjects.dpsgd_fixed))
        z0 = D.logits(D.Params([init.W[0]], [init.b[0]]), X, subjects.model_spec(spec, 4, 2))
        torch.testing.assert_close(got - z0, (ref - z0) * factor, rtol=1e-4, atol=1e-5)
    assert subjects.train_columns([subjects.dpsgd_easgm, subjects.dpsgd_fixed], X, y, [1],
                                  spec) is None  # different divisors: no shared columns
    with pytest.raises(ValueError, match="normalisation 'asgm'"):
        subjects.dpsgd_asgm(X, y, [1], spec, canaries=D.GradientCanaries(
            torch.eye(1, 10), torch.ones(1, 1, dtype=torch.bool)))
    for name in ("easgm", "asgm"):
        with pytest.raises(ValueError, match="is not known"):
            subjects.true_eps(name, spec, 10)
