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

import numpy as np
import pandas as pd

from . import __version__


class BadInputFile(ValueError):
    """An input file that is missing, empty, truncated, altered or of the wrong kind;
    ``redo``: the command that makes it again, where one does (:func:`forcerun`)."""

    def __init__(self, path, reason: str, redo: str | None = None):
        self.path, self.reason, self.redo = str(path), reason, redo
        super().__init__(f"{path}: {reason}" + (f"; redo it: {redo}" if redo else ""))


def forcerun(target: str | os.PathLike) -> str | None:
    """The command that makes the workflow's output ``target`` (a file or a rule's output
    folder, as the rules name it) again, and then everything made from it; None for an
    absolute path: the rules name their outputs relative to the run's folder, so such a
    file (a reference table) is none of them."""
    if Path(target).is_absolute():
        return None
    return f"snakemake --forcerun {target} (with the run's other options)"


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


def unwritable(folder: str | os.PathLike) -> str | None:
    """Why ``folder`` cannot be made (if missing) and written, or None if it can: its
    nearest existing ancestor must be a folder in which a file can be created. Tried with
    an unnamed temporary file (nothing is left behind; ``os.access`` says yes to root even
    where nothing can be made, e.g. under ``/proc``)."""
    existing = Path(folder).absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, not a folder"
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        return f"nothing can be made in {existing} ({exc.strerror or exc})"
    return None


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

#: The version from which every file dpaudit writes records its content hash (a table
#: :data:`BODY_SHA256`, a ``.pt`` or ``.npz`` :data:`CONTENT_SHA256`).
HASHED_SINCE = "0.2.0"


def _version(text: Any) -> tuple[int, ...]:
    return tuple(map(int, re.findall(r"\d+", str(text))[:3]))


def _unhashed(meta: dict[str, Any], path) -> BadInputFile:
    """Why a table whose provenance ``meta`` records no content hash is refused. Every
    table is: one of an older version too, since the version in its header is text that
    an edit can change as easily as it drops the hash, and every reference table shipped
    (reference/) records one; an older version's table is made again instead."""
    made = meta.get("dpaudit_version")
    if made is None:
        return BadInputFile(path, "no content hash and no dpaudit version recorded: not as "
                                  "dpaudit writes a table (altered since?)", forcerun(path))
    if _version(made) >= _version(HASHED_SINCE):
        return BadInputFile(path, f"no content hash recorded, yet its provenance names "
                                  f"dpaudit {made}, which records one: altered since it was "
                                  f"written", forcerun(path))
    return BadInputFile(path, f"no content hash recorded (its header names dpaudit {made}, "
                              f"older than {HASHED_SINCE}): its rows cannot be checked, so "
                              f"it is not read; make it again with this version",
                        forcerun(path))


def write_table(df: pd.DataFrame, path: str | os.PathLike, provenance: dict[str, Any]) -> str:
    """Write ``df`` as CSV at ``path`` atomically, with ``provenance`` and the SHA-256 of the
    rows (:data:`BODY_SHA256`, returned) as a JSON header line."""
    body = df.to_csv(index=False).encode()
    meta = {"dpaudit_version": __version__, **provenance,
            BODY_SHA256: hashlib.sha256(body).hexdigest()}
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            fh.write((_PREFIX + _provenance_json(meta) + "\n").encode())
            fh.write(body)
    return meta[BODY_SHA256]


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


def kept_file(path: str | os.PathLike) -> bool:
    """Whether a file an earlier run kept (a block of trials) is at ``path``. Anything else
    there is :class:`BadInputFile`, before any work: the block, trained again, could not be
    renamed onto it."""
    path = Path(path)
    if not path.exists():
        return False
    if not path.is_file():
        what = "a folder" if path.is_dir() else "not a file"
        raise BadInputFile(path, f"{what} where a kept block is written: move or remove it, "
                                 f"then rerun")
    return True


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


