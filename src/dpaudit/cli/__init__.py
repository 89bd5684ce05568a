"""The ``dpaudit`` command: one subcommand per pipeline step.

Snakemake rules call these; each reads its config section as JSON (``--spec``),
calls the pure functions of the science modules and writes a result table with
:func:`dpaudit.io.write_table` or a figure with :func:`dpaudit.plots.style.save`.
Each subcommand lives in its own module here and exposes ``register(subparsers)``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

from .. import __version__
from ..config import SpecError
from ..device import DeviceUnavailable
from ..io import BadInputFile, DataNotFound

#: Subcommand modules, in help order.
COMMANDS = ("data", "hw3", "accounting", "ridge", "jagielski", "trials_needed", "tramer", "onerun",
            "abadi", "report", "tight")


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


def say(command: str):
    """A progress printer for long jobs: ``dpaudit COMMAND: message`` on stderr, flushed."""
    return lambda msg: print(f"dpaudit {command}: {msg}", file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dpaudit", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"dpaudit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"{__name__}.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except SpecError as exc:
        print(f"dpaudit {args.command}: config error: {exc}", file=sys.stderr)
        return 2
    except BadInputFile as exc:
        print(f"dpaudit {args.command}: bad input file {exc}", file=sys.stderr)
        return 2
    except (DataNotFound, DeviceUnavailable) as exc:
        print(f"dpaudit {args.command}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
