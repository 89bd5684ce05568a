"""``dpaudit runs-needed``: how many runs per side an audit-impl audit needs to catch a bug of
``--factor`` times the claim with ``--power``, before they are spent
(:mod:`dpaudit.experiments.runs_needed`)."""

from __future__ import annotations

from ..config import SpecError
from . import say, seed_arg

#: What each mode's count is.
MODES = {"white-box": "the white-box audit's ideal scores (the all-iterates likelihood "
                      "ratio of the Dirac gradient canary)",
         "black-box": "OPTIMISTIC: the ideal white-box scores are the best any attack does; "
                      "a black-box audit needs at least this many runs"}


def _run(args) -> int:
    from ..experiments import runs_needed as rn

    try:
        question = rn.Question(args.eps, args.delta, args.factor, args.q, args.steps,
                               args.alpha, args.power, args.val_runs, args.reps, args.seed,
                               args.max_runs)
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    log = say("runs-needed")
    log(f"claim ({args.eps:g}, {args.delta:g}) at q {args.q:g}, {args.steps} steps; a bug of "
        f"{args.factor:g} x eps; power {args.power:g} at alpha {args.alpha:g}; {args.mode}: "
        f"{MODES[args.mode]}")
    print("runs per side (evaluation + validation) | power | eps_lb median | eps_lb 10% "
          "quantile", flush=True)
    row = lambda r: print(f"{r['runs']} + {r['val_runs']} | {r['power']:.3f} | "  # noqa: E731
                          f"{r['eps_lb_median']:.3f} | {r['eps_lb_q10']:.3f}", flush=True)
    got = rn.answer(question, row)
    head = (f"noise multiplier of the bug {got['sigma_bug']:.4f}; below {got['min_runs']} "
            f"evaluation runs per side no attack can refute the claim")
    if got["runs"] is None:
        print(f"{head}. Not caught with power {args.power:g} within {args.max_runs} "
              "evaluation runs per side.")
        return 0
    val = args.val_runs or got["runs"]
    print(f"{head}. Answer: about {got['runs']} evaluation runs per side (+ {val} "
          f"validation runs per side choosing the threshold) for power {args.power:g} "
          f"({args.reps} replications; {'optimistic, ' if args.mode == 'black-box' else ''}"
          f"see docs/audit_your_implementation.md).")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("runs-needed", help="runs per side that would catch a bug of "
                                                  "k times the claim, before spending them")
    p.add_argument("--eps", type=float, required=True, help="the claimed eps")
    p.add_argument("--delta", type=float, required=True, help="the claimed delta")
    p.add_argument("--factor", type=float, required=True,
                   help="the bug: the true eps is FACTOR times the claim (>= 1)")
    p.add_argument("--alpha", type=float, default=1e-10, help="audit-impl's --alpha")
    p.add_argument("--power", type=float, default=0.9, help="probability of catching it")
    p.add_argument("--mode", choices=tuple(MODES), default="white-box")
    p.add_argument("--q", type=float, default=0.01, help="DP-SGD's sample rate")
    p.add_argument("--steps", type=int, default=100, help="DP-SGD's steps")
    p.add_argument("--val-runs", type=int, default=None,
                   help="validation runs per side (default: as many as the evaluation runs)")
    p.add_argument("--reps", type=int, default=200, help="replications per run count")
    p.add_argument("--max-runs", type=int, default=10 ** 6,
                   help="most evaluation runs per side tried")
    p.add_argument("--seed", type=seed_arg, default=0)
    p.set_defaults(func=_run)
