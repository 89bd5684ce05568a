"""The one device choice."""

import pytest
import torch

from dpaudit.device import resolve


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_auto_is_the_cpu_without_a_gpu_and_cuda_is_refused():
    assert resolve(None) == resolve("auto") == torch.device("cpu")
    assert resolve("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="device='cuda'"):
        resolve("cuda")


def test_gpu_claims_give_side_by_side_processes_different_cards(tmp_path):
    """Jobs started together on a machine with N GPUs each take a card nobody holds; a
    claim ends with its holder (here: its lock file closed)."""
    import subprocess
    import sys

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


def test_resolve_cuda_on_several_gpus_claims_a_free_card_and_keeps_it(tmp_path, monkeypatch):
    """Three GPUs (torch's queries faked): the first unclaimed card, the same one for the
    rest of the process; all claimed: the one with the most free memory."""
    from types import SimpleNamespace

    from dpaudit import device
    from dpaudit.device import claim_first

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(uuid=f"GPU-{i}"))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: ([5, 9, 7][i], 10))
    monkeypatch.setattr(device, "LOCK_DIR", tmp_path)
    monkeypatch.setattr(device, "_claimed", None)
    held = claim_first(["GPU-0"], tmp_path)[1]  # another job holds card 0
    assert device.resolve("cuda") == torch.device("cuda", 1)
    assert device.resolve("auto") == device.resolve("cuda") == torch.device("cuda", 1)
    assert device.resolve("cuda:2") == torch.device("cuda", 2)
    first = device._claimed  # its lock file stays open: card 1 stays held
    monkeypatch.setattr(device, "_claimed", None)  # a new process: 0 and 1 held, 2 free
    assert device.resolve("cuda") == torch.device("cuda", 2)
    second = device._claimed
    monkeypatch.setattr(device, "_claimed", None)  # all held: the freest card, shared
    assert device.resolve("cuda") == torch.device("cuda", 1) and device._claimed[1] is None
    for fh in (held, first[1], second[1]):
        fh.close()
