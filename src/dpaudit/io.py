"""Result tables: atomic writes, with the config and seed that made them.

Every table the pipeline writes is a CSV whose first line is a comment holding
the JSON provenance (package version, command, config section, seed).  Rows are
tidy: one per configuration and repeat, carrying the swept values and the seed.
Files are written to a temporary name in the same folder and renamed into place,
so an interrupted job never leaves a file Snakemake would take as complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

import pandas as pd

from . import __version__


class BadInputFile(ValueError):
    """An input file that is missing, empty, truncated, altered or of the wrong kind."""

    def __init__(self, path, reason: str):
        self.path, self.reason = str(path), reason
        super().__init__(f"{path}: {reason}")


_PREFIX = "# dpaudit-provenance: "


# Floats are written as their shortest round-trip text. Before pandas 3.1 the C parser's
# default ("high") reads about a third of such values one unit in the last place off, so
# a table read back and written again differs in its last digits; "round_trip" is exact.
# pandas 3.1 parses exactly with every option and deprecates it.
def _exact_floats() -> dict[str, str]:
    """The ``pd.read_csv`` options that read every float back exactly on this pandas."""
    if tuple(map(int, re.findall(r"\d+", pd.__version__)[:2])) >= (3, 1):
        return {}
    return {"float_precision": "round_trip"}


_UMASK = os.umask(0o022)
os.umask(_UMASK)


class DataNotFound(FileNotFoundError):
    """A data set is neither at the configured root nor at any fallback location (raised by
    :mod:`dpaudit.data`; defined here so the CLI can report it without importing torch)."""


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it onto ``path`` on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; results are shared like any file
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _provenance_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def as_recorded(value: Any) -> Any:
    """``value`` as a provenance header (:func:`write_table`) gives it back when read, for
    comparing a value at hand with a recorded one (tuples become lists, other objects text)."""
    return json.loads(_provenance_json(value))


#: Provenance entry of :func:`write_table`: SHA-256 of the table's body (the CSV after its
#: header line), which :func:`read_table` checks, so an altered or truncated table is refused.
BODY_SHA256 = "body_sha256"


def write_table(df: pd.DataFrame, path: str | os.PathLike, provenance: dict[str, Any]) -> None:
    """Write ``df`` as CSV at ``path`` atomically, with ``provenance`` and the SHA-256 of the
    rows (:data:`BODY_SHA256`) as a JSON header line."""
    body = df.to_csv(index=False).encode()
    meta = {"dpaudit_version": __version__, **provenance,
            BODY_SHA256: hashlib.sha256(body).hexdigest()}
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            fh.write((_PREFIX + _provenance_json(meta) + "\n").encode())
            fh.write(body)


def input_file(path: str | os.PathLike, kind: str) -> Path:
    """``path`` if it is a non-empty file, else :class:`BadInputFile` saying what it is not
    (``kind``: what was expected there, for the message)."""
    path = Path(path)
    if not path.exists():
        raise BadInputFile(path, f"no such file (expected {kind})")
    if not path.is_file():
        raise BadInputFile(path, f"not a file (expected {kind})")
    if path.stat().st_size == 0:
        raise BadInputFile(path, f"empty file (expected {kind})")
    return path


_TABLE = "a dpaudit result table"


def _header(line: bytes, path) -> dict[str, Any]:
    try:
        first = line.decode()
    except UnicodeDecodeError:
        raise BadInputFile(path, f"not a text file (expected {_TABLE})") from None
    if not first.startswith(_PREFIX):
        raise BadInputFile(path, f"not {_TABLE} (no provenance header)")
    try:
        meta = json.loads(first[len(_PREFIX):])
    except json.JSONDecodeError:
        meta = None
    if not isinstance(meta, dict):
        raise BadInputFile(path, "provenance header is not a JSON object (altered or truncated)")
    return meta


def require_columns(df: pd.DataFrame, provenance: dict[str, Any], path: str | os.PathLike,
                    columns: Iterable[str], what: str) -> None:
    """:class:`BadInputFile` unless ``df`` (read from ``path``, with ``provenance``) has every
    one of ``columns``: a well-formed table of another kind, named with the columns it lacks
    and the command its provenance says made it (``what``: the kind the caller reads, e.g.
    the command that writes it)."""
    missing = [c for c in dict.fromkeys(columns) if c not in df.columns]
    if missing:
        made = provenance.get("command")
        by = f"made by `dpaudit {made}`" if made else "its provenance names no command"
        raise BadInputFile(path, f"not a table of {what}: it lacks column(s) "
                                 f"{', '.join(missing)} ({by})")


def read_table(path: str | os.PathLike, require_hash: bool = False,
               columns: Iterable[str] = (), what: str = "the kind read here"
               ) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Read a table written by :func:`write_table`; return ``(frame, provenance)``. Every
    float reads back bit for bit, whatever the pandas version, so a table written again
    from what was read has the same bytes (kept blocks restored by a rerun).

    :class:`BadInputFile` if the file is not such a table or has no rows, if the rows do
    not have the SHA-256 the header records (the file was altered or truncated after it
    was written), if ``require_hash`` and the header records none (a table from an older
    version), or if it lacks any of ``columns``, the columns the caller reads
    (:func:`require_columns`; ``what``: the kind of table it reads)."""
    from io import BytesIO  # the standard library's

    head, _, body = input_file(path, _TABLE).read_bytes().partition(b"\n")
    meta = _header(head, path)
    recorded = meta.get(BODY_SHA256)
    if recorded is None and require_hash:
        raise BadInputFile(path, "no content hash recorded (written by an older version)")
    if recorded is not None and hashlib.sha256(body).hexdigest() != recorded:
        raise BadInputFile(path, "its rows do not match the content hash recorded when it "
                                 "was written (altered or truncated since)")
    try:
        df = pd.read_csv(BytesIO(body), **_exact_floats())
    except pd.errors.EmptyDataError:
        raise BadInputFile(path, "no table after the provenance header (truncated?)") from None
    except (ValueError, UnicodeDecodeError) as exc:  # pandas' parser errors
        raise BadInputFile(path, f"not a CSV table after the provenance header ({exc})") from None
    if df.empty:
        raise BadInputFile(path, "no rows under the column names (truncated?)")
    require_columns(df, meta, path, columns, what)
    return df, meta


