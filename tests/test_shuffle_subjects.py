"""The shuffled subjects of `audit-impl` (`shuffle`, `shuffle-once`): their batches, their
Poisson-calibrated noise, the gradient canary inserted as shuffling treats an example (once
per epoch), its likelihood ratio, and the audit at tiny scale in every mode."""

import json
import logging
import math

import numpy as np
import pytest
import torch
from scipy import stats

from dpaudit import accounting, canaries, dpsgd as D, shuffle_accounting, subjects
from dpaudit.cli import main
from dpaudit.dpsgd import philox, sampling
from dpaudit.dpsgd.gradient_canaries import CanaryHook
from dpaudit.experiments import tramer
from dpaudit.io import read_table

logging.getLogger("absl").setLevel(logging.ERROR)
F64 = torch.float64

N, D_IN, EPS, DELTA, ALPHA = 200, 20, 1.0, 1e-5, 0.05
# q = 0.1: 10 steps per epoch, 2 epochs, T = 20
SPEC = {"epochs": 2, "batch_size": 20, "lr": 0.5, "clip": 1.0, "eps": EPS, "delta": DELTA,
        "n": N, "device": "cpu"}


def _data(n=N):
    g = torch.Generator().manual_seed(0)
    X = torch.rand(n, D_IN, generator=g)
    X[:, :5] = 0  # features the data never uses: where the Dirac canary goes
    w = torch.randn(D_IN, generator=g)
    return X, (X @ w > (X @ w).median()).long()


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("how", ["shuffle", "shuffle-once"])
def test_shuffled_batches_hold_every_example_once_per_epoch(how, shared):
    """Batches of B (the last n mod B) that partition the n rows each epoch, in both
    forms; "shuffle-once" cuts epoch 0's permutation (the one "shuffle" draws first) every
    epoch, "shuffle" draws a new one each epoch."""
    n, B, E, K = 23, 5, 3, 4
    key = philox.keys([1, 2, 3, 2 ** 40], "cpu")
    perms = {}
    for mode in ("shuffle", "shuffle-once"):
        cfg = D.DPSGDConfig(epochs=E, batch_size=B, lr=1.0, clip=1.0, noise_multiplier=0.0,
                            sampling=mode)
        batches = sampling.Batches(cfg, n, key, shared, F64)
        spe = cfg.steps_per_epoch(n)
        assert cfg.steps(n) == E * spe == 15 and sampling.epoch_ends(cfg, n) == [5, 10, 15]
        order = []
        for t in range(cfg.steps(n)):
            idx, w = batches.step(t)
            if shared:  # (K, n) 0/1 weights -> each run's rows
                rows = [torch.nonzero(w[k]).flatten() for k in range(K)]
            else:
                assert w is None
                rows = list(idx)
            size = min(B, n - (t % spe) * B)
            assert all(len(r) == size for r in rows)
            order.append(rows)
        per_epoch = []
        for e in range(E):
            got = [torch.cat([order[e * spe + s][k] for s in range(spe)]) for k in range(K)]
            for k in range(K):
                assert sorted(got[k].tolist()) == list(range(n))
            # batch membership per epoch (the order within a batch may differ by form)
            per_epoch.append([[sorted(order[e * spe + s][k].tolist()) for s in range(spe)]
                              for k in range(K)])
        perms[mode] = per_epoch
    assert perms["shuffle"][0] == perms["shuffle-once"][0]
    assert all(p == perms["shuffle-once"][0] for p in perms["shuffle-once"])
    assert perms["shuffle"][1] != perms["shuffle"][0] != perms["shuffle"][2]


