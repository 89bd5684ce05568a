"""The one device choice: CPU fallback only where no GPU was given, card claims, NVML free
memory, provenance of the device, the deterministic CUDA scope (torch's CUDA queries
faked where a GPU would be needed)."""

import os
import sys
from types import SimpleNamespace

import pytest
import torch

from dpaudit import device
from dpaudit.device import DeviceUnavailable, given_gpus, resolve

pytestmark = pytest.mark.default_device  # the default device is what these tests test


@pytest.fixture
def no_gpu_vars(monkeypatch):
    """An environment in which no scheduler handed this process a GPU."""
    for var in device.GPU_VARS:
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def fake_cuda(monkeypatch, tmp_path):
    """torch sees three CUDA cards (``GPU-0`` .. ``GPU-2``); records ``set_device``."""
    current = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(uuid=f"GPU-{i}"))
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    monkeypatch.setattr(torch.cuda, "mem_get_info", _no_context)
    monkeypatch.setattr(device, "LOCK_DIR", tmp_path)
    monkeypatch.setattr(device, "_claimed", None)
    return current


def _no_context(*args):
    raise AssertionError("mem_get_info opens a CUDA context on the card it reads")


def test_auto_is_the_cpu_without_a_gpu_and_cuda_is_refused(monkeypatch, no_gpu_vars):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # what a CPU machine says
    assert resolve(None) == resolve("auto") == torch.device("cpu")
    assert resolve("cpu") == torch.device("cpu")
    with pytest.raises(DeviceUnavailable, match="device='cuda': .*CUDA.*set device cpu"):
        resolve("cuda")


@pytest.mark.parametrize("env, given", [
    ({}, {}),
    ({"CUDA_VISIBLE_DEVICES": ""}, {}),
    ({"CUDA_VISIBLE_DEVICES": "-1"}, {}),
    ({"CUDA_VISIBLE_DEVICES": "NoDevFiles", "SLURM_GPUS_ON_NODE": "0"}, {}),
    ({"CUDA_VISIBLE_DEVICES": "1,0"}, {"CUDA_VISIBLE_DEVICES": "1,0"}),
    ({"CUDA_VISIBLE_DEVICES": "GPU-8a1f"}, {"CUDA_VISIBLE_DEVICES": "GPU-8a1f"}),
    ({"CUDA_VISIBLE_DEVICES": "MIG-77"}, {"CUDA_VISIBLE_DEVICES": "MIG-77"}),
    ({"SLURM_JOB_GPUS": "3", "SLURM_GPUS_ON_NODE": "1", "SLURM_JOB_ID": "9"},
     {"SLURM_JOB_GPUS": "3", "SLURM_GPUS_ON_NODE": "1"}),
    ({"SLURM_STEP_GPUS": "0,1"}, {"SLURM_STEP_GPUS": "0,1"}),
])
def test_given_gpus_reads_what_cuda_and_slurm_set(env, given):
    assert given_gpus(env) == given