def read_provenance(path: str | os.PathLike) -> dict[str, Any]:
    """The provenance of a table written by :func:`write_table`, without reading its rows."""
    with open(input_file(path, _TABLE), "rb") as fh:
        return _header(fh.readline().rstrip(b"\n"), path)


def read_torch(path: str | os.PathLike, kind: str, map_location="cpu") -> dict[str, Any]:
    """The dict saved with ``torch.save`` at ``path`` (tensors and plain values only), else
    :class:`BadInputFile` (``kind``: what was expected there, for the message)."""
    import torch

    path = input_file(path, kind)
    try:
        blob = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError:  # torch's message is about trusting the file
        raise BadInputFile(path, f"not {kind} (not a file of torch.save)") from None
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        reason = (str(exc).strip() or type(exc).__name__).splitlines()[0].split(". ")[0]
        raise BadInputFile(path, f"not {kind}, or truncated ({reason})") from None
    if not isinstance(blob, dict):
        raise BadInputFile(path, f"not {kind} (holds a {type(blob).__name__}, not a dict)")
    return blob


def write_text(text: str, path: str | os.PathLike) -> None:
    """Write a text artefact (e.g. a Markdown table) atomically."""
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text)


def array_digest(arrays: dict[str, Any]) -> str:
    """SHA-256 of named arrays (numpy or torch, CPU): names, dtypes, shapes and bytes, so
    two files with the same content (whatever their timestamps) get the same digest."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = arrays[name]
        a = a.numpy() if hasattr(a, "numpy") else a
        h.update(f"{name}|{a.dtype}|{a.shape}|".encode())
        h.update(memoryview(a.tobytes()))
    return h.hexdigest()


def source_digest(*objects: Any) -> str:
    """SHA-256 of the source code of ``objects`` (modules, functions, classes), in order:
    results kept under it are reused only while that code is unchanged. A package counts
    as all of its modules, sorted by name (its own source is only its ``__init__``)."""
    import importlib
    import inspect
    import pkgutil

    h = hashlib.sha256()
    for obj in objects:
        if not inspect.ismodule(obj) or not hasattr(obj, "__path__"):
            h.update(inspect.getsource(obj).encode())
            continue
        names = [obj.__name__] + [m.name for m in pkgutil.walk_packages(obj.__path__,
                                                                         obj.__name__ + ".")]
        for name in sorted(names):
            h.update(f"{name}\n".encode())
            h.update(inspect.getsource(importlib.import_module(name)).encode())
    return h.hexdigest()
