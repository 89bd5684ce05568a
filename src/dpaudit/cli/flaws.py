"""``dpaudit flaws``: the flaws table (:mod:`dpaudit.experiments.flaws`, docs/flaws.md),
each flaw through the code paths and checks that see it, beside its fix; ``dpaudit
flaws-plot``, its figure."""

from __future__ import annotations

from pathlib import Path

from ..config import validate_section
from . import FIGURE_HELP, figure_out, made_by, out_file, say, seed_arg


def _table(args) -> None:
    import logging

    from ..experiments import flaws
    from ..io import write_table

    spec = validate_section({"scale": args.scale, "alpha": args.alpha,
                             "only": args.flaw or []}, "flaws")
    entries = [e for e in flaws.ENTRIES if not spec["only"] or e.flaw in spec["only"]]
    # dp_accounting's RDP orders that do not converge at large sigma, one line each
    logging.getLogger("absl").setLevel(logging.ERROR)
    df = flaws.table(spec["scale"], args.seed, spec["alpha"], entries, say("flaws"))
    write_table(df, args.out, {"command": "flaws", "spec": spec, "seed": args.seed})


def _plot(args) -> None:
    from ..io import read_provenance
    from ..plots.flaws import plot_flaws

    made_by(read_provenance(args.table), args.table, "flaws")
    plot_flaws(args.table, args.out)


def _md(args) -> None:
    from ..experiments import flaws
    from ..io import read_table

    df, provenance = read_table(args.table, columns=flaws.COLUMNS)
    made_by(provenance, args.table, "flaws")
    print(flaws.markdown(df))


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "flaws", help="the flaws table: each flaw found in real DP-SGD code through the "
                      "checks that see it, beside its fix",
        description="Runs every entry of dpaudit.experiments.flaws.ENTRIES (the measured-"
                    "parameters check of Opacus trainings, the sequential audit of dpaudit's "
                    "trainer) on the flawed training and on its fix, and, at scale full, "
                    "the robust rows of each certified violation (docs/flaws.md).")
    p.add_argument("--scale", default="quick", help="quick (seconds per row) or full "
                   "(reference/flaws_audit.csv; default quick)")
    p.add_argument("--alpha", type=float, default=0.05,
                   help="1 - the confidence of every certified bound (default 0.05)")
    p.add_argument("--flaw", action="append", default=None, metavar="NAME",
                   help="only this flaw's rows (repeatable; default every flaw)")
    p.add_argument("--seed", type=seed_arg, required=True, help="master seed")
    p.add_argument("--out", type=out_file, required=True, help="the table (CSV)")
    p.set_defaults(func=_table)

    p = subparsers.add_parser("flaws-plot", help="draw the flaws table")
    p.add_argument("--table", type=Path, required=True, help="CSV from dpaudit flaws")
    p.add_argument("--out", type=figure_out, required=True, help=FIGURE_HELP)
    p.set_defaults(func=_plot)

    p = subparsers.add_parser("flaws-md", help="the flaws table as the Markdown of "
                                               "docs/flaws.md")
    p.add_argument("--table", type=Path, required=True, help="CSV from dpaudit flaws")
    p.set_defaults(func=_md)
