"""``dpaudit opacus-check``: the parameters a user's own Opacus training really runs with,
measured on n and n + 1 rows, against the epsilon it reports
(:mod:`dpaudit.adapters.opacus_probe`, docs/flaws.md)."""

from __future__ import annotations

import sys

from . import int_at_least, seed_arg


def _delta(text: str) -> float:
    import argparse

    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a number strictly between 0 "
                                         f"and 1")
    return value


def _check(args) -> int:
    from ..adapters import opacus_probe
    from ..subjects import SUBJECTS, load_train_fn

    def bad(msg: str) -> int:
        print(f"dpaudit opacus-check: {msg}", file=sys.stderr)
        return opacus_probe.EXIT_BAD_INPUT

    if args.train in SUBJECTS:
        return bad(f"--train {args.train!r}: a registry subject of audit-impl, not a "
                   f"function train(X, y, seed) -> (model, reported_eps); give "
                   f"'module.path:function'")
    try:
        fn = load_train_fn(args.train)
        report = opacus_probe.check(fn, args.n, args.delta, dim=args.dim,
                                    classes=args.classes, seed=args.seed)
    except ValueError as exc:
        return bad(str(exc).splitlines()[0])
    except Exception as exc:  # the user's code: one line, not a traceback
        return bad(f"--train {args.train!r} raised {type(exc).__name__}: "
                   f"{str(exc).splitlines()[0] if str(exc) else ''}")
    print(opacus_probe.table(report))
    return report.status


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "opacus-check",
        help="measure a user's Opacus training (steps, batch sizes, clip, noise, "
             "normaliser) on n and n + 1 rows against its reported eps",
        description="Runs TRAIN(X, y, seed) -> (model, reported_eps) on n random rows and "
                    "on the same rows plus one, with Opacus' DPOptimizer, PrivacyEngine "
                    "and Poisson sampler instrumented, and prints the measured parameters "
                    "and findings. Exit 0: consistent; 1: findings; 2: bad input.")
    p.add_argument("--train", required=True, metavar="MODULE:FUNCTION",
                   help="the training function train(X, y, seed) -> (model, reported_eps)")
    p.add_argument("--delta", type=_delta, required=True,
                   help="the delta the function's reported eps is for")
    p.add_argument("--n", type=int_at_least(2), default=100, help="rows of the smaller "
                   "data set (the other has n + 1) [100]")
    p.add_argument("--dim", type=int_at_least(1), default=10, help="features per row [10]")
    p.add_argument("--classes", type=int_at_least(2), default=2, help="labels [2]")
    p.add_argument("--seed", type=seed_arg, default=0, help="the data's and the runs' seed [0]")
    p.set_defaults(func=_check)
