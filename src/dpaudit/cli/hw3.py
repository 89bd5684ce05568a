"""``dpaudit hw3-audit`` and ``dpaudit hw3-plot``: one-run audits of the Gaussian sum (HW3 Q2)."""

from __future__ import annotations

import sys
from pathlib import Path

from . import SpecError, spec_arg

GRIDS = ("eps", "m", "d")
#: key -> (type, lower bound, strict?, upper bound (strict) or None, what it is)
_SCALARS = {
    "delta": (float, 0, True, 1, "delta of the calibration and of the true eps"),
    "beta": (float, 0, True, 1, "1 - confidence of the audit bound"),
    "repeats": (int, 1, False, None, "independent audits per grid point"),
    "max_m1": (int, 1, False, None, "largest m1 = m2 of the guess sweep"),
    "cache_mb": (float, 0, False, None, "canary memory kept between the two passes (MiB)"),
}
#: swept key -> (type, lower bound)
_AXES = {"eps": (float, 0), "m": (int, 2), "d": (int, 1)}


def _number(value, kind) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and (kind is float or isinstance(value, int)))


def _keys(where: str, section, allowed) -> None:
    if not isinstance(section, dict):
        raise SpecError(f"{where}={section!r}: must be a mapping with keys {sorted(allowed)}")
    for key in section:
        if key not in allowed:
            raise SpecError(f"{where}.{key}: unknown key; allowed keys are {sorted(allowed)}")
    for key in allowed:
        if key not in section:
            raise SpecError(f"{where}.{key} is missing; required keys are {sorted(allowed)}")


def check_spec(spec: dict) -> dict:
    """Validate the ``hw3`` config section; :class:`SpecError` names the offending key."""
    _keys("hw3", spec, [*_SCALARS, "grids"])
    for key, (kind, low, strict, high, what) in _SCALARS.items():
        value = spec[key]
        ok = _number(value, kind) and (value > low if strict else value >= low)
        if not ok or (high is not None and not value < high):
            bound = (f"> {low}" if strict else f">= {low}") + (f" and < {high}" if high else "")
            raise SpecError(f"hw3.{key}={value!r}: must be {kind.__name__} {bound} ({what})")
    _keys("hw3.grids", spec["grids"], GRIDS)
    for grid in GRIDS:
        _keys(f"hw3.grids.{grid}", spec["grids"][grid], _AXES)
        for axis, (kind, low) in _AXES.items():
            values = spec["grids"][grid][axis]
            where = f"hw3.grids.{grid}.{axis}"
            if not isinstance(values, list) or not values:
                raise SpecError(f"{where}={values!r}: must be a non-empty list")
            for i, v in enumerate(values):
                rel = ">" if kind is float else ">="
                if not _number(v, kind) or not (v > low if kind is float else v >= low):
                    raise SpecError(f"{where}[{i}]={v!r}: must be {kind.__name__} {rel} {low}")
    return spec


def _audit(args) -> None:
    from ..gaussian import audit_grid
    from ..io import write_table

    spec = check_spec(args.spec)
    axes = spec["grids"][args.grid]
    df = audit_grid(args.grid, axes["eps"], axes["m"], axes["d"], spec["delta"],
                    spec["repeats"], args.seed, spec["beta"], spec["max_m1"], args.threads,
                    int(spec["cache_mb"] * 2**20),
                    progress=lambda msg: print(f"hw3-audit {args.grid}: {msg}", file=sys.stderr))
    write_table(df, args.out, {"command": "hw3-audit", "grid": args.grid, "spec": spec,
                               "seed": args.seed})


def _plot(args) -> None:
    from ..plots.hw3 import plot_grid

    plot_grid(args.table, args.grid, args.out)


def register(subparsers) -> None:
    p = subparsers.add_parser("hw3-audit", help="one-run audits of the Gaussian sum mechanism")
    p.add_argument("--grid", choices=GRIDS, required=True, help="which sweep (HW3 Q2.1-2.3)")
    p.add_argument("--spec", type=spec_arg, required=True, help="the hw3 config section")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--out", type=Path, required=True, help="result CSV")
    p.add_argument("--threads", type=int, default=1, help="threads drawing canaries")
    p.set_defaults(func=_audit)

    p = subparsers.add_parser("hw3-plot", help="plot eps lower bounds of a hw3 grid")
    p.add_argument("--grid", choices=GRIDS, required=True)
    p.add_argument("--table", type=Path, required=True, help="CSV from hw3-audit")
    p.add_argument("--out", type=Path, required=True, help="figure PDF (a PNG is written beside)")
    p.set_defaults(func=_plot)
