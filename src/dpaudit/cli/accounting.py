"""``dpaudit accounting-curves`` and ``dpaudit accounting-plot``: accountant and
composition curves (Abadi et al. Fig. 2; seed 000's composition graph)."""

from __future__ import annotations

import sys
from pathlib import Path

from . import SpecError, spec_arg

#: figure -> {key: (type, low, high, what)}; a bound in a list is inclusive, a bare
#: number exclusive, None none.
_KEYS = {
    "abadi": {
        "sample_rate": (float, 0, [1], "Poisson sampling rate q"),
        "sigma": (float, 0, None, "noise multiplier"),
        "delta": (float, 0, 1, "target delta"),
        "max_epochs": (float, 0, None, "last epoch of the grid"),
        "num_epochs": (int, [1], None, "number of epoch grid points"),
    },
    "composition": {
        "eps0": (float, 0, [1], "per-step epsilon (the seed 000 form needs <= 1)"),
        "delta_prime": (float, 0, 1, "delta' of advanced composition"),
        "max_k": (int, [1], None, "largest number of composed steps"),
        "num_k": (int, [2], None, "number of k grid points"),
    },
}


def _check(spec: dict, name: str) -> dict:
    keys = _KEYS[name]
    for key in spec:
        if key not in keys:
            raise SpecError(f"accounting.{name}.{key}: unknown key; allowed keys are "
                            f"{sorted(keys)}")
    for key, (kind, low, high, what) in keys.items():
        if key not in spec:
            raise SpecError(f"accounting.{name}.{key} is missing ({what})")
        value = spec[key]
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        ok = ok and (kind is float or isinstance(value, int))
        ok = ok and (value >= low[0] if isinstance(low, list) else value > low)
        if high is not None:
            ok = ok and (value <= high[0] if isinstance(high, list) else value < high)
        if not ok:
            bound = f">= {low[0]}" if isinstance(low, list) else f"> {low}"
            if high is not None:
                bound += f" and <= {high[0]}" if isinstance(high, list) else f" and < {high}"
            raise SpecError(f"accounting.{name}.{key}={value!r}: must be {kind.__name__} "
                            f"{bound} ({what})")
    return spec


def _curves(args) -> None:
    import numpy as np

    from ..accounting import abadi_fig2_table, composition_table
    from ..io import write_table

    spec = _check(args.spec, args.figure)
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
    p.add_argument("--figure", choices=sorted(_KEYS), required=True)
    p.add_argument("--spec", type=spec_arg, required=True,
                   help="the accounting.<figure> config section")
    p.add_argument("--seed", type=int, required=True, help="recorded only (no randomness)")
    p.add_argument("--out", type=Path, required=True, help="result CSV")
    p.set_defaults(func=_curves)

    p = subparsers.add_parser("accounting-plot", help="plot a table from accounting-curves")
    p.add_argument("--figure", choices=sorted(_KEYS), required=True)
    p.add_argument("--table", type=Path, required=True, help="CSV from accounting-curves")
    p.add_argument("--out", type=Path, required=True, help="figure PDF (a PNG is written beside)")
    p.set_defaults(func=_plot)
