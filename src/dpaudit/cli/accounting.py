"""``dpaudit accounting-curves`` and ``dpaudit accounting-plot``: accountant and
composition curves (Abadi et al. Fig. 2; the composition graph of the CSCI 699 Week 4
lecture notes)."""

from __future__ import annotations

import sys
from pathlib import Path

from ..config import validate_section
from . import FIGURE_HELP, figure_out, out_file, seed_arg, spec_arg

FIGURES = ("abadi", "composition")


def _curves(args) -> None:
    import numpy as np

    from ..accounting import abadi_fig2_table, composition_table
    from ..io import write_table

    spec = validate_section(args.spec, "accounting", args.figure)
    log = lambda msg: print(f"accounting-curves: {msg}", file=sys.stderr)  # noqa: E731
    if args.figure == "abadi":
        epochs = np.linspace(0, spec["max_epochs"], spec["num_epochs"] + 1)[1:]
        log(f"{len(epochs)} epoch values up to {spec['max_epochs']}")
        df = abadi_fig2_table(spec["sample_rate"], spec["sigma"], spec["delta"], epochs)
    else:
        ks = np.unique(np.round(np.linspace(1, spec["max_k"], spec["num_k"])).astype(int))
        log(f"{len(ks)} values of k up to {spec['max_k']}")
        df = composition_table(spec["eps0"], spec["delta_prime"], ks)
    # The curves are deterministic: the seed is recorded for uniformity, not used.
    write_table(df, args.out, {"command": "accounting-curves", "figure": args.figure,
                               "spec": spec, "seed": args.seed})


def _plot(args) -> None:
    from ..plots.accounting import plot_abadi_fig2, plot_composition

    {"abadi": plot_abadi_fig2, "composition": plot_composition}[args.figure](args.table,
                                                                             args.out)


def register(subparsers) -> None:
    p = subparsers.add_parser("accounting-curves",
                              help="eps curves of DP-SGD accountants or composition theorems")
    p.add_argument("--figure", choices=FIGURES, required=True)
    p.add_argument("--spec", type=spec_arg, required=True,
                   help="the accounting.<figure> config section")
    p.add_argument("--seed", type=seed_arg, required=True, help="recorded only (no randomness)")
    p.add_argument("--out", type=out_file, required=True, help="result CSV")
    p.set_defaults(func=_curves)

    p = subparsers.add_parser("accounting-plot", help="plot a table from accounting-curves")
    p.add_argument("--figure", choices=FIGURES, required=True)
    p.add_argument("--table", type=Path, required=True, help="CSV from accounting-curves")
    p.add_argument("--out", type=figure_out, required=True, help=FIGURE_HELP)
    p.set_defaults(func=_plot)
