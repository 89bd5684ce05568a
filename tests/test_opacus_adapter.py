"""The Opacus adapter (dpaudit.adapters.opacus): its runs against plain Opacus runs of the
same seeds, its claim against Opacus' own accountant, its tight modes against dpaudit's
trainer on the same model and initial parameters; tiny models, a few steps."""

import json
import math
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from dpaudit import accounting, dpsgd

opacus = pytest.importorskip("opacus")
from dpaudit.adapters.opacus import INSTALL, OpacusTrainer, Target, _Scores, run_seeds  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*[Ff]ull backward hook")

N, D, B, LR, C, SIGMA = 20, 5, 5, 0.5, 1.0, 1.0


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Opacus steps of tiny models: two threads on a busy 2-core machine take many times
    as long as one (as every pytest-xdist worker has)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _data(n=N):
    g = torch.Generator().manual_seed(0)
    X = torch.rand(n, D, generator=g)
    X[:, -1] = 0  # a feature the data never uses: the Dirac canary's coordinates
    return X, (X[:, 0] + 0.1 * torch.randn(n, generator=g) > 0.5).long()


def _linear():
    return nn.Linear(D, 2)


def _mlp():
    return nn.Sequential(nn.Linear(D, 3), nn.ReLU(), nn.Linear(3, 2))


def _sgd(params):
    return torch.optim.SGD(params, lr=LR)


def _trainer(model_fn=_linear, **kw):
    args = dict(max_grad_norm=C, batch_size=B, epochs=2, n=N, noise_multiplier=SIGMA)
    return OpacusTrainer(model_fn, _sgd, **{**args, **kw})


def _plain_opacus(X, y, seed, poisson_sampling=True):
    """A user's script: torch.manual_seed, make_private with a noise generator, train."""
    s_model, s_noise, _ = run_seeds(seed)
    torch.manual_seed(s_model)
    module = _linear()
    engine = opacus.PrivacyEngine()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, y), batch_size=B,
                                         shuffle=not poisson_sampling)
    module, optimizer, loader = engine.make_private(
        module=module, optimizer=_sgd(module.parameters()), data_loader=loader,
        noise_multiplier=SIGMA, max_grad_norm=C, poisson_sampling=poisson_sampling,
        noise_generator=torch.Generator().manual_seed(s_noise))
    for _ in range(2):
        for xb, yb in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(module(xb), yb).backward()
            optimizer.step()
    return module._module, engine


@pytest.mark.parametrize("poisson", [True, False])
def test_runs_are_plain_opacus_runs_of_the_same_seeds_and_the_claim_is_opacus_own(poisson):
    X, y = _data()
    train = _trainer(poisson_sampling=poisson)
    logits = train(X, y, [7, 8], {})(X)
    assert logits.shape == (2, N, 2) and logits.dtype == torch.float32
    for k, seed in enumerate([7, 8]):
        module, engine = _plain_opacus(X, y, seed, poisson)
        with torch.no_grad():
            torch.testing.assert_close(logits[k], module(X), rtol=1e-6, atol=1e-6)
    assert train.epsilon(1e-5) == pytest.approx(engine.get_epsilon(1e-5), rel=1e-9)
    assert not torch.allclose(logits[0], logits[1])  # each seed its own run
    torch.testing.assert_close(train(X, y, [8], {})(X)[0], logits[1])  # not its call's


def test_sample_rate_is_b_over_n_with_or_without_the_canary_row():
    """make_private would take 1 / len(loader): 1/4 on 20 rows, 1/5 on 21."""
    train = _trainer()
    assert (train.q, train.steps) == (B / N, 8)
    X, y = _data(N + 1)
    torch.manual_seed(0)
    before = torch.rand(1)
    torch.manual_seed(0)
    assert train(X, y, [1], {})(X).shape == (1, N + 1, 2)
    assert torch.equal(torch.rand(1), before)  # the caller's generator untouched
    with pytest.raises(ValueError, match=r"X has 22 rows; .* n=20 \(the audit's --n-train\)"):
        train(*_data(N + 2), [1], {})


