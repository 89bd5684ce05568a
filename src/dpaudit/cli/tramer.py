"""``dpaudit audit-impl``, ``tramer-audit``, ``tramer-reaudit`` and ``tramer-plot``: audit a
DP training implementation.

``audit-impl`` trains a training function (a registry subject, ``buggy`` or ``fixed``, or a
user's ``module.path:function``; contract in :mod:`dpaudit.subjects`) many times on
Fashion-MNIST with and without a canary and tests its claimed (eps, delta) as in Tramer
et al. 2022, or in a tight mode (``--mode worst-case-init`` or ``white-box``,
:mod:`dpaudit.experiments.tramer`); see ``docs/audit_your_implementation.md``.  Every input is
checked before any training starts.  ``tramer-reaudit`` recomputes an audit table from its
per-run losses (e.g. a GPU run's, on a CPU) and ``tramer-plot`` draws it.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from ..config import SpecError, subset_schema, validate_section
from ..device import DEVICES
from . import FIGURE_HELP, figure_out, out_dir, out_file, seed_arg, spec_arg
from .tramer_plan import CALL_LIMIT, Request, check, positive_int
from .tramer_run import interruptible, run

#: ``--mode`` of audit-impl (:data:`dpaudit.experiments.tramer.MODES`; not imported from
#: there, which would load torch for every command's --help).
MODES = ("black-box", "worst-case-init", "white-box")

#: Keys of the ``tramer`` config section each audit depends on (``dpaudit tramer-audit
#: --target``): the rule passes only these, so editing one audit never reruns the other.
SPEC_KEYS = {
    "case-study": ("implementations", "eps", "delta", "alpha", "canary", "classes", "n_train",
                   "runs", "val_runs", "batch_runs", "model"),
    "user": ("user", "alpha", "classes", "n_train", "batch_runs"),
}


def _sequential(args) -> dict:
    """``--sequential`` and ``--budget`` of audit-impl, checked."""
    if args.budget is not None and not args.sequential:
        raise SpecError(f"--budget={args.budget!r}: only with --sequential")
    if args.sequential and args.store is not None:
        raise SpecError("--store: not with --sequential (a sequential audit keeps no batches)")
    budget = math.inf if args.budget is None else args.budget
    if not budget > 0:  # nan fails too
        raise SpecError(f"--budget={args.budget!r}: must be a number of seconds > 0")
    return {"sequential": args.sequential, "budget": budget}


def _audit_impl(args) -> None:
    try:
        classes = [int(c) for c in args.classes.split(",")]
    except ValueError:
        classes = []
    sequential = _sequential(args)
    plan = check(Request(args.train, args.eps, args.delta, args.alpha, args.runs,
                          args.val_runs, args.n_train, args.batch_runs, classes, args.label,
                          args.spec, seed_check=args.seed_check,
                          max_diverged=args.max_diverged, mode=args.mode, n_aux=args.n_aux,
                          call_limit=args.call_timeout, mates=args.mates,
                          opacus_loop=args.opacus_loop))
    if args.opacus_loop and args.store is not None:
        raise SpecError("--store: not with --opacus-loop (it keeps the registry subjects' "
                        "runs only)")
    plan["threads"] = positive_int(args.threads, "--threads")
    plan.update(sequential)
    # The default mode's provenance is as before the tight modes (and batch mates): byte-
    # identical files; a time limit changes no number.
    tight = () if args.mode == "black-box" else ("mode", "n_aux")
    provenance = {"command": "audit-impl", "spec": args.spec, "seed": args.seed,
                  "args": {k: v for k, v in vars(args).items()
                           if k not in ("func", "call_timeout")
                           and (k not in ("mode", "n_aux") or k in tight)
                           and (k != "mates" or args.mates)
                           and (k != "threads" or args.threads != 1)
                           and (k != "opacus_loop" or args.opacus_loop)
                           and (k not in ("sequential", "budget") or args.sequential)}}
    interruptible("audit-impl", lambda: run(plan, args.canary, args.data_root,
                                              args.download, args.seed, args.out,
                                              args.losses, provenance, args.store))


def _tramer_audit(args) -> None:
    sec = validate_section(args.spec, "tramer",
                           schema_node=subset_schema(SPEC_KEYS[args.target], "tramer"))
    data = validate_section(args.data, "data")
    if args.target == "case-study":
        train, claim, spec = sec["implementations"], sec, sec["model"]
    else:
        claim = sec["user"]
        train, spec = [claim["train"]], json.loads(claim["spec"])
        if not isinstance(spec, dict):
            raise SpecError(f"tramer.user.spec={claim['spec']!r}: must be a JSON object")
    plan = check(Request(train, claim["eps"], claim["delta"], sec["alpha"], claim["runs"],
                          claim["val_runs"], sec["n_train"], sec["batch_runs"], sec["classes"],
                          None, spec, args.device, claim.get("seed_check"),
                          claim.get("max_diverged", 0.0), claim.get("mode", "black-box"),
                          claim.get("n_aux", 500)))
    provenance = {"command": "tramer-audit", "target": args.target, "spec": sec, "data": data,
                  "seed": args.seed}
    interruptible("tramer-audit", lambda: run(plan, claim["canary"], data["root"],
                                                data["download"], args.seed, args.out,
                                                args.losses, provenance, args.store))


def _reaudit(args) -> None:
    import pandas as pd

    from ..experiments import tramer
    from ..io import read_table, write_table
    from ..plots.tramer import LOSS_COLUMNS, loss_histogram

    table, table_prov = read_table(args.table, columns=(*tramer.REAUDIT_COLUMNS, "eps_lb"),
                                   what="tramer-audit")
    # the run key matches the re-trained runs (--accuracy) to these
    retrained = tramer.RUN_KEY if args.accuracy is not None else ()
    losses, losses_prov = read_table(args.losses, columns=(*LOSS_COLUMNS, *retrained),
                                     what="tramer-audit --losses")
    accuracy, acc_prov, source = None, None, tramer.OWN_RUNS
    if args.accuracy is not None:
        accuracy, acc_prov = read_table(args.accuracy,
                                        columns=(*tramer.RUN_KEY, "loss", "test_acc"),
                                        what="tramer-audit --losses (of re-trained runs)")
        where = acc_prov.get("device", {}).get("device")
        source = f"re-trained{f' on {where}' if where else ''} with the same seeds"
    try:
        new = tramer.reaudit(table, losses, accuracy, source)
    except ValueError as exc:
        raise SpecError(str(exc)) from exc
    for old, row in zip(table.to_dict("records"), new.to_dict("records")):
        print(f"tramer-reaudit: {row['implementation']}: eps_LB {row['eps_lb']:.6g} (table "
              f"{old['eps_lb']:.6g}), TPR {row['tpr']:.6g}, FPR {row['fpr']:.6g}: "
              f"{row['verdict']}; test accuracy {row['test_acc_mean']:.3f} "
              f"({row['test_acc_min']:.3f}-{row['test_acc_max']:.3f}) of "
              f"{row['test_acc_models']} models, {source}", file=sys.stderr)
    provenance = {"command": "tramer-reaudit", "table": str(args.table), "losses":
                  str(args.losses), "accuracy": None if args.accuracy is None
                  else str(args.accuracy), "audit": table_prov,
                  "accuracy_audit": acc_prov, "seed": table_prov.get("seed")}
    if accuracy is not None:  # are the re-trained models like the audited ones?
        check = tramer.compare_retrained(losses, accuracy)
        for row in check.itertuples():
            print(f"tramer-reaudit: {row.implementation} {row.split} runs "
                  f"{'with' if row.canary_in else 'without'} the canary: {row.runs} "
                  f"re-trained, canary losses against the same runs' in the losses table: "
                  f"KS {row.ks:.3f} (p = {row.p:.2g})",
                  file=sys.stderr)
        provenance["retrained_vs_audited"] = check.to_dict("records")
    write_table(loss_histogram(losses), args.hist, {**provenance, "of": "evaluation runs"})
    write_table(pd.DataFrame(new), args.out, provenance)


def _plot(args) -> None:
    from ..plots.tramer import plot_canary_losses

    if (args.losses is None) == (args.hist is None):
        raise SpecError("tramer-plot: give exactly one of --losses and --hist")
    plot_canary_losses(args.table, args.out, losses=args.losses, hist=args.hist)


#: ``--store`` of ``audit-impl`` and ``tramer-audit``.
STORE_HELP = ("folder that keeps every finished batch of runs of the registry subjects (buggy, "
              "fixed, half-steps, half-noise), so that a rerun trains only what it lacks; the "
              "subjects of one spec train as columns of the same calls")


def _claim_options(p) -> None:
    """audit-impl's options of the claim and the canary: what is tested."""
    p.add_argument("--train", action="extend", nargs="+", required=True, metavar="TARGET",
                   help="'buggy', 'fixed', 'half-steps', 'half-noise' or 'module.path:function' "
                        "(several: one table row each)")
    p.add_argument("--eps", default=None,
                   help="claimed epsilon (required, but with --opacus-loop, whose claim is "
                        "the eps the training reports; given there, it is recorded)")
    p.add_argument("--delta", required=True, help="claimed delta")
    p.add_argument("--canary", choices=["checkerboard", "clipbkd"], default="checkerboard")
    p.add_argument("--label", type=int, default=None,
                   help="canary label (default: least likely on validation runs without it)")
    p.add_argument("--runs", type=int, required=True, help="evaluation runs per side")
    p.add_argument("--val-runs", type=int, default=100, help="validation runs per side")
    p.add_argument("--alpha", default="1e-10", help="1 - confidence of eps_LB and mu_LB")
    p.add_argument("--spec", type=spec_arg, default={},
                   help="JSON object passed to the training function as `spec`")


