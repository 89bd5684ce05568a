"""Package attributes imported on first use (PEP 562), so that a process that only reads a
package's light names does not import what its other modules need: Snakemake's start-up
builds the workflow from the experiments' grids and the models' shapes, and importing
torch and the accountants would be most of its start-up (measured: docs/scale.md). (It
still imports torch to count the GPUs, except where
``CUDA_VISIBLE_DEVICES`` hides them or ``--resources gpu=N`` gives the count:
:func:`dpaudit.device.gpu_count`, ``workflow/rules/common.smk``.)"""

from __future__ import annotations

import importlib
from typing import Callable


def lazy_attributes(namespace: dict, where: dict[str, str],
                    submodules: tuple[str, ...] = ()) -> tuple[Callable, Callable]:
    """``__getattr__`` and ``__dir__`` for the package whose ``globals()`` is ``namespace``:
    the name ``n`` of ``where`` is imported from its submodule ``where[n]`` when first
    read, and each submodule of ``where`` or ``submodules`` when read as an attribute (as
    an eager ``__init__`` would have set it)."""
    package = namespace["__name__"]
    submodules = {*where.values(), *submodules}

    def __getattr__(name: str):
        if name in submodules:
            return importlib.import_module(f"{package}.{name}")
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{where[name]}"), name)
        namespace[name] = value  # read once: the next access is a plain lookup
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *where, *submodules})

    return __getattr__, __dir__
