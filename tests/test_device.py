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