def _runs_options(p) -> None:
    """audit-impl's options of the data, the runs, the seed and where the results go."""
    p.add_argument("--classes", default="0,1", help="FMNIST classes, comma-separated")
    p.add_argument("--n-train", type=int, default=500,
                   help="training-set size: the first N of the reference FMNIST subset")
    p.add_argument("--data-root", default=None, help="data folder (default $DPAUDIT_DATA)")
    p.add_argument("--download", action="store_true",
                   help="let torchvision download Fashion-MNIST if no local copy is found")
    p.add_argument("--batch-runs", type=int, default=1000, help="runs per training call")
    p.add_argument("--seed", type=seed_arg, required=True, help="master seed of the runs")
    p.add_argument("--out", type=out_file, required=True, help="audit table CSV")
    p.add_argument("--losses", type=out_file, default=None,
                   help="per-run canary losses CSV (default: OUT with suffix _losses)")
    p.add_argument("--store", type=out_dir, default=None, help=STORE_HELP)


def _integrity_options(p) -> None:
    """audit-impl's options of the checks of the runs' integrity."""
    p.add_argument("--seed-check", type=int, default=None, metavar="K",
                   help="before the runs, train K seeds twice (the second time in reverse "
                        "order) and refuse the function unless each seed gives the same "
                        "logits and different seeds differ; after them, re-train K runs of "
                        "each side drawn from their outputs, and probe that the mode's "
                        "init, canary and mates change the runs; 0 skips these (default 3)")
    p.add_argument("--max-diverged", type=float, default=0.0, metavar="F",
                   help="largest fraction of runs that may diverge (non-finite canary loss; "
                        "they count as 'out'); more, and the audit refuses (default 0)")