def read_table(path: str | os.PathLike, columns: Iterable[str] = (),
               what: str = "the kind read here") -> tuple[pd.DataFrame, dict[str, Any]]:
    """Read a table written by :func:`write_table`; return ``(frame, provenance)``. Every
    float reads back bit for bit, whatever the pandas version, so a table written again
    from what was read has the same bytes (kept blocks restored by a rerun).

    :class:`BadInputFile` if the file is not such a table or has no rows, if the rows do
    not have the SHA-256 the header records (the file was altered or truncated after it
    was written) or the header records none (:func:`_unhashed`), or if it lacks any of
    ``columns``, the columns the caller reads (:func:`require_columns`; ``what``: the
    kind of table it reads)."""
    from io import BytesIO  # the standard library's

    head, _, body = input_file(path, _TABLE).read_bytes().partition(b"\n")
    meta = _header(head, path)
    recorded = meta.get(BODY_SHA256)
    if recorded is None:
        raise _unhashed(meta, path)
    if hashlib.sha256(body).hexdigest() != recorded:
        raise BadInputFile(path, "its rows do not match the content hash recorded when it "
                                 "was written (altered or truncated since)", forcerun(path))
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


#: Entry of a ``.pt`` (:func:`save_torch`) or ``.npz`` file dpaudit writes: the
#: :func:`content_digest` of everything else in it, checked when it is read
#: (:func:`checked_content`), so a file altered or damaged since is never used.
CONTENT_SHA256 = "content_sha256"


def content_digest(content: dict[str, Any]) -> str:
    """SHA-256 of a dict of arrays (numpy or torch) and JSON values, nested in dicts and
    lists: :func:`array_digest` of its arrays, named by where they are, and the rest."""
    arrays: dict[str, Any] = {}

    def plain(value, where):  # ``value`` with each array replaced by its name
        if isinstance(value, dict):
            return {str(k): plain(v, f"{where}/{k}") for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v, f"{where}/{i}") for i, v in enumerate(value)]
        if hasattr(value, "dtype") and hasattr(value, "shape"):
            arrays[where] = value
            return f"<array {where}>"
        return value

    skeleton = _provenance_json(plain(content, ""))
    return hashlib.sha256(f"{array_digest(arrays)}|{skeleton}".encode()).hexdigest()


def with_content_digest(content: dict[str, Any]) -> dict[str, Any]:
    """``content`` and its :data:`CONTENT_SHA256` entry, to be written."""
    return {**content, CONTENT_SHA256: content_digest(content)}


def checked_content(path, content: dict[str, Any]) -> dict[str, Any]:
    """``content`` read from ``path`` without its :data:`CONTENT_SHA256` entry, else
    :class:`BadInputFile` if it has none (an older version wrote it) or another."""
    rest = {k: v for k, v in content.items() if k != CONTENT_SHA256}
    recorded = content.get(CONTENT_SHA256)
    recorded = recorded.item() if hasattr(recorded, "item") else recorded  # an .npz's 0-d
    if recorded is None:
        raise BadInputFile(path, f"no content hash recorded (written by a version older "
                                 f"than {HASHED_SINCE}, or not by dpaudit)", forcerun(path))
    if content_digest(rest) != recorded:
        raise BadInputFile(path, "its content does not match the content hash recorded when "
                                 "it was written (altered or damaged since)", forcerun(path))
    return rest


def save_torch(path: str | os.PathLike, content: dict[str, Any]) -> None:
    """``torch.save`` of ``content`` (tensors and plain values) and its content hash, atomic."""
    import torch

    with atomic_path(path) as tmp:
        torch.save(with_content_digest(content), tmp)