def _dpaudit_run(model, X, y, init, canaries, epochs, noise):
    cfg = dpsgd.DPSGDConfig(epochs=epochs, batch_size=len(X), lr=LR, clip=C,
                            noise_multiplier=noise, sampling="poisson", init="fixed")
    return dpsgd.train(X, y, model, cfg, list(range(len(canaries.included))), init=init,
                       device="cpu", canaries=canaries)


@pytest.mark.parametrize("arch", ["lr", "fnn"])
def test_tight_modes_train_and_score_as_dpaudit_trainer_does(arch):
    """Full batches (q = 1) and no noise, so that both trainers take the same steps: the
    auditor's init loaded into nn.Linear's (out, in) weights, the Dirac canary added to
    the clipped sum at every step of the run that includes it; equal models and scores."""
    X, y = _data()
    model = dpsgd.ModelSpec(arch, D, 3, 2)
    init = dpsgd.init_params(model, 1, 5, 3.0, device="cpu")
    init.b[0] += 0.1
    P = model.n_params
    # first-layer weight (input 1 -> unit 1) and the last bias
    directions = torch.zeros(2, P)
    directions[0, 1 * model.shapes[0][1] + 1], directions[1, P - 1] = C, C
    included = torch.tensor([[True, False], [False, False]])
    ref = _dpaudit_run(model, X, y, init, dpsgd.GradientCanaries(directions, included), 4, 0.0)
    train = _trainer(_mlp if arch == "fnn" else _linear, batch_size=N, epochs=4,
                     noise_multiplier=0.0)
    canaries = dpsgd.GradientCanaries(directions, included)
    run = train(X, y, [3, 4], {}, init=init, canaries=canaries)
    assert run.llr is None and ref.llr is None  # no noise: scores only
    torch.testing.assert_close(run.scores, ref.scores, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(dpsgd.flatten(run.params), dpsgd.flatten(ref.params),
                               rtol=1e-5, atol=1e-6)
    assert run.scores[0, 0] - run.scores[1, 0] > 0.05  # 4 insertions of lr / B * C^2 = 0.025
    (ins,) = canaries.insertions
    assert (ins.steps, ins.rate) == (4, 1.0) and ins.counts.tolist() == [[4, 0], [0, 0]]
    # The worst-case init alone: the same model as dpaudit's trainer without canaries.
    predict = train(X, y, [3], {}, init=init)
    cfg = dpsgd.DPSGDConfig(4, N, LR, C, 0.0, "poisson", init="fixed")
    want = dpsgd.logits(dpsgd.train(X, y, model, cfg, [0], init=init, device="cpu"), X, model)
    torch.testing.assert_close(predict(X), want, rtol=1e-5, atol=1e-6)


def test_llr_is_dpaudit_trainer_llr_on_the_same_iterates():
    """With noise the two trainers draw different noise, so the score definitions are
    tested on dpaudit's iterates (one step per epoch: every row in each batch)."""
    X, y = _data()
    model = dpsgd.ModelSpec("lr", D, n_classes=2)
    init = dpsgd.init_params(model, 1, 1, device="cpu")
    directions = torch.zeros(1, model.n_params)
    directions[0, 3] = C
    canaries = dpsgd.GradientCanaries(directions, torch.ones(2, 1, dtype=torch.bool), rate=0.3)
    iterates = []
    cfg = dpsgd.DPSGDConfig(6, N, LR, C, SIGMA, "shuffle", init="fixed")
    ref = dpsgd.train(X, y, model, cfg, [1, 2], init=init, device="cpu", canaries=canaries,
                      on_epoch=lambda e, ps: iterates.append(dpsgd.flatten(ps[0]).clone()))
    assert len(iterates) == 6 and ref.llr is not None
    for k in range(2):
        s = _Scores(directions, dpsgd.flatten(init)[0], rate=0.3, step_size=LR / N,
                    noise_std=SIGMA * C, clip=C)
        for theta in iterates:
            s.observe(theta[k])
        torch.testing.assert_close(s.scores, ref.scores[k], rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(s.llr, ref.llr[k], rtol=1e-9, atol=1e-12)


def _step_iterates(monkeypatch):
    """Every step's iterates (K, P) of dpaudit's trainer, as its canary hook sees them."""
    from dpaudit.dpsgd.gradient_canaries import CanaryHook

    seen, observe = [], CanaryHook.observe

    def spy(hook, params):
        seen.append(dpsgd.flatten(params).clone())
        observe(hook, params)

    monkeypatch.setattr(CanaryHook, "observe", spy)
    return seen


@pytest.mark.parametrize("poisson, batch", [(True, 5), (False, 5), (False, 6)])
@pytest.mark.parametrize("mates", [-1.0, 0.5, 0.0])
def test_llr_with_the_loaders_insertion_and_mates_is_dpaudit_trainers(monkeypatch, poisson,
                                                                       batch, mates):
    """canaries.rate None: the adapter scores as dpaudit's trainer of the same sampling
    (Poisson at B / n, or shuffled: once per epoch, Chua et al.'s pair with mates), on
    dpaudit's iterates of every step, to 1e-9; at B = 6 the last batch holds 2 of 20 rows."""
    X, y = _data()
    model = dpsgd.ModelSpec("lr", D, n_classes=2)
    init = dpsgd.init_params(model, 1, 1, device="cpu")
    directions = torch.zeros(1, model.n_params)
    directions[0, (D - 1) * 2] = C
    canaries = dpsgd.GradientCanaries(directions, torch.tensor([[True], [False], [True]]),
                                      mates=mates)
    seen = _step_iterates(monkeypatch)
    cfg = dpsgd.DPSGDConfig(2, batch, LR, C, SIGMA, "poisson" if poisson else "shuffle",
                            init="fixed")
    ref = dpsgd.train(X, y, model, cfg, [1, 2, 3], init=init, device="cpu",
                      canaries=canaries)
    assert len(seen) == cfg.steps(N) and ref.llr is not None
    how = _trainer(poisson_sampling=poisson, batch_size=batch)._scoring(canaries, N)
    for k in range(3):
        s = _Scores(directions, dpsgd.flatten(init)[0], **how, step_size=LR / batch)
        for theta in seen:
            s.observe(theta[k])
        torch.testing.assert_close(s.scores, ref.scores[k], rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(s.llr, ref.llr[k], rtol=1e-9, atol=1e-12)
    # q = 5 / 20; shuffled, once in 4 steps
    assert s.of.rate == canaries.insertions[0].rate == 0.25


@pytest.mark.parametrize("poisson", [True, False])
@pytest.mark.parametrize("mates", [-1.0, 0.5])
def test_mates_add_what_the_opacus_batches_hold(poisson, mates):
    """Without noise, on a coordinate no data gradient moves, each run's summed score is
    exactly lr / B * C^2 * (insertions + mates x the mates its batches held): shuffled,
    every row of an epoch but the canary's slot (n - 1), on both sides, and the canary once
    an epoch; with Poisson sampling the rows of the run's Opacus batches (those of a plain
    DPDataLoader drawn after the module, as make_private's)."""
    X, y = _data()
    directions = torch.zeros(1, 2 * D + 2)
    directions[0, (D - 1) * 2] = C
    seeds, E = list(range(6)), 2
    included = torch.tensor([[k % 2 == 0] for k in seeds])
    canaries = dpsgd.GradientCanaries(directions, included, mates=mates)
    train = _trainer(poisson_sampling=poisson, noise_multiplier=0.0, epochs=E)
    run = train(X, y, seeds, {}, canaries=canaries)
    assert run.llr is None
    (ins,) = canaries.insertions
    assert (ins.steps, ins.rate) == (E * N // B, B / N)
    counts = ins.counts[:, 0]
    assert counts[1::2].sum() == 0
    if poisson:
        held = []
        for seed in seeds:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(run_seeds(seed)[0])
                _linear()
                loader = opacus.data_loader.DPDataLoader(
                    torch.utils.data.TensorDataset(X, y), sample_rate=B / N)
                held.append(sum(len(xb) for _ in range(E) for xb, _ in loader))
        held = torch.tensor(held, dtype=torch.float64)
    else:
        assert counts[0::2].tolist() == [E] * 3  # once an epoch
        held = torch.full((len(seeds),), float(E * (N - 1)), dtype=torch.float64)
    torch.testing.assert_close(run.scores[:, 0], LR / B * C * C * (counts + mates * held),
                               rtol=1e-5, atol=1e-6)


def test_whitebox_inserts_at_the_rate_with_noise_and_pairs_the_draws():
    X, y = _data()
    directions = torch.zeros(1, 2 * D + 2)
    directions[0, (D - 1) * 2] = C  # weight of the unused feature D - 1 to class 0
    inside, outside = (dpsgd.GradientCanaries(directions, torch.full((16, 1), v))
                       for v in (True, False))
    train = _trainer()
    run = train(X, y, range(16), {}, canaries=inside)
    assert run.llr.shape == (16, 1) and run.scores.dtype == torch.float64
    (ins,) = inside.insertions
    assert (ins.steps, ins.rate) == (8, 0.25)
    assert abs(int(ins.counts.sum()) - 32) < 5 * math.sqrt(128 * 0.25 * 0.75)
    out = train(X, y, range(16), {}, canaries=outside)
    assert int(outside.insertions[0].counts.sum()) == 0
    # The same noise on both sides (paired), and no data gradient on the canary's
    # coordinate: each insertion moves the score by exactly lr / B * C^2.
    gap = (run.scores - out.scores)[:, 0] / (LR / B * C * C)
    torch.testing.assert_close(gap, ins.counts[:, 0].double(), rtol=0, atol=1e-5)
    # the llr of a run is that of its steps' scores (dpaudit's definition: tested above)
    assert bool((run.llr[:, 0] > out.llr[:, 0])[ins.counts[:, 0] > 0].all())


@pytest.mark.parametrize("kw, message", [
    (dict(batch_size=21), r"batch_size=21\): must be <= n=20"),
    (dict(max_grad_norm=0), r"max_grad_norm=0\): must be a number > 0"),
    (dict(accountant="pld"), r"accountant='pld'\): must be one of \('prv', 'rdp', 'gdp'\)"),
    (dict(target=Target(1.0, 1e-5)), "give exactly one of noise_multiplier and target"),
    (dict(epochs=1.5), r"epochs=1.5\): must be a whole number >= 1"),
    (dict(noise_multiplier=None, target=(1.0, 1e-5)), r"target=\(1.0, 1e-05\)\): must be a "
                                                       r"Target\(epsilon, delta\)"),
])
def test_bad_arguments_are_named(kw, message):
    with pytest.raises(ValueError, match=message):
        _trainer(**kw)


@pytest.mark.parametrize("poisson", [True, False])
def test_the_loaders_batches_are_a_tensor_datasets_bit_for_bit(poisson):
    """Each batch's rows fetched at once (``_Rows``): the same batches, as the loader over
    a plain TensorDataset from the same generator state."""
    X, y = _data()
    train = _trainer(poisson_sampling=poisson)
    plain = torch.utils.data.TensorDataset(X, y)
    if poisson:
        from opacus.data_loader import DPDataLoader

        reference = DPDataLoader(plain, sample_rate=train.q)
    else:
        reference = torch.utils.data.DataLoader(plain, batch_size=B, shuffle=True)
    batches = {}
    for name, loader in (("rows", train._loader(X, y)), ("plain", reference)):
        torch.manual_seed(5)
        batches[name] = [b for _ in range(3) for b in loader]
    assert len(batches["rows"]) == len(batches["plain"]) > 0
    for (xr, yr), (xp, yp) in zip(batches["rows"], batches["plain"]):
        assert xr.dtype == xp.dtype and yr.dtype == yp.dtype
        assert torch.equal(xr, xp) and torch.equal(yr, yp)


def test_target_epsilon_gives_opacus_sigma_and_claim():
    train = _trainer(noise_multiplier=None, target=Target(3.0, 1e-5), accountant="gdp")
    from opacus.accountants.utils import get_noise_multiplier

    assert train.noise_multiplier == get_noise_multiplier(
        target_epsilon=3.0, target_delta=1e-5, sample_rate=0.25, steps=8, accountant="gdp")
    assert 2.9 < train.epsilon(1e-5) <= 3.0
    with pytest.raises(ValueError, match=r"Target\(delta=None\): must be a number > 0"):
        Target(3.0, None)


def test_tight_modes_refuse_other_layouts_and_optimizers_naming_the_mode():
    X, y = _data()
    model = dpsgd.ModelSpec("fnn", D, 3, 2)
    init = dpsgd.init_params(model, 1, 0, device="cpu")
    tanh = _trainer(lambda: nn.Sequential(nn.Linear(D, 3), nn.Tanh(), nn.Linear(3, 2)))
    with pytest.raises(ValueError, match=r"mode 'worst-case-init': .* Sequential with dense "
                                         r"layers \[\(5, 3\), \(3, 2\)\] is not one of them"):
        tanh(X, y, [0], {}, init=init)
    g = dpsgd.GradientCanaries(torch.eye(1, 2 * D + 2) * C, torch.ones(1, 1, dtype=torch.bool))
    momentum = OpacusTrainer(_linear, lambda p: torch.optim.SGD(p, lr=LR, momentum=0.9),
                             max_grad_norm=C, batch_size=B, epochs=1, n=N, noise_multiplier=1.0)
    with pytest.raises(ValueError, match="mode 'white-box': the canary's scores assume plain SGD"):
        momentum(X, y, [0], {}, canaries=g)


def test_audit_args_give_the_claim_spec_and_flags():
    train = _trainer(_mlp, noise_multiplier=2.0)
    args = train.audit_args(1e-5)
    assert args["spec"] == {"clip": C, "q": 0.25, "steps": 8, "accountant": "pld",
                            "arch": "fnn", "n_classes": 2, "hidden": 3}
    assert args["n_train"] == N
    flags = train.cli_args(1e-5).split()  # as $(...) splits it
    assert flags[:6] == ["--eps", repr(args["eps"]), "--delta", "1e-05", "--n-train", "20"]
    assert json.loads(flags[flags.index("--spec") + 1]) == args["spec"]
    # PLD's eps at the training's noise is below Opacus' (prv) eps: the profile test holds
    # the training to no more than it claims
    assert accounting.epsilon(2.0, 0.25, 8, 1e-5, "pld") < args["eps"]


@pytest.fixture(scope="module")
def cases():
    """examples/opacus/cases.py, the trainings of `examples/opacus/audit.py`."""
    import importlib
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "opacus"))
    try:
        yield importlib.import_module("cases")
    finally:
        sys.path.pop(0)


def test_example_bug_adds_the_noise_of_the_batch_mean(cases):
    """NoiseOnTheMean: noise std sigma C / B on the clipped sum; Opacus' own: sigma C."""
    std = {}
    for cls in (opacus.optimizers.DPOptimizer, cases.NoiseOnTheMean):
        p = nn.Parameter(torch.zeros(20_000))
        dp = cls(torch.optim.SGD([p], lr=1.0), noise_multiplier=7.7, max_grad_norm=2.0,
                 expected_batch_size=100, generator=torch.Generator().manual_seed(0))
        p.summed_grad = torch.ones(20_000)
        dp.add_noise()
        std[cls] = float((p.grad - 1).std())
    # 20,000 draws: the sample std within 5 / sqrt(2 * 20,000) = 2.5%
    assert std[opacus.optimizers.DPOptimizer] == pytest.approx(15.4, rel=0.025)
    assert std[cases.NoiseOnTheMean] == pytest.approx(0.154, rel=0.025)


def test_example_trainings_claim_opacus_eps_1_at_q_02_over_100_steps(cases):
    args = cases.correct.audit_args(cases.DELTA)
    assert 0.98 < args["eps"] <= 1.0 and args["n_train"] == 500
    assert args["spec"] == {"clip": 1.0, "q": 0.2, "steps": 100, "accountant": "pld",
                            "arch": "lr", "n_classes": 2}
    for t in (cases.shuffled, cases.noise_on_mean):  # the claim the user would publish
        assert (t.noise_multiplier, t.q, t.steps) == (cases.correct.noise_multiplier, 0.2, 100)
    assert not cases.shuffled.poisson_sampling


@pytest.mark.parametrize("mode, poisson", [("black-box", True), ("worst-case-init", True),
                                           ("white-box", True), ("white-box", False)])
def test_the_audit_accepts_the_adapter_in_every_mode(mode, poisson):
    """audit-impl's own checks (contract, seed check, insertions: with the shuffled loader
    once an epoch, the mean rate 1 / 4 per step) pass on the adapter's runs: an audit with
    its spec, 10 + 5 runs per side."""
    from dpaudit import canaries, subjects
    from dpaudit.experiments import tramer

    X, y = _data()
    train = _trainer(noise_multiplier=2.0, epochs=1, poisson_sampling=poisson)
    spec = {"clip": C, "arch": "lr", "n_classes": 2}  # as audit_args gives it
    init = (dpsgd.init_params(subjects.model_spec(spec, D, 2), 1, 0, device="cpu")
            if mode == "worst-case-init" else None)
    row, table = tramer.audit_implementation(
        train, X, y, canaries.make_canary("checkerboard", X, y, 1),
        tramer.Design(5.0, 1e-5, 10, 5, 0, 0.05), spec, mode=tramer.Mode(mode, init))
    assert len(table) == 30 and row["seed_check"] == 3 and row["usable_runs"] == 30
    assert row["verdict"] == tramer.NO_VIOLATION  # 10 runs certify at most eps 0.8 < 5


def test_example_script_prints_one_verdict_line_per_audit(cases, tmp_path, monkeypatch):
    """examples/opacus/audit.py's audit line, and a failed audit's, on the tiny task in
    place of Fashion-MNIST (its --quick run: docs/audit_your_implementation.md)."""
    import audit as example

    X, y = _data()
    monkeypatch.setattr("dpaudit.data.load_fmnist", lambda root, classes, **kw:
                        (X.numpy(), y.numpy()))
    # audit-impl's worker process imports `cases` afresh: this one, first on the path
    worker_cases = tmp_path / "worker_cases"
    worker_cases.mkdir()
    monkeypatch.syspath_prepend(str(worker_cases))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")  # rewritten within a second

    def correct(trainer: str) -> None:
        monkeypatch.setattr(cases, "correct", eval(trainer))  # for the claim's flags
        (worker_cases / "cases.py").write_text(
            "import torch\nfrom test_opacus_adapter import B, C, LR, N, OpacusTrainer, "
            f"_linear, _trainer\ncorrect = {trainer}\n")

    # a small eps by Opacus' accountant: the audit's floor is 37 runs per side
    correct("_trainer(noise_multiplier=20.0, epochs=1)")
    line = example.audit("correct", "white-box", 40, 5, tmp_path, None, 0)
    assert line.startswith("correct (white-box, 40 + 5 runs per side, "), line
    assert line.endswith(": no violation detected") and "eps_LB 0.00 against" in line, line
    # --quick's sequential audit: its rounds (20, 30, 40) run to the maximum, said so
    line = example.audit("correct", "white-box", 40, 5, tmp_path, None, 0, 0.05, True)
    assert line.startswith("correct (white-box, 40 + 5 runs per side, sequential at alpha "
                           "0.05, at most 40, "), line
    assert line.endswith(": no violation detected"), line
    assert ("sequential: stopped (max_runs) at look 3, 40 + 40 evaluation runs"
            in (tmp_path / "correct_white-box.log").read_text())
    correct("OpacusTrainer(_linear, lambda p: torch.optim.SGD(p, lr=LR, momentum=0.9), "
            "max_grad_norm=C, batch_size=B, epochs=1, n=N, noise_multiplier=20.0)")
    line = example.audit("correct", "white-box", 40, 5, tmp_path, None, 0)
    assert line.startswith("correct (white-box): audit failed (exit 2): dpaudit audit-impl: "
                           "config error: --train cases:correct: train(X, y, seeds, spec, "
                           "canaries=...) of the seed check's 3 runs raised ValueError: mode "
                           "'white-box': the canary's scores assume plain SGD"), line


def test_example_script_runs_the_audits_named_by_only_and_checks_jobs(cases, tmp_path,
                                                                     monkeypatch, capsys):
    """--only takes a list, each audit once in the order given; --jobs below 1 and an
    audit not in the script's list are refused by name (the audits stubbed)."""
    import audit as example

    done = []
    monkeypatch.setattr(example, "audit", lambda name, mode, runs, val_runs, *rest:
                        done.append((name, mode, runs, val_runs, *rest[3:])) or f"{name} {mode}")
    only = "noise_on_mean:black-box,correct:white-box"
    assert example.main_(["--quick", "--jobs", "1", "--only", only, "--out", str(tmp_path)]) == 0
    # --quick: the sequential audit at alpha 0.05, at most 30 + 10 runs per side
    assert done == [("noise_on_mean", "black-box", 30, 10, 0.05, True),
                    ("correct", "white-box", 30, 10, 0.05, True)]
    assert capsys.readouterr().out == "noise_on_mean black-box\ncorrect white-box\n"
    example.main_(["--only", "correct:white-box", "--alpha", "0.01", "--out", str(tmp_path)])
    assert done[-1] == ("correct", "white-box", 1000, 500, 0.01, False)  # the fixed audit
    capsys.readouterr()
    for argv, says in ((["--jobs", "0"], "--jobs 0: must be at least 1"),
                       (["--only", "correct:black-box,shuffled:white-box"],
                        "--only correct:black-box,shuffled:white-box: each must be one of")):
        with pytest.raises(SystemExit) as stop:
            example.main_([*argv, "--out", str(tmp_path)])
        assert stop.value.code == 2 and says in capsys.readouterr().err
    assert len(done) == 3


@pytest.mark.slow
def test_example_script_runs_every_audit_in_its_own_processes(tmp_path):
    """`python examples/opacus/audit.py` as a user runs it: its five audits, two at a time
    in processes forked from the script (--jobs 2), each with its own worker process, on
    Fashion-MNIST files in the real format (random images, class 1 the brighter, 2,200 of
    classes 0/1: the half the audit draws holds its 500 rows and the 500 the worst-case
    init is pretrained on), at the fewest runs alpha 0.05 allows (12 + 4 per side; the
    --quick run: docs/audit_your_implementation.md). One verdict line per audit, in the
    script's order, and each audit's table."""
    import subprocess
    import sys
    from pathlib import Path

    from fakedata import write_learnable_fmnist

    write_learnable_fmnist(tmp_path / "data", n_train=2200)  # class 1 the brighter
    script = Path(__file__).resolve().parents[1] / "examples" / "opacus" / "audit.py"
    out = subprocess.run([sys.executable, str(script), "--runs", "12", "--val-runs", "4",
                          "--alpha", "0.05", "--jobs", "2", "--data-root", str(tmp_path / "data"),
                          "--out", str(tmp_path / "out")], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    audits = [("correct", "black-box"), ("shuffled", "black-box"), ("noise_on_mean", "black-box"),
              ("correct", "worst-case-init"), ("correct", "white-box")]
    assert len(lines) == 5, out.stdout
    for line, (name, mode) in zip(lines, audits):
        assert line.startswith(f"{name} ({mode}, 12 + 4 runs per side, "), line
        assert "against Opacus' eps 0.994" in line and line.endswith(
            ("no violation detected", "violates its claimed guarantee",
             "violates the claimed DP-SGD privacy profile")), line
        assert (tmp_path / "out" / f"{name}_{mode}.csv").is_file()


EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "opacus"


def _example(script: str, *argv: str, without_opacus: bool = False):
    """``python examples/opacus/SCRIPT ARGV`` in a fresh interpreter (optionally as if Opacus
    were not installed): its exit code and output."""
    import subprocess
    import sys

    hide = "sys.modules['opacus'] = None; " if without_opacus else ""
    code = (f"import runpy, sys; {hide}sys.argv = {[script, *argv]!r}; "
            f"runpy.run_path({str(EXAMPLES / script)!r}, run_name='__main__')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    return out.returncode, out.stdout, out.stderr


@pytest.mark.parametrize("script", ["audit.py", "shuffle_whitebox.py"])
def test_example_help_is_whole_plain_text_and_names_every_option(script):
    """--help: the whole description (each paragraph ends in a full stop), no reST markup,
    a help text for every option; audit.py's --help needs no Opacus and says up front that
    the example trains on Fashion-MNIST 0/1, not the user's data."""
    code, out, err = _example(script, "--help", without_opacus=script == "audit.py")
    assert code == 0, err
    description, options = out.split("\n\n", 1)[1].split("\noptions:\n")
    assert "``" not in out and ":class:" not in out and ":func:" not in out
    for paragraph in description.strip().split("\n\n"):
        if not paragraph.startswith("    "):  # a command shown indented
            assert paragraph.rstrip().endswith((".", ".)", "\".", ":")), paragraph
    assert 'pip install -e ".[opacus]"' in description
    entries = re.split(r"\n(?=  -)", options.strip("\n"))
    helps = [re.sub(r"^  -[-\w]+(?:, --[-\w]+)?(?: [A-Z_]+)?", "", e).strip() for e in entries]
    assert len(entries) >= 5 and all(helps), options
    if script == "audit.py":
        first = description.strip().split("\n\n")[1]
        assert "Fashion-MNIST classes 0/1 (784 inputs" in first and "not your data" in first


def test_example_without_opacus_ends_in_one_line_saying_how_to_install_it(tmp_path):
    code, out, err = _example("audit.py", "--quick", "--out", str(tmp_path), without_opacus=True)
    assert code == 2 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == (
        "audit.py: error: dpaudit.adapters.opacus needs Opacus (>= 1.5), which is not "
        "installed: " + INSTALL)
    assert 'pip install -e ".[opacus]"' in INSTALL


def test_the_whitebox_relation_is_the_loaders_insertion():
    """The shuffled loader's canary takes a slot of the same batches (zero-out); Poisson
    sampling adds it at rate q (add/remove): the audit row's ``relation`` says which."""
    from dpaudit.subjects import canary_relation

    assert canary_relation(_trainer(poisson_sampling=False)) == "zero-out"
    assert canary_relation(_trainer(poisson_sampling=True)) == "add/remove"