def _mode_options(p) -> None:
    """audit-impl's options of the mode: black-box or a tight one, and its inputs."""
    p.add_argument("--mode", choices=MODES, default="black-box",
                   help="black-box: the Tramer et al. 2022 procedure (default); "
                        "worst-case-init: every run starts from the auditor's pre-trained "
                        "parameters, passed as init= (Annamalai and De Cristofaro 2024); "
                        "white-box: a gradient canary inserted at every sampled step, "
                        "passed as canaries=, every iterate scored (Nasr et al. 2023)")
    p.add_argument("--mates", type=float, default=0.0, metavar="M",
                   help="white-box: every example sampled with the canary adds M times its "
                        "direction (Chua et al.'s crafted batch mates, -1; docs/shuffle.md), "
                        "so that shuffled batches under Poisson accounting are caught "
                        "(default 0: none)")
    p.add_argument("--n-aux", type=int, default=500, metavar="N",
                   help="worst-case-init: pre-train the init on the N examples after the "
                        "first --n-train of the reference subset (default 500)")


def _worker_options(p) -> None:
    """audit-impl's options of how a user's training function runs."""
    p.add_argument("--call-timeout", type=float, default=CALL_LIMIT, metavar="SECONDS",
                   help="longest one call of a training function (or of its predict) may "
                        "take; past it the audit stops, naming the call; 0: no limit "
                        f"(default {CALL_LIMIT:g})")
    p.add_argument("--threads", type=int, default=1, metavar="N",
                   help="torch (and OpenMP) threads of the worker process that runs a "
                        "user's training function (default 1; docs/audit_your_implementation.md)")
    p.add_argument("--opacus-loop", action="store_true",
                   help="each --train is a user's own Opacus training, train(X, y, seed) -> "
                        "(model, reported_eps), run unmodified with its Opacus objects "
                        "instrumented, in every mode; the claim is the eps it reports "
                        "(docs/audit_your_implementation.md#opacus-trainings)")