def read_torch(path: str | os.PathLike, kind: str, map_location="cpu") -> dict[str, Any]:
    """The dict :func:`save_torch` saved at ``path``, its content hash checked, else
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
    return checked_content(path, blob)


def write_text(text: str, path: str | os.PathLike) -> None:
    """Write a text artefact atomically."""
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text)


#: The last line of a Markdown table dpaudit writes (:func:`write_markdown`): an HTML
#: comment, so invisible wherever the Markdown is rendered.
_MD_PREFIX, _MD_SUFFIX = "<!-- dpaudit-table: ", " -->"


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def write_markdown(text: str, path: str | os.PathLike, table_sha256: str) -> None:
    """Write ``text``, a Markdown rendering of the result table whose rows have the
    SHA-256 ``table_sha256`` (its :data:`BODY_SHA256`), atomically, with a last line
    recording that hash and the text's own, which :func:`read_markdown` checks."""
    meta = {"table_sha256": table_sha256, "md_sha256": _sha256(text)}
    write_text(f"{text}{_MD_PREFIX}{_provenance_json(meta)}{_MD_SUFFIX}\n", path)


def read_markdown(path: str | os.PathLike, table_sha256: str | None = None) -> str:
    """The Markdown text of :func:`write_markdown` at ``path``, without its hash line;
    :class:`BadInputFile` if it has no such line, if the text is not the one hashed (edited
    since), or if it renders a table other than the one whose rows have ``table_sha256``
    (None: not checked)."""
    kind = "a Markdown table of dpaudit"
    try:
        whole = input_file(path, kind).read_text()
    except UnicodeDecodeError:
        raise BadInputFile(path, f"not a text file (expected {kind})") from None
    text, _, last = whole.rstrip("\n").rpartition("\n")
    text += "\n" if text else ""
    meta = None
    if last.startswith(_MD_PREFIX) and last.endswith(_MD_SUFFIX):
        try:
            meta = json.loads(last[len(_MD_PREFIX):-len(_MD_SUFFIX)])
        except json.JSONDecodeError:
            pass
    if not isinstance(meta, dict) or not {"table_sha256", "md_sha256"} <= set(meta):
        raise BadInputFile(path, f"no hash line ({_MD_PREFIX.strip()} ...) at its end: not "
                                 f"{kind} (written by hand, or edited?)", forcerun(path))
    if _sha256(text) != meta["md_sha256"]:
        raise BadInputFile(path, "its text does not match the hash recorded when it was "
                                 "written (edited since)", forcerun(path))
    if table_sha256 is not None and meta["table_sha256"] != table_sha256:
        raise BadInputFile(path, "renders another table than the one given (their content "
                                 "hashes differ)", forcerun(path))
    return text


def array_digest(arrays: dict[str, Any]) -> str:
    """SHA-256 of named arrays (numpy or torch, CPU): names, dtypes, shapes and bytes, so
    two files with the same content (whatever their timestamps) get the same digest."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = arrays[name]
        a = a.numpy(force=True) if hasattr(a, "numpy") else np.asarray(a)
        h.update(f"{name}|{a.dtype}|{a.shape}|".encode())
        h.update(memoryview(a.tobytes()))
    return h.hexdigest()


def source_digest(*objects: Any) -> str:
    """SHA-256 of the source code of ``objects`` (modules, functions, classes), in order:
    results kept under it are reused only while that code is unchanged. A package counts
    as all of its modules, sorted by name (its own source is only its ``__init__``), read
    from their files: none is imported for it (a module that needs an optional library,
    absent here, still counts, and the digest does not depend on what is installed)."""
    import importlib.util
    import inspect
    import pkgutil
    import tokenize

    h = hashlib.sha256()
    for obj in objects:
        if not inspect.ismodule(obj) or not hasattr(obj, "__path__"):
            h.update(inspect.getsource(obj).encode())
            continue
        names = [obj.__name__] + [m.name for m in pkgutil.walk_packages(obj.__path__,
                                                                         obj.__name__ + ".")]
        for name in sorted(names):
            h.update(f"{name}\n".encode())
            with tokenize.open(importlib.util.find_spec(name).origin) as f:  # as getsource
                h.update(f.read().encode())
    return h.hexdigest()
