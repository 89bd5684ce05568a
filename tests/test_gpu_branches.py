"""Every GPU-only branch, taken on the CPU under a forced GPU description
(:func:`dpaudit.device.forced_gpu` in process, ``DPAUDIT_FORCE_GPU`` in subprocesses): the
device choice and its provenance, the card claims of jobs sharing GPUs, the deterministic
scope, TF32's matmul setting, a group trained through the CLI and restored, the workflow's
GPU places, and ``benchmarks/bench_dpsgd.py --cuda-only``. The memory sizing and the TF32
clip margin are tested in tests/test_dpsgd.py under the same description."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from dpaudit import device
from dpaudit import dpsgd as D
from dpaudit.device import FORCE_GPU_VAR, DeviceUnavailable, GpuDescription

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks" / "bench_dpsgd.py"
#: An H100 as torch reports one (name, memory, capability, multiprocessors).
H100 = GpuDescription("NVIDIA H100 80GB HBM3", 80 * 2**30, 79 * 2**30, "9.0", 132)
FIELDS = "['name', 'total_memory', 'free_memory', 'capability', 'sm_count', 'count']"


def _env(desc: GpuDescription, drop_count: bool = False) -> dict:
    """This process's environment with ``desc`` forced, and no GPU visible to torch."""
    fields = dataclasses.asdict(desc)
    if drop_count:
        del fields["count"]
    return {**os.environ, FORCE_GPU_VAR: json.dumps(fields), "CUDA_VISIBLE_DEVICES": ""}


