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
