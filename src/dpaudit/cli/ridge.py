"""``dpaudit ridge-audit`` and ``dpaudit ridge-plot``: audit private ridge regression."""

from __future__ import annotations

import sys
from pathlib import Path

from . import SpecError, spec_arg

#: key -> (type, lower bound, strict lower bound?, upper bound or None, what it is)
_KEYS = {
    "n": (int, 1, False, None, "base data-set size"),
    "d": (int, 1, False, None, "dimension"),
    "m": (int, 2, False, None, "number of canaries (<= d)"),
    "lam": (float, 0, True, None, "ridge penalty"),
    "row_norm": (float, 0, True, None, "row-norm bound R"),
    "label_bound": (float, 0, True, None, "label bound B"),
    "label_noise": (float, 0, False, None, "label noise std"),
    "delta": (float, 0, True, 1, "delta of the (eps, delta) audit"),
    "repeats": (int, 1, False, None, "audits per rho"),
}


def _check(spec: dict) -> dict:
    allowed = set(_KEYS) | {"rho"}
    for key in spec:
        if key not in allowed:
            raise SpecError(f"ridge.{key}: unknown key; allowed keys are {sorted(allowed)}")
    for key, (kind, low, strict, high, what) in _KEYS.items():
        if key not in spec:
            raise SpecError(f"ridge.{key} is missing ({what})")
        value = spec[key]
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        ok = ok and (kind is float or isinstance(value, int))
        ok = ok and (value > low if strict else value >= low) and (high is None or value < high)
        if not ok:
            bound = f"> {low}" if strict else f">= {low}"
            bound += f" and < {high}" if high is not None else ""
            raise SpecError(f"ridge.{key}={value!r}: must be {kind.__name__} {bound} ({what})")
    rho = spec.get("rho")
    if (not isinstance(rho, list) or not rho
            or not all(isinstance(r, (int, float)) and not isinstance(r, bool) and r > 0
                       for r in rho)):
        raise SpecError(f"ridge.rho={rho!r}: must be a non-empty list of numbers > 0")
    if spec["m"] > spec["d"]:
        raise SpecError(f"ridge.m={spec['m']}: must be <= ridge.d={spec['d']} "
                        "(canaries are orthogonal)")
    return spec


def _audit(args) -> None:
    from ..io import write_table
    from ..ridge import audit_table

    spec = _check(args.spec)
    df = audit_table(spec["n"], spec["d"], spec["m"], spec["lam"], spec["row_norm"],
                     spec["label_bound"], spec["label_noise"], spec["rho"], spec["delta"],
                     spec["repeats"], args.seed,
                     progress=lambda msg: print(f"ridge-audit: {msg}", file=sys.stderr))
    write_table(df, args.out, {"command": "ridge-audit", "spec": spec, "seed": args.seed})


def _plot(args) -> None:
    from ..plots.ridge import plot_audit

    plot_audit(args.table, args.out)


def register(subparsers) -> None:
    p = subparsers.add_parser("ridge-audit", help="one-run audits of private ridge regression")
    p.add_argument("--spec", type=spec_arg, required=True, help="the ridge config section")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--out", type=Path, required=True, help="result CSV")
    p.set_defaults(func=_audit)

    p = subparsers.add_parser("ridge-plot", help="plot eps_LB against theoretical eps")
    p.add_argument("--table", type=Path, required=True, help="CSV from ridge-audit")
    p.add_argument("--out", type=Path, required=True, help="figure PDF (a PNG is written beside)")
    p.set_defaults(func=_plot)