@pytest.mark.default_device  # auto is what this tests
def test_forced_gpu_resolves_to_the_cpu_and_takes_the_gpu_branches(monkeypatch):
    """Without CUDA, and in a job handed a GPU (where auto would refuse the CPU): cuda and
    auto are the CPU, which counts as the described GPU, its memory the description's."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("SLURM_JOB_GPUS", "2")
    cpu = torch.device("cpu")
    assert not device.is_gpu(cpu) and device.gpu_count() == torch.cuda.device_count()
    with pytest.raises(ValueError, match=rf"memory_info\('cpu'\): not a GPU, and {FORCE_GPU_VAR}"):
        device.memory_info(cpu)
    with device.forced_gpu(H100) as desc:
        assert desc is H100 and device.forced() is H100
        for name in (None, "auto", "cuda", "cuda:0", torch.device("cuda", 0), "cpu"):
            assert device.resolve(name) == cpu
        assert device.is_gpu("cpu") and device.is_gpu(cpu) and device.gpu_count() == 1
        assert device.memory_info(cpu) == (79 * 2**30, 80 * 2**30)
        with pytest.raises(DeviceUnavailable, match=r"device='cuda:1': torch sees 1 CUDA "
                           rf"device\(s\) here \({FORCE_GPU_VAR} count=1\)"):
            device.resolve("cuda:1")
    assert device.forced() is None and not device.is_gpu(cpu)
    with pytest.raises(DeviceUnavailable, match="device='auto': this job was given a GPU"):
        device.resolve("auto")
    with pytest.raises(TypeError, match="forced_gpu: a GpuDescription, not dict"):
        with device.forced_gpu(dataclasses.asdict(H100)):
            pass


def test_describe_under_a_forced_gpu_records_the_cpu_and_its_key_matches_no_real_device(
        monkeypatch):
    """Provenance says the truth (the CPU, with forced_gpu), and the restore key of a forced
    run differs from a real CPU's and a real H100's (restoring through the CLI:
    test_cli_trains_under_a_forced_gpu_as_cpu_work_that_no_real_cpu_restores)."""
    cpu_key = device.reproduce_key("cpu")
    with device.forced_gpu(H100):
        info = device.describe("cuda")
        forced_key = device.reproduce_key("cuda")
    assert info == {"device": "cpu", "gpu_name": None, "capability": None, "sm_count": None,
                    "torch": torch.__version__, "cuda": torch.version.cuda or None,
                    "forced_gpu": "NVIDIA H100 80GB HBM3"}
    assert forced_key == {**cpu_key, "forced_gpu": "NVIDIA H100 80GB HBM3"}
    # The real H100 (torch's calls faked as in tests/test_device.py).
    props = type("Props", (), {"name": H100.name, "major": 9, "minor": 0,
                               "multi_processor_count": 132, "uuid": "GPU-0"})()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: None)
    monkeypatch.setattr(device, "_claimed", None)
    gpu_key = device.reproduce_key("cuda")
    assert gpu_key == {**cpu_key, "gpu_name": H100.name, "capability": "9.0", "sm_count": 132}
    assert forced_key not in (cpu_key, gpu_key)


def test_force_gpu_variable_round_trips_into_a_subprocess():
    """The variable carries the description (``count`` left out: 1) into a child process,
    which resolves cuda to the CPU, sizes by the described memory and records forced_gpu."""
    probe = ("import dataclasses, json; from dpaudit import device; "
             "print(json.dumps({'desc': dataclasses.asdict(device.forced()), "
             "'auto': str(device.resolve('auto')), 'is_gpu': device.is_gpu('cpu'), "
             "'memory': device.memory_info('cpu'), 'count': device.gpu_count(), "
             "'describe': device.describe('cuda')}))")
    out = subprocess.run([sys.executable, "-c", probe], env=_env(H100, drop_count=True),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert GpuDescription(**got["desc"]) == H100 and got["count"] == 1
    assert got["auto"] == "cpu" and got["is_gpu"] is True
    assert got["memory"] == [79 * 2**30, 80 * 2**30]
    assert got["describe"]["device"] == "cpu" and got["describe"]["forced_gpu"] == H100.name
    assert got["describe"]["gpu_name"] is None


@pytest.mark.parametrize("value, why", [
    ("H100", r"Expecting value"),
    ('["NVIDIA H100"]', r"not a JSON object"),
    ('{"name": "H100", "total_memory": 1}', r"missing field\(s\) \['free_memory', "
                                            r"'capability', 'sm_count'\]"),
    ('{"name": "H100", "total_memory": 8, "free_memory": 8, "capability": "9.0", '
     '"sm_count": 132, "memory": 8}', r"unknown field\(s\) \['memory'\]"),
    ('{"name": "H100", "total_memory": 8, "free_memory": 9, "capability": "9.0", '
     '"sm_count": 132}', r"GpuDescription free_memory=9: must be an integer of bytes from 0 "
                         r"to total_memory"),
    ('{"name": "H100", "total_memory": 8, "free_memory": 8, "capability": 9.0, '
     '"sm_count": 132}', r"GpuDescription capability=9.0: must be a string \"major.minor\""),
    ('{"name": "H100", "total_memory": 8, "free_memory": 8, "capability": "9.0", '
     '"sm_count": 132, "count": 0}', r"GpuDescription count=0: must be an integer >= 1"),
])
def test_a_bad_force_gpu_variable_names_it_and_the_fields(monkeypatch, value, why):
    monkeypatch.setenv(FORCE_GPU_VAR, value)
    for ask in (device.forced, lambda: device.is_gpu("cpu")):  # any GPU question refuses
        with pytest.raises(ValueError) as err:
            ask()
        msg = str(err.value)
        assert msg.startswith(f"{FORCE_GPU_VAR}={value!r}: ") and re.search(why, msg), msg
        assert msg.endswith(f"must be a JSON object with the fields {FIELDS} (count "
                            "optional, default 1)")


def test_the_variable_gives_several_cards_and_the_context_manager_wins(monkeypatch):
    monkeypatch.setenv(FORCE_GPU_VAR, json.dumps({**dataclasses.asdict(H100), "count": 3}))
    assert device.forced() == dataclasses.replace(H100, count=3) and device.gpu_count() == 3
    small = dataclasses.replace(H100, name="small", free_memory=2**30)
    with device.forced_gpu(small):
        assert device.forced() is small and device.memory_info("cpu") == (2**30, 80 * 2**30)
    assert device.forced().name == H100.name


def test_jobs_sharing_forced_gpus_take_every_card_before_a_second_place(monkeypatch, tmp_path):
    """DPAUDIT_JOBS_PER_GPU=2 on 3 described cards: seven processes side by side take cards
    0, 1, 2, 0, 1, 2 (place p is card p mod 3), with locks of their own (no real card's),
    and the seventh shares the freest, all alike here: card 0."""
    monkeypatch.setenv(device.JOBS_PER_GPU_VAR, "2")
    monkeypatch.setattr(device, "LOCK_DIR", tmp_path)
    cards, held = [], []
    with device.forced_gpu(dataclasses.replace(H100, count=3)):
        for _ in range(7):
            monkeypatch.setattr(device, "_claimed", None)  # a new process
            assert device.resolve("cuda") == torch.device("cpu")
            cards.append(device._claimed[0].index)
            held.append(device._claimed[1])
    assert cards == [p % 3 for p in range(6)] + [0] and held[-1] is None
    assert sorted(p.name for p in tmp_path.iterdir()) == \
        sorted(f"forced{c}.{j}.lock" for c in range(3) for j in range(2))
    for fh in held[:-1]:
        fh.close()


def _cuda_matmul_setting() -> str:
    """torch's CUDA float32 matmul setting: ``tf32``, ``ieee`` (or torch >= 2.9's ``none``)."""
    mm = torch.backends.cuda.matmul
    if hasattr(mm, "fp32_precision"):
        return mm.fp32_precision
    return "tf32" if mm.allow_tf32 else "ieee"


def test_deterministic_scope_and_the_tf32_setting_are_entered_under_a_forced_gpu(monkeypatch):
    """The CUDA-only scopes run on the CPU under the description: deterministic algorithms
    and the cuBLAS workspace, torch's CUDA matmul precision set for TF32 (harmless on the
    CPU), all restored on exit; without it both leave everything as it was."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = (torch.are_deterministic_algorithms_enabled(), _cuda_matmul_setting())
    cpu = torch.device("cpu")
    with device.deterministic(cpu), D.precision.cuda_matmuls(cpu):
        assert (torch.are_deterministic_algorithms_enabled(), _cuda_matmul_setting()) == before
    with device.forced_gpu(H100):
        with device.deterministic(cpu):
            assert torch.are_deterministic_algorithms_enabled()
            assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        for precision, want in (("tf32", "tf32"), ("fp32", "ieee")):
            with D.matmul_precision(precision), D.precision.cuda_matmuls(cpu):
                assert _cuda_matmul_setting() == want
    assert (torch.are_deterministic_algorithms_enabled(), _cuda_matmul_setting()) == before
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ


