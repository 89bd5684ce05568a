"""``dpaudit ridge-audit`` and ``dpaudit ridge-plot``: audit private ridge regression."""

from __future__ import annotations

import sys
from pathlib import Path

from ..config import SpecError, validate_section
from . import FIGURE_HELP, figure_out, out_file, seed_arg, spec_arg

def _check(spec: dict) -> dict:
    """The schema's checks, and the one that relates two keys."""
    validate_section(spec, "ridge")
    if spec["m"] > spec["d"]:
        raise SpecError(f"ridge.m={spec['m']}: must be <= ridge.d={spec['d']} "
                        "(canaries are orthogonal)")
    return spec


def _audit(args) -> None:
    from ..io import write_table
    from ..experiments.ridge import Setup, audit_table

    spec = _check(args.spec)
    setup = Setup(spec["n"], spec["d"], spec["m"], spec["lam"], spec["row_norm"],
                  spec["label_bound"], spec["label_noise"])
    df = audit_table(setup, spec["rho"], spec["delta"], spec["repeats"], args.seed,
                     progress=lambda msg: print(f"ridge-audit: {msg}", file=sys.stderr))
    write_table(df, args.out, {"command": "ridge-audit", "spec": spec, "seed": args.seed})


def _plot(args) -> None:
    from ..plots.ridge import plot_audit

    plot_audit(args.table, args.out)


def register(subparsers) -> None:
    p = subparsers.add_parser("ridge-audit", help="one-run audits of private ridge regression")
    p.add_argument("--spec", type=spec_arg, required=True, help="the ridge config section")
    p.add_argument("--seed", type=seed_arg, required=True)
    p.add_argument("--out", type=out_file, required=True, help="result CSV")
    p.set_defaults(func=_audit)

    p = subparsers.add_parser("ridge-plot", help="plot eps_LB against theoretical eps")
    p.add_argument("--table", type=Path, required=True, help="CSV from ridge-audit")
    p.add_argument("--out", type=figure_out, required=True, help=FIGURE_HELP)
    p.set_defaults(func=_plot)
