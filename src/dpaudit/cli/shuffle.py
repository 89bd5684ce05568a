"""The shuffling gap (:mod:`dpaudit.experiments.shuffle`): ``dpaudit shuffle-audit``, the
white-box audit of shuffled and Poisson DP-SGD that all report Poisson accounting, one row
per setting x subject x batch mates x method, and ``dpaudit shuffle-plot``, its figure."""

from __future__ import annotations

from pathlib import Path

from ..config import SpecError, section_schema, subset_schema, validate_section
from ..device import resolve
from ..experiments.checks import shuffle_problems
from ..experiments.shuffle_settings import SHUFFLING, Setting, trains
from . import FIGURE_HELP, figure_out, kept_folder, made_by, say, spec_arg
from .tight import training_args

#: Keys of ``--spec``: the config section ``shuffle`` without ``device`` (the rule passes
#: it as ``--device``), read from the schema (config/README.md).
SPEC_KEYS = tuple(k for k in section_schema("shuffle")["properties"] if k != "device")
#: Columns of ``results/shuffle_audit.csv``, in order (docs/results.md).
TABLE_COLUMNS = ("subject", "sampling", "accounting", "claimed_eps", "eps_lb", "certified",
                 "violation", "runs", "method", "threat_model", "relation", "mates",
                 "shuffle_lb", "eps_upper", "eps_lb_gdp", "mu_lb", "tpr", "fpr", "auc",
                 "arch", "hidden", "n", "batch_size", "steps_per_epoch", "epochs", "steps",
                 "noise", "clip", "alpha", "delta", "select_frac", "seed")


def settings(spec: dict) -> list:
    """The spec's settings, ``(Setting, runs per side)`` each
    (:class:`dpaudit.experiments.shuffle.Setting`), after the whole spec is checked against
    the schema's ``shuffle`` section and against the limits relating its keys that need no
    data (:func:`dpaudit.experiments.checks.shuffle_problems`): all before any training."""
    validate_section(spec, "shuffle", schema_node=subset_schema(SPEC_KEYS, "shuffle"))
    found = shuffle_problems(spec)
    if found:
        raise SpecError(found[0])
    return [(Setting(**{k: v for k, v in s.items() if k != "runs"}),
             s.get("runs", spec["runs"])) for s in spec["settings"]]


def _audit(args) -> None:
    import pandas as pd

    from ..experiments import shuffle
    from ..io import write_table
    from .tight import _task

    spec = args.spec
    grid = settings(spec)
    task, task_prov = _task(args.task)
    too_big = [s.label() for s, _ in grid if s.n > len(task.X)]
    if too_big:
        raise SpecError(f"shuffle.settings: batch_size x steps_per_epoch must be at most the "
                        f"task's {len(task.X)} training rows; {too_big[0]} is not")
    log, rows = say("shuffle-audit"), []
    job = shuffle.Job(spec["alpha"], spec["delta"], spec["select_frac"], spec["hidden"],
                      spec["lr"], spec["clip"], resolve(args.device), log=log)
    for setting, runs in grid:
        lines = shuffle.theory(setting, spec["delta"])
        log(f"{setting.label()}: noise {lines['noise']:.4f}, claim {lines['claimed_eps']:.3f}"
            + "".join(f", {s} lower bound {lines[s][0]:.3f}" for s in SHUFFLING))
        for subject in spec["subjects"]:
            if not trains(subject, setting.epochs):
                log(f"{setting.label()}: shuffle-once at one epoch is shuffle; not trained "
                    f"again")
                continue
            for mates in spec["mates"]:
                what = f"{setting.label()} {subject} mates {mates:g}: "
                store = kept_folder(args.store, f"{setting.label()}_{subject}_mates{mates:g}")
                try:
                    got = shuffle.audit(task.X, task.y, setting, subject, mates, runs,
                                        args.seed, job, lines, store, what)
                except ValueError as exc:  # a bad runs, alpha, delta, lr..., by name
                    raise SpecError(f"--spec: {exc}") from exc
                rows += got
                log(what + ", ".join(f"{r['method']} eps_lb {r['eps_lb']:.3f}"
                                     + (" (violation)" if r["violation"] else "")
                                     for r in got))
    df = pd.DataFrame(rows)[list(TABLE_COLUMNS)]
    write_table(df, args.out, {"command": "shuffle-audit", "spec": spec, "seed": args.seed,
                               "device": args.device, "task": task_prov})


def _plot(args) -> None:
    from ..io import read_provenance
    from ..plots.shuffle import plot_shuffle

    made_by(read_provenance(args.table), args.table, "shuffle-audit")
    plot_shuffle(args.table, args.out)


def register(subparsers) -> None:
    p = subparsers.add_parser("shuffle-audit",
                              help="white-box audit of shuffled DP-SGD reported with Poisson "
                                   "accounting, beside Poisson DP-SGD")
    p.add_argument("--spec", type=spec_arg, required=True,
                   help=f"JSON with keys {', '.join(SPEC_KEYS)} (config `shuffle` without "
                        f"device, config/README.md)")
    training_args(p, "setting, subject and batch mates")
    p.set_defaults(func=_audit)

    p = subparsers.add_parser("shuffle-plot", help="draw the shuffle audit against its claims "
                                                   "and theory lines")
    p.add_argument("--table", type=Path, required=True, help="CSV from shuffle-audit")
    p.add_argument("--out", type=figure_out, required=True, help=FIGURE_HELP)
    p.set_defaults(func=_plot)