def test_auto_refuses_the_cpu_in_a_job_given_a_gpu(monkeypatch, no_gpu_vars):
    """SLURM handed this job a GPU, but torch cannot use CUDA: an error naming both, not
    a silent CPU run."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("SLURM_JOB_GPUS", "2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    for name in (None, "auto"):
        with pytest.raises(DeviceUnavailable) as err:
            resolve(name)
        msg = str(err.value)
        assert msg.startswith("device='auto': this job was given a GPU "
                              "(CUDA_VISIBLE_DEVICES=2, SLURM_JOB_GPUS=2) but torch")
        assert "CUDA" in msg.split(" but ")[1] and "set device cpu" in msg
    with pytest.raises(DeviceUnavailable, match=r"device='cuda': .*given a GPU: CUDA_VIS"):
        resolve("cuda")
    assert resolve("cpu") == torch.device("cpu")  # asked for: the user's choice
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # hidden on purpose, no SLURM GPU
    monkeypatch.delenv("SLURM_JOB_GPUS")
    assert resolve("auto") == torch.device("cpu")


def test_cli_reports_an_unusable_gpu_as_an_error(monkeypatch, capsys, no_gpu_vars):
    """The workflow passes --device cuda to jobs that reserve a GPU; a job whose torch
    cannot use it stops with the reason (exit 2), no traceback."""
    from dpaudit import cli

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = SimpleNamespace(command="jagielski-train", func=lambda a: resolve("cuda"))
    monkeypatch.setattr(cli, "build_parser",
                        lambda argv=None: SimpleNamespace(parse_args=lambda argv: args))
    assert cli.main([]) == 2
    assert capsys.readouterr().err.startswith("dpaudit jagielski-train: device='cuda': ")


def test_gpu_claims_give_side_by_side_processes_different_cards(tmp_path):
    """Jobs started together on a machine with N GPUs each take a card nobody holds; a
    claim ends with its holder (here: its lock file closed)."""
    import subprocess

    from dpaudit.device import claim_first

    first, a = claim_first(["gpu-b", "gpu-a"], tmp_path)
    second, b = claim_first(["gpu-b", "gpu-a"], tmp_path)
    assert (first, second) == ("gpu-b", "gpu-a") and a is not None and b is not None
    # another process sees both held: the best card, unclaimed
    code = ("import sys; from pathlib import Path; from dpaudit.device import claim_first; "
            f"print(claim_first(['gpu-b', 'gpu-a'], Path({str(tmp_path)!r}))[1] is None)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "True", out.stderr
    a.close()
    again, c = claim_first(["gpu-b", "gpu-a"], tmp_path)
    assert again == "gpu-b" and c is not None
    b.close(), c.close()


def test_resolve_cuda_on_several_gpus_claims_a_free_card_makes_it_current_and_keeps_it(
        tmp_path, monkeypatch, fake_cuda):
    """Three GPUs: the first unclaimed card, made the current device, the same one for the
    rest of the process; all claimed: the one NVML says has the most free memory (no
    context opened on any card)."""
    from dpaudit.device import claim_first

    monkeypatch.setattr(device, "nvml_free_memory", lambda n: [5, 9, 7][:n])
    held = claim_first(["GPU-0"], tmp_path)[1]  # another job holds card 0
    assert device.resolve("cuda") == torch.device("cuda", 1)
    assert fake_cuda == [1]
    assert device.resolve("auto") == device.resolve("cuda") == torch.device("cuda", 1)
    assert device.resolve("cuda:2") == torch.device("cuda", 2)
    assert fake_cuda == [1, 1, 1, 2]
    with pytest.raises(DeviceUnavailable, match="device='cuda:3': torch sees 3 CUDA"):
        device.resolve("cuda:3")
    first = device._claimed  # its lock file stays open: card 1 stays held
    monkeypatch.setattr(device, "_claimed", None)  # a new process: 0 and 1 held, 2 free
    assert device.resolve("cuda") == torch.device("cuda", 2) and fake_cuda[-1] == 2
    second = device._claimed
    monkeypatch.setattr(device, "_claimed", None)  # all held: the freest card, shared
    assert device.resolve("cuda") == torch.device("cuda", 1) and device._claimed[1] is None
    assert fake_cuda[-1] == 1
    monkeypatch.setattr(device, "_claimed", None)  # all held, no NVML: spread by process
    monkeypatch.setattr(device, "nvml_free_memory", lambda n: None)
    assert device.resolve("cuda") == torch.device("cuda", os.getpid() % 3)
    for fh in (held, first[1], second[1]):
        fh.close()


def test_jobs_per_gpu_places_fill_every_card_before_sharing_one(monkeypatch, fake_cuda):
    """DPAUDIT_JOBS_PER_GPU=2 on three cards: six jobs side by side take cards 0, 1, 2, 0,
    1, 2 (each holding its place until it ends); a seventh shares the freest card."""
    monkeypatch.setenv(device.JOBS_PER_GPU_VAR, "2")
    monkeypatch.setattr(device, "nvml_free_memory", lambda n: [5, 9, 7][:n])
    cards, held = [], []
    for _ in range(7):
        monkeypatch.setattr(device, "_claimed", None)  # a new process
        cards.append(device.resolve("cuda").index)
        held.append(device._claimed[1])
    assert cards == [0, 1, 2, 0, 1, 2, 1] and held[-1] is None
    for fh in held[:-1]:
        fh.close()


@pytest.mark.parametrize("value, want", [(None, 1), ("", 1), ("4", 4), (" 2 ", 2)])
def test_jobs_per_gpu_reads_the_workflows_setting(value, want):
    env = {} if value is None else {device.JOBS_PER_GPU_VAR: value}
    assert device.jobs_per_gpu(env) == want


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5"])
def test_jobs_per_gpu_refuses_a_bad_setting_naming_it(value):
    with pytest.raises(ValueError, match=f"DPAUDIT_JOBS_PER_GPU={value!r}: must be an integer"):
        device.jobs_per_gpu({device.JOBS_PER_GPU_VAR: value})


def test_one_gpu_resolves_to_index_0_and_makes_it_current(monkeypatch, fake_cuda):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert device.resolve("auto") == device.resolve("cuda") == torch.device("cuda", 0)
    assert fake_cuda == [0, 0] and device._claimed[1] is None


class _FakeNVML:
    """pynvml's calls that :func:`nvml_free_memory` makes, on three physical cards."""

    class NVMLError(Exception):
        pass

    def __init__(self, uuids, free, fail_init=False):
        self.uuids, self.free, self.fail_init, self.calls = uuids, free, fail_init, []

    def nvmlInit(self):
        self.calls.append("init")
        if self.fail_init:
            raise self.NVMLError("Driver Not Loaded")

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self):
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUUID(self, handle):
        return self.uuids[handle]

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(free=self.free[handle], total=80, used=80 - self.free[handle])