def test_the_shuffled_subjects_train_shuffled_batches_at_the_poisson_calibrated_noise(
        monkeypatch):
    """What each subject hands the trainer: its sampling, batch size B and the noise std
    sigma C with sigma from the Poisson accountant (rdp) at q = B / n, T = epochs / q:
    the same as `fixed`, whose batches are Poisson."""
    sigma = accounting.noise_multiplier(EPS, 0.1, 20, DELTA, "rdp")
    seen = {}

    def capture(X, y, model, cfg, seeds, noise_std, **kw):
        seen["cfg"], seen["std"] = cfg, noise_std
        return D.init_params(model, len(seeds), 0, device="cpu")

    monkeypatch.setattr(subjects.dpsgd, "train_with_noise_std", capture)
    X, y = _data()
    for name, want in (("shuffle", "shuffle"), ("shuffle-once", "shuffle-once"),
                       ("fixed", "poisson")):
        subjects.SUBJECTS[name](X, y, [1, 2], SPEC)
        assert seen["cfg"].sampling == want and seen["cfg"].batch_size == 20
        assert seen["std"] == pytest.approx(sigma * SPEC["clip"], rel=1e-9)
        assert seen["cfg"].steps(N) == 20
    with pytest.raises(ValueError, match="'shuffle'.*not known"):
        subjects.true_eps("shuffle", SPEC, N)
    # Columns share batches: a shuffled subject is never a column beside a Poisson one.
    assert subjects.train_columns([subjects.SUBJECTS["shuffle"], subjects.SUBJECTS["fixed"]],
                                  X, y, [1], SPEC) is None


def _quiet_problem(sampling_name, n=10, B=4, epochs=3):
    g = torch.Generator().manual_seed(6)
    d, clip = 6, 1.5
    X = torch.randn(n, d, generator=g, dtype=F64)
    X[:, :2] = 0  # rows 0, 1 of W_0: no data gradient, no effect on the forward pass
    y = torch.randint(0, 2, (n,), generator=g)
    model = D.ModelSpec("lr", d)
    cfg = D.DPSGDConfig(epochs=epochs, batch_size=B, lr=0.3, clip=clip, noise_multiplier=0.0,
                        sampling=sampling_name)
    dirs = D.dirac_canaries(model, 4, clip, 0, candidates=range(4), dtype=F64, device="cpu")
    return X, y, model, cfg, dirs


@pytest.mark.parametrize("how", ["shuffle", "shuffle-once"])
def test_a_shuffled_runs_canary_is_inserted_exactly_once_per_epoch(how):
    """Noise 0, canaries on coordinates no example moves: after every epoch an included
    canary's coordinate has moved by exactly lr C / B (one insertion), an excluded one not
    at all; the draws do not depend on which canaries are included."""
    X, y, model, cfg, dirs = _quiet_problem(how)
    seeds = [1, 2, 3, 4, 5]
    inc = torch.rand(len(seeds), 4, generator=torch.Generator().manual_seed(1)) < 0.5
    inc[:, 0] = True
    coords = torch.nonzero(dirs)[:, 1]
    trail = []
    init = D.init_params(model, 1, 0, dtype=F64, device="cpu")
    cfg = D.DPSGDConfig(**{**cfg.__dict__, "init": "fixed"})
    D.train(X, y, model, cfg, seeds, init=init, device="cpu",
            canaries=D.GradientCanaries(dirs, inc),
            on_epoch=lambda e, ps: trail.append(D.flatten(ps[0])[:, coords].clone()))
    start = D.flatten(init)[:, coords]
    moves = -torch.diff(torch.cat([start.expand(len(seeds), -1)[None], torch.stack(trail)]),
                        dim=0) / (cfg.lr * cfg.clip / cfg.batch_size)
    assert len(trail) == 3
    torch.testing.assert_close(moves, inc.to(F64).expand_as(moves), rtol=0, atol=1e-9)


