"""``dpaudit hw3-audit`` and ``dpaudit hw3-plot``: one-run audits of the Gaussian sum (HW3 Q2)."""

from __future__ import annotations

import sys
from pathlib import Path

from ..config import validate_section
from . import FIGURE_HELP, figure_out, int_at_least, made_by, out_file, seed_arg, spec_arg

GRIDS = ("eps", "m", "d")


def _audit(args) -> None:
    from ..experiments.gaussian_sum import audit_grid
    from ..io import write_table

    spec = validate_section(args.spec, "hw3")
    axes = spec["grids"][args.grid]
    df = audit_grid(args.grid, axes["eps"], axes["m"], axes["d"], spec["delta"],
                    spec["repeats"], args.seed, spec["beta"], spec["max_m1"], args.threads,
                    int(spec["cache_mb"] * 2**20),
                    progress=lambda msg: print(f"hw3-audit {args.grid}: {msg}", file=sys.stderr))
    write_table(df, args.out, {"command": "hw3-audit", "grid": args.grid, "spec": spec,
                               "seed": args.seed})


def _plot(args) -> None:
    from ..io import read_provenance
    from ..plots.hw3 import plot_grid

    provenance = read_provenance(args.table)
    if provenance.get("command") == "hw3-audit":  # another's table: its columns name it
        made_by(provenance, args.table, "hw3-audit", grid=args.grid)
    plot_grid(args.table, args.grid, args.out)


def register(subparsers) -> None:
    p = subparsers.add_parser("hw3-audit", help="one-run audits of the Gaussian sum mechanism")
    p.add_argument("--grid", choices=GRIDS, required=True, help="which sweep (HW3 Q2.1-2.3)")
    p.add_argument("--spec", type=spec_arg, required=True, help="the hw3 config section")
    p.add_argument("--seed", type=seed_arg, required=True)
    p.add_argument("--out", type=out_file, required=True, help="result CSV")
    p.add_argument("--threads", type=int_at_least(1), default=1, help="threads drawing canaries")
    p.set_defaults(func=_audit)

    p = subparsers.add_parser("hw3-plot", help="plot eps lower bounds of a hw3 grid")
    p.add_argument("--grid", choices=GRIDS, required=True)
    p.add_argument("--table", type=Path, required=True, help="CSV from hw3-audit")
    p.add_argument("--out", type=figure_out, required=True, help=FIGURE_HELP)
    p.set_defaults(func=_plot)
