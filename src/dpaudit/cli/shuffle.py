"""The shuffling gap (:mod:`dpaudit.experiments.shuffle`): ``dpaudit shuffle-audit``, the
white-box audit of shuffled and Poisson DP-SGD that all report Poisson accounting, one row
per setting x subject x batch mates x method, and ``dpaudit shuffle-plot``, its figure."""

from __future__ import annotations

from pathlib import Path

from ..config import SpecError
from ..device import resolve
from . import FIGURE_HELP, figure_out, kept_folder, made_by, say, spec_arg
from .tight import training_args

#: Keys of ``--spec`` (config ``shuffle``, config/README.md).
SPEC_KEYS = ("settings", "subjects", "mates", "runs", "hidden", "lr", "clip", "alpha",
             "delta", "select_frac")
#: Keys of each setting, and its optional key (runs per side in place of ``runs``).
SETTING_KEYS = ("arch", "batch_size", "steps_per_epoch", "epochs", "eps")
SETTING_OPTIONAL = ("runs",)
#: Columns of ``results/shuffle_audit.csv``, in order (docs/results.md).
TABLE_COLUMNS = ("subject", "sampling", "accounting", "claimed_eps", "eps_lb", "certified",
                 "violation", "runs", "method", "threat_model", "relation", "mates",
                 "shuffle_lb", "eps_upper", "eps_lb_gdp", "mu_lb", "tpr", "fpr", "auc",
                 "arch", "hidden", "n", "batch_size", "steps_per_epoch", "epochs", "steps",
                 "noise", "clip", "alpha", "delta", "select_frac", "seed")


def _keys(value: dict, allowed: tuple, flag: str) -> None:
    from .tight import _keys as keys

    keys(value, allowed, flag)


def settings(spec: dict) -> list:
    """The spec's settings, ``(Setting, runs per side)`` each
    (:class:`dpaudit.experiments.shuffle.Setting`), each checked by name; subjects and
    mates checked too."""
    from ..experiments import shuffle

    _keys(spec, SPEC_KEYS, "--spec")
    if not isinstance(spec["settings"], list) or not spec["settings"]:
        raise SpecError("--spec.settings: must be a non-empty list of settings")
    out = []
    for i, setting in enumerate(spec["settings"]):
        flag = f"--spec.settings[{i}]"
        if not isinstance(setting, dict):
            raise SpecError(f"{flag}: must be a mapping with keys {list(SETTING_KEYS)}")
        runs = setting.get("runs", spec["runs"])
        _keys({k: v for k, v in setting.items() if k not in SETTING_OPTIONAL}, SETTING_KEYS,
              flag)
        try:
            out.append((shuffle.Setting(**{k: setting[k] for k in SETTING_KEYS}), runs))
        except ValueError as exc:
            raise SpecError(f"{flag}.{exc}") from exc
    bad = [s for s in spec["subjects"] if s not in shuffle.SUBJECTS] \
        if isinstance(spec["subjects"], list) else True
    if bad or not spec["subjects"]:
        raise SpecError(f"--spec.subjects={spec['subjects']!r}: must be a non-empty list of "
                        f"{list(shuffle.SUBJECTS)}")
    mates = spec["mates"]
    if not isinstance(mates, list) or not mates or any(
            isinstance(m, bool) or not isinstance(m, (int, float)) or not -1 <= m <= 1
            for m in mates):
        raise SpecError(f"--spec.mates={mates!r}: must be a non-empty list of numbers in "
                        f"[-1, 1] (each batch mate's gradient along the canary)")
    return out


def _audit(args) -> None:
    import pandas as pd

    from ..experiments import shuffle
    from ..io import write_table
    from .tight import _task

    spec = args.spec
    grid = settings(spec)
    if set(spec["subjects"]) == {"shuffle-once"} and all(s.epochs == 1 for s, _ in grid):
        raise SpecError("--spec: nothing to audit: shuffle-once at one epoch is shuffle and is "
                        "not trained again; give another subject or a setting with epochs > 1")
    task, task_prov = _task(args.task)
    too_big = [s.label() for s, _ in grid if s.n > len(task.X)]
    if too_big:
        raise SpecError(f"--spec.settings: batch_size x steps_per_epoch must be at most the "
                        f"task's {len(task.X)} training rows; {too_big[0]} is not")
    log, device, rows = say("shuffle-audit"), resolve(args.device), []
    for setting, runs in grid:
        lines = shuffle.theory(setting, spec["delta"])
        log(f"{setting.label()}: noise {lines['noise']:.4f}, claim {lines['claimed_eps']:.3f}"
            + "".join(f", {s} lower bound {lines[s][0]:.3f}" for s in shuffle.SHUFFLING))
        for subject in spec["subjects"]:
            if subject == "shuffle-once" and setting.epochs == 1:
                log(f"{setting.label()}: shuffle-once at one epoch is shuffle; not trained "
                    f"again")
                continue
            for mates in spec["mates"]:
                what = f"{setting.label()} {subject} mates {mates:g}: "
                store = kept_folder(args.store, f"{setting.label()}_{subject}_mates{mates:g}")
                try:
                    got = shuffle.audit(task.X, task.y, setting, subject, mates, runs,
                                        args.seed, spec["alpha"], spec["delta"],
                                        spec["select_frac"], hidden=spec["hidden"],
                                        lr=spec["lr"], clip=spec["clip"], lines=lines,
                                        device=device, log=log, store=store, what=what)
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
                   help=f"JSON with keys {', '.join(SPEC_KEYS)}; each setting with keys "
                        f"{', '.join(SETTING_KEYS)} and optionally runs (config `shuffle`)")
    training_args(p, "setting, subject and batch mates")
    p.set_defaults(func=_audit)

    p = subparsers.add_parser("shuffle-plot", help="draw the shuffle audit against its claims "
                                                   "and theory lines")
    p.add_argument("--table", type=Path, required=True, help="CSV from shuffle-audit")
    p.add_argument("--out", type=figure_out, required=True, help=FIGURE_HELP)
    p.set_defaults(func=_plot)