def test_nvml_free_memory_matches_torch_indices_by_uuid(monkeypatch):
    """With CUDA_VISIBLE_DEVICES=2,0 torch's card 0 is NVML's card 2: matched by UUID
    (NVML writes it with a ``GPU-`` prefix, as str or bytes; torch without)."""
    nvml = _FakeNVML(["GPU-aa", b"GPU-bb", "GPU-cc"], free=[10, 20, 30])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(uuid=["cc", "AA"][i]))
    assert device.nvml_free_memory(2) == [30, 10]
    assert nvml.calls == ["init", "shutdown"]
    monkeypatch.setattr(torch.cuda, "get_device_properties",  # a MIG slice: not listed
                        lambda i: SimpleNamespace(uuid="MIG-dd"))
    assert device.nvml_free_memory(1) is None
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNVML([], [], fail_init=True))
    assert device.nvml_free_memory(1) is None  # no driver library
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py not installed
    assert device.nvml_free_memory(1) is None


def test_describe_records_the_device_actually_used(monkeypatch, no_gpu_vars, fake_cuda):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cpu = device.describe()
    assert cpu == device.describe("cpu") == {
        "device": "cpu", "gpu_name": None, "capability": None, "sm_count": None,
        "torch": torch.__version__, "cuda": torch.version.cuda or None}
    assert set(device.REPRODUCE_KEYS) < set(cpu)
    assert device.reproduce_key("cpu") == {k: cpu[k] for k in device.REPRODUCE_KEYS}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    props = SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0,
                            multi_processor_count=132, uuid="GPU-1")
    monkeypatch.setattr(torch.cuda, "get_device_properties",  # only the used card is read
                        lambda i: props if i == 1 else pytest.fail(f"card {i} read"))
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    for dev in ("cuda:1", torch.device("cuda", 1)):
        assert device.describe(dev) == {
            "device": "cuda:1", "gpu_name": "NVIDIA H100 80GB HBM3", "capability": "9.0",
            "sm_count": 132, "torch": torch.__version__, "cuda": "12.4"}
    assert device.reproduce_key("cuda:1") == {
        "gpu_name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "sm_count": 132,
        "torch": torch.__version__, "cuda": "12.4"}
    assert fake_cuda == [1, 1, 1]


def test_deterministic_scope_on_cuda_sets_and_restores_flags(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = (torch.are_deterministic_algorithms_enabled(),
              torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)  # a user's setting
    with device.deterministic(torch.device("cuda", 0)):
        assert torch.are_deterministic_algorithms_enabled()
        assert not torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    assert (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
            torch.backends.cudnn.benchmark) == (before[0], before[1], True)
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # deterministic already: kept
    with device.deterministic("cuda"):
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0")  # not deterministic: replaced
    with pytest.raises(KeyError), device.deterministic("cuda"):
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        raise KeyError  # restored on an error too
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":0:0"
    assert not torch.backends.cudnn.deterministic
    with device.deterministic("cpu"):  # the CPU is deterministic already: nothing changes
        assert torch.are_deterministic_algorithms_enabled() == before[0]
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":0:0"
