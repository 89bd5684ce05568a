"""Every test names its device, so the suite gives the same results on a machine with a GPU
as on one without.

Where torch sees a GPU, the default device (``None`` or ``"auto"``,
:func:`dpaudit.device.resolve`) is CUDA; a test that leaves the device to the default
would mix CPU and CUDA tensors there, or record ``cuda:0`` where it expects ``cpu``. So in
every test, on every machine, resolving the default device fails and says which device to
name: CPU tests pass ``device="cpu"`` (``--device cpu`` to the CLI), the CUDA tests of
``tests/test_cuda.py`` ask for ``"cuda"``. Tests of the default itself carry the marker
``default_device``. Workflow tests run Snakemake in a subprocess, with the GPUs hidden
(``tests/test_workflow.py``, ``tests/test_slurm.py``).

With pytest-xdist (``-n auto``), the tests of a class run in one worker, so that a session
fixture they share (one run of the whole workflow) is made once, and the tests marked
``slow`` start first.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys

import pytest
import torch

import dpaudit
from dpaudit import device

# Under pytest-xdist every core runs a worker: one thread each (and in what they start),
# since two workers' thread pools on two cores wait on each other at every parallel
# operation (milliseconds each where the machine is busy).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

# Every module now, so that none imports the function during a test (and keeps the patch).
for _info in pkgutil.walk_packages(dpaudit.__path__, "dpaudit."):
    importlib.import_module(_info.name)


def _named_only(resolve):
    def strict(dev=None):
        if dev is None or dev == "auto":
            raise AssertionError(
                f"device={dev!r}: a test must name its device (the default is CUDA where "
                "torch sees a GPU): pass device='cpu' (CLI: --device cpu), or 'cuda' in "
                "tests/test_cuda.py")
        return resolve(dev)
    return strict


@pytest.fixture(autouse=True)
def _compile_only_where_marked(request):
    """The GPU's fused Philox draws (dpaudit.dpsgd.philox) are compiled with torch.compile, tens
    of seconds on 2 cores. Tests that take the GPU branch under a forced GPU description
    run it uncompiled (the same draws: the branch's logic is what they test), except those
    marked ``compiles``, which check the compiled kernels themselves."""
    import torch._dynamo

    if request.node.get_closest_marker("compiles"):
        yield
        return
    with torch._dynamo.config.patch(disable=True):
        yield


@pytest.fixture(autouse=True)
def _no_default_device(request, monkeypatch):
    if request.node.get_closest_marker("default_device"):
        yield
        return
    real = device.resolve
    strict = _named_only(real)
    # every dpaudit module that imported the function under its own name
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] == "dpaudit" and getattr(module, "resolve", None) is real:
            monkeypatch.setattr(module, "resolve", strict)
    yield


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's ``load`` (each test to the next free worker), except that a class goes to one
    worker whole (xdist's ``loadgroup`` marks no longer group under pytest 9)."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class OneWorkerPerClass(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            parts = nodeid.split("::")
            return "::".join(parts[:2]) if len(parts) > 2 else nodeid

    return OneWorkerPerClass(config, log)


def pytest_collection_modifyitems(items):
    """The slow tests first, so that no worker starts one when the others are done."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