def _hook_run(how, K, noise_std, n=10, B=4, epochs=3, m=1):
    """The hook alone, driven as the trainer drives it (add, noise, observe) on a model
    whose canary coordinates nothing else moves; returns the hook, the per-step insertions
    (K, m, T) and the per-step coordinate moves (K, m, T)."""
    model = D.ModelSpec("lr", 6)
    clip, step_size = 1.5, 0.1
    dirs = D.dirac_canaries(model, m, clip, 0, dtype=F64, device="cpu")
    coords = torch.nonzero(dirs)[:, 1]
    params = D.init_params(model, K, 0, dtype=F64, device="cpu")
    key = philox.keys(list(range(10, 10 + K)), "cpu")
    hook = CanaryHook(D.GradientCanaries(dirs, torch.ones(K, m, dtype=torch.bool)), None,
                       key, params, "cpu", F64, step_size, noise_std, clip,
                       shuffle=(how, n, B))
    spe = -(-n // B)
    g = torch.Generator().manual_seed(3)
    hits, moves = [], []
    for t in range(epochs * spe):
        before = D.flatten(params)[:, coords].clone()
        hook.add(params, t, step_size)
        hit = (before - D.flatten(params)[:, coords]) / (step_size * clip)
        noise = torch.randn(K, m, generator=g, dtype=F64) * noise_std
        W = params.W[0].view(K, -1)  # coordinates of W_0 in the flat layout
        W[:, coords] -= step_size * noise
        hook.observe(params)
        hits.append(hit.round())
        moves.append((before - D.flatten(params)[:, coords]) * clip)
    return hook, torch.stack(hits, -1), torch.stack(moves, -1), spe


def test_the_shuffled_canarys_step_is_that_of_a_uniform_position():
    """n = 10, B = 4: batches of 4, 4 and 2 rows, so the canary's step within an epoch is
    0, 1, 2 with probabilities 0.4, 0.4, 0.2 (a chi-square test over 3000 runs x 3 epochs);
    a fresh draw each epoch ("shuffle": the same step in two epochs with probability
    0.36), the same step every epoch ("shuffle-once")."""
    K = 3000
    _, hits, _, spe = _hook_run("shuffle", K, 0.0)
    per_epoch = hits.view(K, 1, 3, spe)
    assert torch.equal(per_epoch.sum(-1), torch.ones(K, 1, 3, dtype=F64))
    step = per_epoch.argmax(-1).flatten().numpy()
    counts = np.bincount(step, minlength=3)
    assert stats.chisquare(counts, 3 * K * np.array([0.4, 0.4, 0.2])).pvalue > 1e-3
    same = (per_epoch.argmax(-1)[..., 0] == per_epoch.argmax(-1)[..., 1]).double().mean()
    assert abs(float(same) - 0.36) < 4 * math.sqrt(0.36 * 0.64 / K)
    _, hits, _, _ = _hook_run("shuffle-once", 500, 0.0)
    slots = hits.view(500, 1, 3, spe).argmax(-1)
    assert torch.equal(slots, slots[..., :1].expand_as(slots))
    assert len(np.unique(slots.numpy())) == 3


@pytest.mark.parametrize("how", ["shuffle", "shuffle-once"])
def test_the_shuffled_llr_is_the_mixture_over_the_canarys_step(how):
    """With noise, the hook's llr equals, from the observed coordinate moves alone,
    sum_e log sum_s w_s exp(a_{e,s}) ("shuffle") or log sum_s w_s exp(sum_e a_{e,s})
    ("shuffle-once"), a = mu z - mu^2 / 2, z = move / (step_size noise_std C)."""
    noise_std, clip, step_size = 0.8, 1.5, 0.1
    hook, hits, moves, spe = _hook_run(how, 7, noise_std)
    z = moves.numpy()[:, 0] / (step_size * noise_std * clip)
    mu = clip / noise_std
    a = (mu * z - mu ** 2 / 2).reshape(7, 3, spe)
    w = np.array([0.4, 0.4, 0.2])
    if how == "shuffle":
        want = np.log((w * np.exp(a)).sum(-1)).sum(-1)
    else:
        want = np.log((w * np.exp(a.sum(1))).sum(-1))
    np.testing.assert_allclose(hook.llr[:, 0].numpy(), want, rtol=1e-10, atol=1e-10)


def _audit(name, mode, runs=60, seed=3):
    X, y = _data()
    init = None
    if mode == "worst-case-init":
        init = tramer.pretrained_init(X, y, subjects.model_spec(SPEC, D_IN, 2), 1, "cpu")
    profile = tramer.claimed_profile(*subjects.claimed_dpsgd(SPEC, EPS, DELTA, N))
    return tramer.audit_implementation(
        subjects.SUBJECTS[name], X, y, canaries.make_canary("clipbkd", X, y, None),
        tramer.Design(EPS, DELTA, runs, runs, seed, ALPHA, profile), SPEC,
        mode=tramer.Mode(mode, init))


@pytest.mark.parametrize("name", ["shuffle", "shuffle-once"])
@pytest.mark.parametrize("mode", tramer.MODES)
def test_the_shuffled_subjects_are_audited_in_every_mode(name, mode):
    """Tiny scale (n = 200, B = 20, 2 epochs): each mode gives its row, and the white box,
    whose out side is the same batches with the canary's slot empty (zero-out), never
    certifies above the Gaussian mechanism at sigma / sqrt(E), the upper bound for any
    batches that hold each example once per epoch."""
    row, table = _audit(name, mode)
    assert len(table) == 240 and row["runs"] == 60
    assert np.isfinite(row["eps_lb"]) and row["eps_lb"] >= 0
    if mode == "worst-case-init":  # an input canary added as a row
        assert row["relation"] == "add/remove"
    if mode == "white-box":
        assert row["method"] == "whitebox-llr" and row["relation"] == "zero-out"
        sigma = accounting.noise_multiplier(EPS, 0.1, 20, DELTA, "rdp")
        assert row["eps_lb"] <= shuffle_accounting.no_amplification_eps(sigma, 2, DELTA)


def test_audit_impl_takes_the_shuffled_subject_by_name(tmp_path, monkeypatch, capsys):
    """`--train shuffle` in white-box mode writes its row; a spec it cannot train (epochs
    not whole) exits 2 naming the key, before any training."""
    X, y = _data(300)
    monkeypatch.setattr("dpaudit.data.load_fmnist",
                        lambda root, classes, **kw: (X.numpy(), y.numpy()))
    argv = ["audit-impl", "--train", "shuffle", "--eps", "1", "--delta", "1e-5",
            "--n-train", "200", "--alpha", "0.05", "--seed", "0", "--runs", "50"]
    spec = {"epochs": 2, "batch_size": 20, "lr": 0.5, "clip": 1.0, "device": "cpu"}
    out = tmp_path / "res" / "a.csv"
    code = main(argv + ["--mode", "white-box", "--val-runs", "20", "--seed-check", "2",
                        "--spec", json.dumps(spec), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 0, err
    table, _ = read_table(out)
    assert table["implementation"].item() == "shuffle"
    assert table["mode"].item() == "white-box" and table["runs"].item() == 50
    code = main(argv + ["--spec", json.dumps({**spec, "epochs": 1.5}),
                        "--out", str(tmp_path / "b.csv")])
    err = capsys.readouterr().err
    assert code == 2 and "epochs=1.5: must be an integer with sampling='shuffle'" in err, err
    assert not (tmp_path / "b.csv").exists()


def test_the_docs_subject_tables_hold_the_theory_lines():
    """docs/shuffle.md and docs/audit_your_implementation.md: the setting's sigma (rdp claim
    (2, 1e-5), 10 steps per epoch, 5 epochs), the PLD eps at it and the lower bounds of
    each shuffled subject, to the decimals they print."""
    from pathlib import Path

    docs = Path(__file__).resolve().parents[1] / "docs"
    sigma = accounting.noise_multiplier(2.0, 0.1, 50, 1e-5, "rdp")
    lines = shuffle_accounting.theory_lines(sigma, 10, 5, 1e-5)
    shuffle_md = (docs / "shuffle.md").read_text().split("What the white box can see")[1]
    assert f"sigma {sigma:.3f}" in shuffle_md
    audit_md = (docs / "audit_your_implementation.md").read_text().split(
        "### Shuffled batches under Poisson accounting")[1].split("\n## ")[0]
    assert f"sigma {sigma:.2f}" in audit_md
    for name, key in (("shuffle", "shuffle_lb"), ("shuffle-once", "shuffle_lb_persistent")):
        for text, bound in ((shuffle_md, 2), (audit_md, 3)):  # the column of the bound
            row = next(line for line in text.splitlines() if line.startswith(f"| `{name}` |"))
            cells = [c.strip() for c in row.strip("|").split("|")]
            assert cells[bound].split()[0] == f"{lines[key]:.2f}"
            if text is shuffle_md:  # the claim's PLD eps at sigma, in brackets
                assert cells[1].endswith(f"{lines['claimed_eps']:.2f})")
    fixed = next(line for line in audit_md.splitlines() if line.startswith("| `fixed` |"))
    assert f"(its true eps: {lines['claimed_eps']:.2f})" in fixed
    assert subjects.true_eps("fixed", {"epochs": 5, "batch_size": 50, "lr": 50, "clip": 0.1,
                                       "eps": 2.0, "delta": 1e-5}, 500) == \
        pytest.approx(lines["claimed_eps"], abs=1e-9)