def test_cli_trains_under_a_forced_gpu_as_cpu_work_that_no_real_cpu_restores(tmp_path, capfd):
    """jagielski-train --device cuda under the description: the TF32 branch (provenance
    matmul_precision tf32 beside forced_gpu, device cpu), its blocks restored by another
    forced run only; a plain CPU run trains them again."""
    from dpaudit import features
    from dpaudit.cli import main
    from dpaudit.io import read_table
    from test_jagielski import _task

    task = _task(np.random.default_rng(7))
    features.save_features(tmp_path / "task.npz", task.arrays(), {"dataset": "toy"})
    spec = {"trials": 6, "ks": [1, 2], "sampling": "shuffle", "clipbkd_d0": "flipped",
            "epochs": 2, "batch_size": 10, "lr": 0.5, "hidden": 5,
            "noise": {"4": 0.7, "inf": 0.0}, "matmul_precision": "tf32"}

    def train(dev):
        return main(["jagielski-train", "--task", str(tmp_path / "task.npz"), "--dataset",
                     "fmnist", "--arch", "fnn", "--attack", "clipbkd", "--cells",
                     json.dumps([[1, "g1", "4"], [2, "g1", "inf"]]), "--spec",
                     json.dumps(spec), "--seed", "5", "--out-dir", str(tmp_path / dev),
                     "--device", dev, "--block-trials", "4", "--store",
                     str(tmp_path / "kept")])

    with device.forced_gpu(H100):
        assert train("cuda") == 0
        err = capfd.readouterr().err
        assert "0 models restored, 36 to train" in err
        assert "on cpu (forced GPU description: NVIDIA H100 80GB HBM3)" in err
        _, prov = read_table(tmp_path / "cuda/c1_g1_e4.csv")
        assert prov["trainer"]["device"] == "cpu" and prov["trainer"]["gpu_name"] is None
        assert prov["trainer"]["forced_gpu"] == H100.name
        assert prov["trainer"]["matmul_precision"] == "tf32"
        assert train("cuda") == 0
        assert "36 models restored, 0 to train" in capfd.readouterr().err
    assert train("cpu") == 0
    assert "0 models restored, 36 to train" in capfd.readouterr().err
    _, prov = read_table(tmp_path / "cpu/c1_g1_e4.csv")
    assert prov["trainer"]["matmul_precision"] == "fp32" and "forced_gpu" not in prov["trainer"]