def _sequential_options(p) -> None:
    """audit-impl's options of a sequential audit."""
    p.add_argument("--sequential", action="store_true",
                   help="train the evaluation runs in rounds and stop at the first certified "
                        "violation, anytime-valid (confidence sequences); --runs is then the "
                        "most evaluation runs per side (docs/audit_your_implementation.md)")
    p.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                   help="--sequential: no new round of evaluation runs after SECONDS of them "
                        "(wall clock, after the validation runs; default: none)")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "audit-impl", help="audit a DP training function's claimed (eps, delta) with a canary",
        description="Train TARGET on Fashion-MNIST with and without a canary, RUNS times per "
                    "side (plus VAL_RUNS per side to pick the label and threshold), and test "
                    "the claimed (eps, delta) with Clopper-Pearson at confidence 1 - ALPHA and "
                    "the GDP test (Tramer et al. 2022); where the spec names q and steps (or "
                    "batch_size and epochs), also the claimed DP-SGD privacy profile.")
    _claim_options(p)
    _runs_options(p)
    _integrity_options(p)
    _mode_options(p)
    _worker_options(p)
    _sequential_options(p)
    p.set_defaults(func=_audit_impl)

    p = subparsers.add_parser(
        "tramer-audit", help="the audits of the tramer config section (the rules' entry point)")
    p.add_argument("--target", choices=["case-study", "user"], required=True,
                   help="case-study: tramer.implementations at the section's claim; "
                        "user: tramer.user")
    p.add_argument("--spec", type=spec_arg, required=True,
                   help="the keys of the tramer config section the target depends on")
    p.add_argument("--data", type=spec_arg, required=True, help="the data config section")
    p.add_argument("--device", choices=DEVICES, default="auto",
                   help="where the registry subjects train (tramer.device), unless the "
                        "target's spec names a device")
    p.add_argument("--seed", type=seed_arg, required=True, help="master seed of the runs")
    p.add_argument("--out", type=out_file, required=True, help="audit table CSV")
    p.add_argument("--losses", type=out_file, required=True, help="per-run canary losses CSV")
    p.add_argument("--store", type=out_dir, default=None, help=STORE_HELP)
    p.set_defaults(func=_tramer_audit)

    p = subparsers.add_parser(
        "tramer-reaudit", help="an audit table recomputed from its per-run losses",
        description="Recompute the audit table TABLE of tramer-audit or audit-impl from its "
                    "per-run losses LOSSES (same threshold choice, counts and bounds), add the "
                    "models' test accuracy (from LOSSES, or from ACCURACY: the losses table "
                    "of a re-training of some of the same runs), and write the histogram of "
                    "the evaluation losses that tramer-plot --hist draws.")
    p.add_argument("--table", type=Path, required=True, help="audit table CSV")
    p.add_argument("--losses", type=Path, required=True, help="its per-run losses CSV")
    p.add_argument("--accuracy", type=Path, default=None,
                   help="losses CSV with test_acc of a re-training of some of the same runs "
                        "(same seed and config)")
    p.add_argument("--out", type=out_file, required=True, help="the recomputed audit table CSV")
    p.add_argument("--hist", type=out_file, required=True,
                   help="histogram CSV of the evaluation losses (for tramer-plot --hist)")
    p.set_defaults(func=_reaudit)

    p = subparsers.add_parser("tramer-plot", help="histograms of the canary loss with/without")
    p.add_argument("--table", type=Path, required=True, help="CSV from audit-impl")
    p.add_argument("--losses", type=Path, default=None, help="losses CSV from audit-impl")
    p.add_argument("--hist", type=Path, default=None,
                   help="instead of --losses: histogram CSV from tramer-reaudit")
    p.add_argument("--out", type=figure_out, required=True, help=FIGURE_HELP)
    p.set_defaults(func=_plot)
