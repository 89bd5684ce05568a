"""The one way a package here imports its modules on first use (PEP 562).

Why: Snakemake's start-up and every ``dpaudit`` command line read light names (the grid of
:mod:`dpaudit.experiments.jagielski`, :class:`dpaudit.dpsgd.ModelSpec`) from packages whose
other modules import torch or scipy.stats, seconds each; importing a module imports its
package first, so an ``__init__`` that imported every module would make each reader pay
for all of them. Only :mod:`dpaudit.dpsgd` and :mod:`dpaudit.experiments.jagielski` need
it: their callers write ``package.name``. Everywhere else imports are explicit, at the top
of the module, and the modules that start-up reads import neither torch nor scipy
(``tests/test_conventions.py`` checks both in-process).

How: the package writes what it serves as ``from .module import name`` lines (or
``from . import module``) in an ``if TYPE_CHECKING:`` block, which type checkers, IDEs and
call graphs follow; :func:`lazy_attributes` reads that same block from the package's
source, so the list has one place.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import Callable


def type_checking_imports(source: str, package: str) -> tuple[dict[str, str], set[str]]:
    """The ``if TYPE_CHECKING:`` block of a package's source: {name: its submodule} of its
    ``from .module import name`` lines and the submodules of its ``from . import module``
    lines. ValueError on any other statement there (an alias, an absolute import): the
    block is what the package serves, nothing else."""
    where: dict[str, str] = {}
    submodules: set[str] = set()
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.If) and isinstance(node.test, ast.Name)
                and node.test.id == "TYPE_CHECKING"):
            continue
        for line in node.body:
            if not (isinstance(line, ast.ImportFrom) and line.level == 1
                    and all(a.asname is None for a in line.names)):
                raise ValueError(f"{package}: the TYPE_CHECKING block holds only "
                                 f"`from .module import name` lines, not {ast.unparse(line)!r}")
            for alias in line.names:
                if line.module is None:
                    submodules.add(alias.name)
                else:
                    where[alias.name] = line.module
    return where, submodules


def lazy_attributes(namespace: dict) -> tuple[Callable, Callable, list[str]]:
    """``__getattr__``, ``__dir__`` and the served names of the package whose ``globals()``
    is ``namespace``: a name of its ``TYPE_CHECKING`` imports is imported from its
    submodule when first read, and each submodule named there is an attribute (as an eager
    ``__init__`` would have set it)."""
    package = namespace["__name__"]
    where, submodules = type_checking_imports(Path(namespace["__file__"]).read_text(),
                                              package)
    submodules |= set(where.values())

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

    return __getattr__, __dir__, list(where)
