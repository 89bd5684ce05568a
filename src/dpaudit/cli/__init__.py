"""The ``dpaudit`` command: one subcommand per pipeline step.

Snakemake rules call these; each reads its config section as JSON (``--spec``),
calls the pure functions of the science modules and writes a result table with
:func:`dpaudit.io.write_table` or a figure with :func:`dpaudit.plots.style.save`.
Each subcommand lives in its own module here and exposes ``register(subparsers)``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from .. import __version__
from ..config import SpecError
from ..device import DeviceUnavailable
from ..io import BadInputFile, DataNotFound, unwritable

DESCRIPTION = ("dpaudit: audit-impl audits your own DP training function "
               "(docs/audit_your_implementation.md); the other commands are the steps of the "
               "Snakemake pipeline, which its rules run. `dpaudit COMMAND --help` says more.")


def spec_arg(text: str) -> dict:
    """argparse type: a JSON object (a config section)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"--spec is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("--spec must be a JSON object")
    return value


def int_at_least(low: int):
    """argparse type: an integer >= ``low`` (argparse names the argument when it fails)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(f"{text!r}: must be an integer >= {low}")
        return value
    return parse


#: argparse type of ``--seed``: seeds are integers >= 0 (:mod:`dpaudit.seeds`).
seed_arg = int_at_least(0)


def _writable(text: str, folder: Path) -> None:
    """ArgumentTypeError unless ``folder`` exists or can be made, and written
    (:func:`dpaudit.io.unwritable`)."""
    why = unwritable(folder)
    if why:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a path whose folder can be made "
                                         f"and written; {why}")


def out_file(text: str) -> Path:
    """argparse type: a file to write, so not an existing folder, in a folder that exists
    or can be made, and written."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; give a file path")
    _writable(text, path.parent)
    return path


def out_dir(text: str) -> Path:
    """argparse type: a folder to write into (made if missing), so not an existing file,
    and one that can be made and written."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file, not a folder; give a folder "
                                         "path")
    _writable(text, path)
    return path


def figure_out(text: str) -> Path:
    """argparse type: a figure's ``.pdf`` (its ``.png`` is written beside), not a folder."""
    path = out_file(text)
    if path.suffix.lower() != ".pdf":
        raise argparse.ArgumentTypeError(f"{text!r}: must be a .pdf file (a .png of the same "
                                         "name is written beside it)")
    return path


#: ``--out`` of a figure command.
FIGURE_HELP = "figure PDF (a PNG is written beside)"


def made_by(provenance: dict, path, command: str, **expect) -> None:
    """:class:`BadInputFile` unless the file at ``path`` (with ``provenance``) was written by
    ``dpaudit COMMAND``, with the values of ``expect`` where its provenance records them
    (e.g. its data set)."""
    made = provenance.get("command")
    if made != command:
        by = f"made by `dpaudit {made}`" if made else "its provenance names no command"
        raise BadInputFile(path, f"not a file of `dpaudit {command}` ({by})")
    for key, want in expect.items():
        if provenance.get(key, want) != want:
            raise BadInputFile(path, f"a file of {command} with {key} {provenance[key]!r}, "
                                     f"not {want!r}")


#: Keys of ``--train`` of the audits on the FMNIST cells of Jagielski et al.'s Figure 2
#: (``tight-whitebox-audit``, ``onerun-audit``), each with the config section whose schema
#: it follows: the DP-SGD set-up of ``jagielski.datasets.fmnist`` and Figure 2's clip.
FMNIST_TRAIN = {**dict.fromkeys(("epochs", "batch_size", "lr", "hidden", "noise"),
                                ("jagielski", "datasets", "fmnist")),
                "clip": ("jagielski", "fig2")}


def fmnist_train(jag: dict, noise: dict) -> dict:
    """The ``--train`` of :data:`FMNIST_TRAIN` from the config's ``jagielski`` section, with
    ``noise`` (eps label -> noise multiplier) for the labels the job trains."""
    out = {}
    for key, where in FMNIST_TRAIN.items():
        section = {"jagielski": jag}
        for part in where:
            section = section[part]
        out[key] = section[key]
    return {**out, "noise": noise}


def fmnist_train_schema() -> dict:
    """The schema of ``--train`` (:data:`FMNIST_TRAIN`): every key required, each its own
    section's schema."""
    from ..config import section_schema

    return {"type": "object", "additionalProperties": False, "required": list(FMNIST_TRAIN),
            "properties": {k: section_schema(*where)["properties"][k]
                           for k, where in FMNIST_TRAIN.items()}}


def kept_folder(store: Path | None, name: str) -> Path | None:
    """Where one cell's batches of runs are kept: ``store/<name>``, the name's characters
    other than letters, digits and dots made ``_`` (None without a store)."""
    return None if store is None else store / re.sub(r"[^A-Za-z0-9.]+", "_", name)


def say(command: str):
    """A progress printer for long jobs: ``dpaudit COMMAND: message`` on stderr, flushed."""
    return lambda msg: print(f"dpaudit {command}: {msg}", file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand (:data:`COMMANDS`)."""
    parser = argparse.ArgumentParser(prog="dpaudit", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"dpaudit {__version__}")
    # not required: without one, main prints the commands (argparse would only say that
    # one is required)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS:
        module.register(sub)
    return parser


def _missing_folders(args) -> list[Path]:
    """The parent folders of the command's path arguments that do not exist yet."""
    return [v.parent for v in vars(args).values()
            if isinstance(v, Path) and not v.parent.exists()]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # `dpaudit` alone: the commands it has, audit-impl first
        parser.print_help(sys.stderr)
        return 2
    missing = _missing_folders(args)
    try:
        # A command may return its exit status (opacus-check: 1 on findings).
        status = args.func(args)
    except SpecError as exc:
        print(f"dpaudit {args.command}: config error: {exc}", file=sys.stderr)
        return 2
    except BadInputFile as exc:
        print(f"dpaudit {args.command}: bad input file {exc}", file=sys.stderr)
        return 2
    except (DataNotFound, DeviceUnavailable) as exc:
        print(f"dpaudit {args.command}: {exc}", file=sys.stderr)
        return 2
    for folder in dict.fromkeys(missing):  # made for an output: say so
        if folder.is_dir():
            print(f"dpaudit {args.command}: created folder {folder}", file=sys.stderr)
    return status if isinstance(status, int) else 0


# The subcommands' modules import the helpers above, hence below them. Each imports at its
# top only what its parser needs (no torch, no scipy: tests/test_conventions.py), and what
# its job needs where the job runs, so that `dpaudit --help` and a plot job start quickly.
from . import (abadi, accounting, data, flaws, hw3, jagielski, onerun,  # noqa: E402
               opacus_check, report, ridge, runs_needed, shuffle, tight, tramer,
               trials_needed)

#: Subcommand modules, in help order: first the one users run themselves (audit-impl),
#: then the pipeline's steps, which the workflow's rules run, then the checks users run.
COMMANDS = (tramer, data, hw3, accounting, ridge, jagielski, trials_needed, onerun, abadi,
            report, tight, shuffle, opacus_check, runs_needed, flaws)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