@pytest.mark.slow
def test_workflow_gives_training_jobs_places_on_the_forced_gpus(monkeypatch, tmp_path):
    """A dry run of the paper-scale DAG under a description of 2 cards, without
    --resources: the training jobs each reserve a GPU place (so they run with --device
    cuda), the other jobs none; on this CPU without the description, none would."""
    from test_conventions import _jobs
    from test_gpu_sharing import _field
    from test_workflow import snakemake

    monkeypatch.setenv(FORCE_GPU_VAR, json.dumps(dataclasses.asdict(
        dataclasses.replace(H100, count=2))))
    out = snakemake("-n", "--cores", "16", "--directory", str(tmp_path))
    assert out.returncode == 0, out.stderr
    gpu = {}
    for _, rule, block in _jobs(out.stdout):
        resources = dict(r.split("=", 1) for r in _field(block, "resources"))
        gpu.setdefault(rule, set()).add(int(resources.get("gpu", 0)))
    assert gpu["jagielski_train"] == gpu["tramer_audit"] == {1}
    assert gpu["hw3_audit"] == {0}


def _bench(monkeypatch):
    """benchmarks/bench_dpsgd.py as a module (its --tiny scale and config overlay)."""
    spec = importlib.util.spec_from_file_location("bench_dpsgd", BENCH)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # where its dataclass looks itself up
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_bench_dpsgd_cuda_only_runs_every_line_on_the_cpu_under_a_forced_gpu(monkeypatch):
    """``bench_dpsgd.py --cuda-only --tiny`` under an H100 description whose memory other
    processes hold but room for 2.5 seeds of Table 2's group: every CUDA line runs (none
    failed), each group at the K of that memory, the peak memory reported as unavailable.
    (It used to crash keying a dict by a group's cells; without torch.cuda it refused
    --cuda-only.)"""
    bench = _bench(monkeypatch)
    config = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    trials, jobs = bench.TINY_CONFIG["jagielski"]["trials"], bench.TINY_CONFIG["jobs_per_gpu"]
    table2 = config["jagielski"]["table2"]
    cfg = D.DPSGDConfig(epochs=config["jagielski"]["datasets"]["fmnist"]["epochs"],
                        batch_size=250, lr=0.15, clip=1.0, noise_multiplier=1.0)
    model = D.ModelSpec("fnn", 784, hidden=32)

    def per_seed(cells):
        return D.step_bytes(model, bench.TINY.n, cfg, cells)

    table2_cells = len(table2["clips"]) * len(table2["inits"]) * len(table2["eps"])
    free = int(2.5 * per_seed(table2_cells) / 0.9)
    # TORCHDYNAMO_DISABLE: the fused Philox draws are still taken, uncompiled (compiling
    # them for the CPU, not a GPU's kernels, took most of the run: seconds per process and
    # per TF32 setting).
    env = {**_env(dataclasses.replace(H100, free_memory=free)), "TORCHDYNAMO_DISABLE": "1"}
    out = subprocess.run([sys.executable, str(BENCH), "--cuda-only", "--tiny"], env=env,
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert "failed:" not in text, text
    name = f"{H100.name} (forced, on the CPU)"
    groups = re.findall(rf"^{re.escape(name)}: (\d+) cells x K=(\d+) seeds \((\d+) jobs per "
                        rf"GPU\), {bench.TINY.cuda_epochs} epochs: .* measured peak "
                        r"unavailable \(forced GPU description: trained on the CPU\)$",
                        text, re.M)
    assert len(groups) == 2, text  # Figure 2's group, then Table 2's
    for cells, K, shared in groups:
        budget = min(80 * 2**30 // (2 * jobs), int(0.9 * free))
        assert int(shared) == jobs
        assert int(K) == max(1, min(trials, budget // per_seed(int(cells))))
    assert groups[1][:2] == (str(table2_cells), "2")  # 2.5 seeds' room: 2 seeds per call
    fig2 = groups[0][0]
    for line in (f"K sizing ({name}, {fig2} cells", f"K sizing ({name}, {table2_cells} cells",
                 f"{jobs} jobs at once ({name}, {fig2} cells", f"TF32 ({name}, {fig2} cells",
                 f"TF32 ({name}, {table2_cells} cells", f"Tramer case study ({name}",
                 f"Projection of the whole run on {name}, fp32",
                 f"Projection of the whole run on {name}, tf32"):
        assert line in text, text
