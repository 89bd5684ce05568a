"""The one device choice."""

import pytest
import torch

from dpaudit.device import resolve


def test_auto_is_the_cpu_without_a_gpu_and_cuda_is_refused():
    assert torch.cuda.device_count() == 0  # CI and the developers' machines
    assert resolve(None) == resolve("auto") == torch.device("cpu")
    assert resolve("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="device='cuda'"):
        resolve("cuda")
