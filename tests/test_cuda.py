"""The CUDA paths, on a GPU: skipped where torch sees none (CI, the CPU machines).

Every other test pins the CPU, so these are what a GPU session runs first
(``python -m pytest tests/test_cuda.py``) before training at scale: the wide step against
each column alone, the two samplings, the scores against the CPU's, the seeds per call
against the card's memory and its jobs, a group bit for bit whatever its calls, TF32
training, a whole group through the CLI, and the CIFAR feature extractor's bitwise
reproducibility in :func:`dpaudit.device.deterministic`; the counter-based draws, the
same bits as the CPU's, and the models a GPU trains against the CPU's (to float rounding).
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from dpaudit import device as dev_mod
from dpaudit import dpsgd as D
from dpaudit import features
from dpaudit.dpsgd.model import layer_tensors
from dpaudit.experiments import jagielski
from test_jagielski import _task  # a toy task: 40 rows of 6 features

# compiles: the trainer's fused draws run compiled, as in every GPU job (tests/conftest.py)
pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no GPU"),
              pytest.mark.compiles]


def _problem(arch, n=60, d=12):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n, d, generator=g)
    y = (X[:, 0] > 0).long()
    model = D.ModelSpec(arch, d, hidden=6)
    init = D.init_params(model, 1, [99], device="cpu")
    return X, y, model, init


@pytest.mark.parametrize("sampling", ["shuffle", "poisson"])
@pytest.mark.parametrize("arch", ["lr", "fnn"])
def test_wide_step_on_cuda_equals_each_column_alone(arch, sampling):
    X, y, model, init = _problem(arch)
    base = dict(epochs=3, batch_size=9, lr=0.4, sampling=sampling)
    cols = [D.DPSGDConfig(clip=0.5, noise_multiplier=1.3, **base),
            D.DPSGDConfig(clip=2.0, noise_multiplier=0.0, init_scale=0.5, **base),
            D.DPSGDConfig(clip=1.0, noise_multiplier=0.4, init="fixed", **base)]
    seeds = [3, 11, 12, 40]
    wide = D.train(X, y, model, cols, seeds, init=init, device="cuda")
    for cfg, got in zip(cols, wide):
        assert got.W[0].device.type == "cuda"
        alone = D.train(X, y, model, cfg, seeds, init=init if cfg.init == "fixed" else None,
                        device="cuda")
        for a, b in zip(layer_tensors(got), layer_tensors(alone)):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)  # cuBLAS: other kernels
    again = D.train(X, y, model, cols, seeds, init=init, device="cuda")
    for p, q in zip(wide, again):  # the same call twice: the same models
        for a, b in zip(layer_tensors(p), layer_tensors(q)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_scores_of_the_same_weights_agree_across_devices():
    task = _task(np.random.default_rng(2))
    model = D.ModelSpec("fnn", 6, hidden=5)
    params = D.init_params(model, 3, [1, 2, 3], device="cpu")
    on_gpu = params.to("cuda")
    for attack in jagielski.ATTACKS:
        cpu = jagielski.score_models(params, model, task, attack)
        gpu = jagielski.score_models(on_gpu, model, task, attack)
        assert set(cpu) == set(gpu)
        for name in cpu:
            np.testing.assert_allclose(gpu[name], cpu[name], rtol=1e-4, atol=1e-5,
                                       err_msg=name)


def test_seeds_per_call_fills_half_the_card_and_the_estimate_bounds_the_peak():
    model = D.ModelSpec("fnn", 784, hidden=32)
    cfg = D.DPSGDConfig(epochs=1, batch_size=250, lr=0.15, clip=1.0, noise_multiplier=1.0)
    cols = [cfg] * 8
    per_seed = D.step_bytes(model, 6000, cfg, len(cols))
    free, total = torch.cuda.mem_get_info()
    budget = min(total // 2, int(0.9 * free))
    K_max = D.seeds_per_call(model, 6000, cfg, len(cols), "cuda", limit=10**9)
    assert K_max * per_seed <= budget < (K_max + 1) * per_seed
    K = D.seeds_per_call(model, 6000, cfg, len(cols), "cuda", limit=64)
    X = torch.rand(6000, 784)
    y = torch.randint(0, 2, (6000,))
    D.train(X, y, model, cols, [0], device="cuda")  # cuBLAS workspace, caching allocator
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    D.train(X, y, model, cols, list(range(K)), device="cuda")
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    # The data set is moved to the card once per call; the estimate counts per seed.
    assert peak <= K * per_seed + X.nbytes + y.nbytes, (peak, K * per_seed)


def test_seeds_per_call_shares_the_card_between_its_jobs():
    model = D.ModelSpec("fnn", 784, hidden=32)
    cfg = D.DPSGDConfig(epochs=1, batch_size=250, lr=0.15, clip=1.0, noise_multiplier=1.0)
    free, total = torch.cuda.mem_get_info()
    per_seed = D.step_bytes(model, 6000, cfg, 6)
    for jobs in (1, 4):
        K = D.seeds_per_call(model, 6000, cfg, 6, "cuda", limit=10**9, jobs_per_gpu=jobs)
        assert K == min(total // (2 * jobs), int(0.9 * free)) // per_seed


def test_a_group_is_bit_identical_whatever_the_calls_on_cuda(tmp_path, monkeypatch):
    """Calls of 1, 3 or all 7 trials, across blocks of 3 or within one of 7, give the same
    scores bit for bit on the GPU too with gathered batches (cuBLAS may pick other kernels
    for other numbers of seeds: this is what makes the seeds per call a matter of speed
    only). If this fails, calls must keep to whole blocks on CUDA, as Poisson calls and
    calls on shared data do (run_group's ``span``); those agree to float rounding."""
    from dpaudit import dpsgd

    monkeypatch.setattr(dpsgd.sampling, "shares_data", lambda *args: False)
    task = _task(np.random.default_rng(5))
    model = D.ModelSpec("fnn", 6, hidden=4)
    base = dict(epochs=2, batch_size=10, lr=0.5)
    cfgs = {"a": D.DPSGDConfig(clip=1.0, noise_multiplier=0.5, **base),
            "b": D.DPSGDConfig(clip=2.0, noise_multiplier=0.0, init_scale=0.5, **base)}
    kw = dict(ks=[1], trials=7, seed=2, name=("toy", "fnn"))
    first = jagielski.run_group(task, "clipbkd", model, cfgs, **kw,
                                calls=jagielski.Calls(7, "cuda", 7))
    for block, per_call in ((7, 2), (3, 7), (3, 1)):
        got = jagielski.run_group(task, "clipbkd", model, cfgs, **kw,
                                  calls=jagielski.Calls(block, "cuda", per_call))
        for c in cfgs:
            pd.testing.assert_frame_equal(got[c], first[c], check_exact=True)
    monkeypatch.undo()  # the data shared (40 rows, batches of 10): to float rounding
    shared = jagielski.run_group(task, "clipbkd", model, cfgs, **kw,
                                 calls=jagielski.Calls(3, "cuda", 1))
    for c in cfgs:
        pd.testing.assert_frame_equal(shared[c], first[c], check_exact=False, rtol=1e-4)


def test_tf32_trains_close_to_fp32_reproducibly_and_restores_torch_setting():
    """matmul_precision('tf32') on CUDA: other models than fp32's (TF32 products, a clip
    0.2% lower), close to them, the same on a second run; torch's own setting is as
    before afterwards, and fp32 is exact even where torch's global setting allows TF32."""
    X, y, model, init = _problem("fnn", n=600, d=200)
    cfg = D.DPSGDConfig(epochs=2, batch_size=50, lr=0.3, clip=1.0, noise_multiplier=0.8)
    mm = torch.backends.cuda.matmul
    before = mm.fp32_precision if hasattr(mm, "fp32_precision") else mm.allow_tf32
    fp32 = D.train(X, y, model, cfg, [1, 2, 3], device="cuda")
    with D.matmul_precision("tf32"):
        tf32 = D.train(X, y, model, cfg, [1, 2, 3], device="cuda")
        again = D.train(X, y, model, cfg, [1, 2, 3], device="cuda")
    after = mm.fp32_precision if hasattr(mm, "fp32_precision") else mm.allow_tf32
    assert after == before
    for a, b, c in zip(layer_tensors(tf32), layer_tensors(again), layer_tensors(fp32)):
        assert torch.equal(a, b)
        torch.testing.assert_close(a, c, rtol=0.05, atol=0.02)
    assert not all(torch.equal(a, c) for a, c in zip(layer_tensors(tf32), layer_tensors(fp32)))
    torch.set_float32_matmul_precision("high")  # TF32 allowed globally: fp32 stays exact
    try:
        exact = D.train(X, y, model, cfg, [1, 2, 3], device="cuda")
    finally:
        torch.set_float32_matmul_precision("highest")
    assert all(torch.equal(a, b) for a, b in zip(layer_tensors(exact), layer_tensors(fp32)))


def test_dirac_canaries_and_a_canary_run_on_cuda():
    X, y, model, _ = _problem("fnn")
    cfg = D.DPSGDConfig(epochs=2, batch_size=9, lr=0.4, clip=1.0, noise_multiplier=0.5)
    dirs = D.dirac_canaries(model, 4, 1.0, 0, device="cuda")
    assert dirs.device.type == "cuda" and (dirs != 0).sum().item() == 4
    run = D.train(X, y, model, cfg, [5, 6], device="cuda",
                  canaries=D.GradientCanaries(dirs, torch.ones(2, 4, dtype=torch.bool)))
    assert torch.isfinite(run.scores).all()


def test_describe_names_the_gpu():
    where = dev_mod.describe(dev_mod.resolve("cuda"))
    assert where["device"].startswith("cuda") and where["gpu_name"]
    assert set(dev_mod.REPRODUCE_KEYS) <= set(where)


_PRETRAIN = """
import hashlib, numpy as np
from dpaudit import features
rng = np.random.default_rng(0)
images = rng.integers(0, 256, size=(96, 3, 32, 32), dtype=np.uint8)
model, losses = features.pretrain(images, rng.integers(0, 4, size=96), epochs=2, seed=3,
                                  device="cuda", batch_size=32)
feats = features.extract_features(model, images, batch_size=40, device="cuda")
print(losses, hashlib.sha256(feats.tobytes()).hexdigest())
"""


def test_pretraining_is_bitwise_reproducible_on_the_gpu():
    """Two processes (each with its own cuBLAS handles and workspace): the same losses and
    features, bit for bit, so the CIFAR task's SHA-256 and its kept blocks survive a rerun."""
    runs = [subprocess.run([sys.executable, "-c", _PRETRAIN], capture_output=True, text=True,
                           timeout=300) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr
    assert runs[0].stdout == runs[1].stdout and len(runs[0].stdout.split()) >= 3


def test_cli_trains_a_group_on_cuda_and_reuses_its_blocks(tmp_path, capfd):
    from dpaudit.cli import main
    from dpaudit.io import read_table

    task = _task(np.random.default_rng(7))
    features.save_features(tmp_path / "task.npz", task.arrays(), {"dataset": "toy"})
    spec = {"trials": 6, "ks": [1, 2], "sampling": "shuffle", "clipbkd_d0": "flipped",
            "epochs": 2, "batch_size": 10, "lr": 0.5, "hidden": 5,
            "noise": {"4": 0.7, "inf": 0.0}, "matmul_precision": "fp32"}

    def train():
        return main(["jagielski-train", "--task", str(tmp_path / "task.npz"), "--dataset",
                     "fmnist", "--arch", "fnn", "--attack", "clipbkd", "--cells",
                     json.dumps([[1, "g1", "4"], [2, "g1", "inf"]]), "--spec",
                     json.dumps(spec), "--seed", "5", "--out-dir", str(tmp_path / "out"),
                     "--device", "cuda", "--block-trials", "4", "--store",
                     str(tmp_path / "kept")])

    assert train() == 0
    assert "0 models restored, 36 to train" in capfd.readouterr().err
    first = (tmp_path / "out/c1_g1_e4.csv").read_bytes()
    scores, prov = read_table(tmp_path / "out/c1_g1_e4.csv")
    assert prov["trainer"]["device"].startswith("cuda") and prov["trainer"]["gpu_name"]
    assert len(scores) == 6 * 3 and np.isfinite(scores.clipbkd).all()
    assert train() == 0  # every block kept: restored, nothing trained, the same bytes
    assert "36 models restored, 0 to train" in capfd.readouterr().err
    assert (tmp_path / "out/c1_g1_e4.csv").read_bytes() == first


def test_philox_draws_are_the_same_bits_on_the_gpu():
    """The counter-based draws on CUDA, fused (one compiled kernel each, the trainer's
    GPU path) and not: the CPU's words bit for bit, its normals to float rounding."""
    from dpaudit.dpsgd import philox

    key = philox.keys([0, 5, 2 ** 63 + 11], "cpu")
    for kind, param in (("words", 0.0), ("bernoulli", 0.3), ("sort_keys", 0.0),
                        ("uniform", 0.0), ("normal", 0.0)):
        cpu = philox.draw(kind, key, philox.NOISE, 17, 999, param)
        for fused in (False, True):
            gpu = philox.draw(kind, key.cuda(), philox.NOISE, 17, 999, param, fused=fused)
            if kind in ("normal", "uniform"):
                torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-6, atol=1e-6)
            else:
                assert torch.equal(gpu.cpu(), cpu), (kind, fused)


@pytest.mark.parametrize("sampling", ["shuffle", "poisson"])
@pytest.mark.parametrize("arch", ["lr", "fnn"])
def test_a_gpus_runs_are_the_cpus_to_float_rounding(arch, sampling):
    """Same seeds, same draws (init, batches, noise, canaries): the models and scores a
    GPU trains are those the CPU trains, to float rounding (a few steps)."""
    X, y, model, init = _problem(arch)
    cfg = D.DPSGDConfig(epochs=2, batch_size=9, lr=0.4, clip=1.0, noise_multiplier=0.8,
                        sampling=sampling)
    seeds = [3, 11, 2 ** 40]
    dirs = D.dirac_canaries(model, 2, 1.0, 0, device="cpu")
    inc = torch.tensor([[True, False], [True, True], [False, False]])
    runs = {dev: D.train(X, y, model, cfg, seeds, device=dev,
                         canaries=D.GradientCanaries(dirs.to(dev), inc))
            for dev in ("cpu", "cuda")}
    torch.testing.assert_close(D.flatten(runs["cuda"].params).cpu(),
                               D.flatten(runs["cpu"].params), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(runs["cuda"].scores.cpu(), runs["cpu"].scores,
                               rtol=1e-4, atol=1e-6)
