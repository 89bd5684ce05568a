"""Tight audits of DP-SGD (:mod:`dpaudit.experiments.tight`): ``dpaudit
tight-whitebox-audit``, the white-box multi-run audit (Nasr et al. 2023), and ``dpaudit
tight-blackbox-audit``, the worst-case-init black-box audit (Annamalai and De Cristofaro
2024), each one row per arch x eps label x method on a Jagielski task; ``dpaudit
tight-table`` puts both beside the last-iterate heuristic (Steinke et al. 2025) in one
table, with the ClipBKD rows of a Figure 2 table and the white-box rows of a one-run
table in the same cells, and ``dpaudit tight-plot`` draws it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import SpecError, section_schema, subset_schema, validate_section
from ..device import DEVICES, resolve
from ..trials import Execution
from . import (FIGURE_HELP, FMNIST_TRAIN, figure_out, fmnist_train_schema, kept_folder, made_by,
               out_dir, out_file, say, seed_arg, spec_arg)

if TYPE_CHECKING:
    import pandas as pd

#: Keys of the ``tight`` section that the rules pass otherwise: the white box's noise goes
#: in ``--train``, the device in ``--device``, the black box's set-up in its own spec.
_NOT_IN_SPEC = ("noise", "device", "blackbox")
#: Keys of ``--spec``: the ``tight`` section's keys but those (config/README.md).
SPEC_KEYS = tuple(k for k in section_schema("tight")["properties"] if k not in _NOT_IN_SPEC)
#: Keys of the ``tight`` section in the black-box ``--spec``, beside every key of
#: ``tight.blackbox`` and the model's hidden width (``jagielski.datasets.fmnist.hidden``).
BLACKBOX_SHARED = ("runs", "archs", "eps", "alpha", "delta")


def blackbox_schema() -> dict:
    """The schema of the black-box ``--spec``: :data:`BLACKBOX_SHARED` of ``tight``, the
    whole of ``tight.blackbox`` and ``hidden``, every key required."""
    node = subset_schema(BLACKBOX_SHARED, "tight")
    box = section_schema("tight", "blackbox")["properties"]
    node["properties"].update(box, hidden=section_schema(*FMNIST_TRAIN["hidden"])
                              ["properties"]["hidden"])
    node["required"] = list(node["properties"])
    return node


#: Columns of ``results/tight_audit.csv``, in order (docs/results.md).
TABLE_COLUMNS = ("method", "threat_model", "relation", "kind", "setting", "arch",
                 "eps_label", "eps_th", "eps_rdp", "eps_lb", "certified", "runs", "mu_lb",
                 "eps_lb_gdp", "tpr", "fpr", "auc", "eps_lb_ratio", "noise", "q", "steps",
                 "n", "alpha", "delta", "seed")


def _task(path):
    """``(task, provenance)`` of a task file from jagielski-task (a bad file is named)."""
    from .. import features
    from ..experiments.jagielski import TASK_ARRAYS, Task

    arrays, prov = features.load_features(path, TASK_ARRAYS)
    return Task.from_arrays(arrays), prov


def _audit(args) -> None:
    import pandas as pd

    from .. import dpsgd
    from ..experiments.tight import whitebox
    from ..io import write_table

    from ..experiments.checks import split_problems

    spec = validate_section(args.spec, "tight", schema_node=subset_schema(SPEC_KEYS, "tight"))
    train = validate_section(args.train, "--train", schema_node=fmnist_train_schema())
    missing = [e for e in spec["eps"] if e not in train["noise"]]
    if missing:
        raise SpecError(f"tight.eps: {missing} must be keys of --train.noise (allowed: "
                        f"{sorted(train['noise'])})")
    found = split_problems("tight.select_frac", spec["select_frac"], "tight.runs", spec["runs"])
    if found:
        raise SpecError(found[0])
    task, task_prov = _task(args.task)
    log, device, rows = say("tight-whitebox-audit"), resolve(args.device), []
    for arch in spec["archs"]:
        model = dpsgd.ModelSpec(arch, task.X.shape[1], train["hidden"])
        for label in spec["eps"]:
            cfg = dpsgd.DPSGDConfig(train["epochs"], train["batch_size"], train["lr"],
                                    train["clip"], float(train["noise"][label]), "poisson")
            try:
                got = whitebox.audit(task.X, task.y, model, cfg, spec["runs"], args.seed,
                                     spec["alpha"], spec["delta"], spec["select_frac"],
                                     execution=Execution(
                                         device, log=log, what=f"{arch} eps {label}: ",
                                         store=kept_folder(args.store, f"{arch}_eps{label}")))
            except ValueError as exc:  # a bad runs, alpha, delta or select_frac, by name
                raise SpecError(f"--spec: {exc}") from exc
            rows += [{"eps_label": label, **r} for r in got]
            log(f"{arch} eps {label}: " + ", ".join(
                f"{r['method']} eps_lb {r['eps_lb']:.3f}" for r in got)
                + f" (eps_th {got[0]['eps_th']:.3g})")
    write_table(pd.DataFrame(rows), args.out,
                {"command": "tight-whitebox-audit", "spec": spec, "train": train,
                 "seed": args.seed, "device": args.device, "task": task_prov})


def _blackbox(args) -> None:
    import pandas as pd

    from .. import dpsgd
    from ..experiments.tight import blackbox
    from ..io import write_table

    spec = validate_section(args.spec, "tight", schema_node=blackbox_schema())
    labels = []
    for label in spec["eps"]:
        try:
            labels.append((label, float(label)))
        except (TypeError, ValueError):
            labels.append((label, math.nan))
    if not labels or any(not v > 0 for _, v in labels):  # nan fails too
        raise SpecError(f"tight.eps={spec['eps']!r}: must be a list of eps labels, numbers > 0 "
                        f"or \"inf\"")
    task, task_prov = _task(args.task)
    log, device, rows = say("tight-blackbox-audit"), resolve(args.device), []
    for arch in spec["archs"]:
        model = dpsgd.ModelSpec(arch, task.X.shape[1], spec["hidden"])
        for label, _ in labels:
            try:
                noise = blackbox.blackbox_noise(label, spec["steps"], spec["delta"])
                setting = blackbox.FullBatch(spec["steps"], spec["lr"], spec["clip"], noise)
                auditor = blackbox.Auditor(tuple(spec["inits"]), spec["canary"],
                                           spec["n_aux"], spec["n"])
                got = blackbox.audit(task, model, setting, spec["runs"], args.seed, auditor,
                                     spec["alpha"], spec["delta"], execution=Execution(
                                         device, log=log, what=f"{arch} eps {label}: ",
                                         store=kept_folder(args.store, f"{arch}_eps{label}")))
            except ValueError as exc:  # a bad runs, size, canary or init, by name
                raise SpecError(f"--spec: {exc}") from exc
            rows += [{"eps_label": label, "hidden": spec["hidden"] if arch != "lr" else "",
                      **r} for r in got]
            log(f"{arch} eps {label}: " + ", ".join(
                f"{r['method']} eps_lb {r['eps_lb']:.3f}" for r in got)
                + f" (eps_th {got[0]['eps_th']:.3g})")
    write_table(pd.DataFrame(rows), args.out,
                {"command": "tight-blackbox-audit", "spec": spec, "seed": args.seed,
                 "device": args.device, "task": task_prov})


def assemble(whitebox, blackbox, clipbkd=None, onerun=None, log=lambda msg: None
             ) -> "pd.DataFrame":
    """The rows of ``results/tight_audit.csv`` (:data:`TABLE_COLUMNS`) from the tables of
    ``tight-whitebox-audit`` and ``tight-blackbox-audit`` (either may be None): every audit
    row (``kind`` measurement), the white-box GDP estimates as rows of their own (method
    ``<method>-gdp``, ``certified`` False, as the black-box table has them), and per set-up
    (``setting`` x arch x eps label) one ``last-iterate-heuristic`` row: the eps of
    releasing only the last iterate with linear losses (Steinke et al. 2025), a theory line
    (``kind`` theory, ``certified`` False, no runs), not a measurement. ``clipbkd`` and
    ``onerun``: ``(table, provenance, path)`` of a Figure 2 and a one-run table, whose rows
    in the tight audits' cells (arch x eps label) join the table, each with its own
    relation and ``eps_th`` (:mod:`dpaudit.experiments.tight.joined`; a cell they lack is
    skipped with a ``log`` line)."""
    import pandas as pd

    from ..experiments.jagielski import eps_label
    from ..experiments.tight import joined
    from ..last_iterate import last_iterate_epsilon

    parts = []
    if whitebox is not None:
        wb = whitebox.assign(setting="poisson")
        gdp = wb.assign(method=wb.method + "-gdp", eps_lb=wb.eps_lb_gdp, certified=False)
        parts += [wb, gdp]
    if blackbox is not None:
        parts.append(blackbox.rename(columns={"noise_multiplier": "noise"})
                     .assign(setting="full-batch", q=1.0))
    if not parts:
        raise ValueError("no audit table given")
    df = pd.concat(parts, ignore_index=True)
    df["eps_label"] = df.eps_label.map(eps_label)
    df["kind"] = "measurement"
    theory = df.drop_duplicates(["setting", "arch", "eps_label"]).copy()
    cells = list(dict.fromkeys(zip(theory.arch, theory.eps_label)))
    theory["eps_lb"] = [last_iterate_epsilon(r.noise, r.q, int(r.steps), r.delta)
                        for r in theory.itertuples()]
    theory = theory.assign(method="last-iterate-heuristic", threat_model="last-iterate",
                           kind="theory", certified=False, runs=0)
    for column in ("mu_lb", "eps_lb_gdp", "tpr", "fpr", "auc", "alpha", "seed"):
        theory[column] = math.nan
    joins = [rows(*given[:2], cells, log, source=given[2]) for rows, given in
             ((joined.clipbkd_rows, clipbkd), (joined.onerun_rows, onerun)) if given]
    joins = [j.assign(eps_label=j.eps_label.map(eps_label), kind="measurement")
             for j in joins if not j.empty]
    df = pd.concat([df, theory, *joins], ignore_index=True)
    df["eps_lb_ratio"] = df.eps_lb / df.eps_th  # 0 where eps_th is inf
    df["certified"] = df.certified.astype(bool)
    return df[list(TABLE_COLUMNS)].sort_values(
        ["setting", "arch", "eps_th", "kind", "method"], kind="stable").reset_index(drop=True)


def _table(args) -> None:
    from ..experiments.tight import joined
    from ..io import read_table, write_table

    tables = {}
    for name, path in (("whitebox", args.whitebox), ("blackbox", args.blackbox)):
        tables[name] = read_table(path) if path else (None, None)
        if path:
            made_by(tables[name][1], path, f"tight-{name}-audit")
    if all(df is None for df, _ in tables.values()):
        raise SpecError("tight-table: give --whitebox, --blackbox or both (--clipbkd and "
                        "--onerun add rows in their cells)")
    given = {}
    for name, what, columns in (
            ("clipbkd", "jagielski-audit --experiment fig2", joined.CLIPBKD_COLUMNS),
            ("onerun", "onerun-audit", joined.ONERUN_COLUMNS)):
        path = getattr(args, name)
        if path is not None:
            given[name] = (*read_table(path, columns=columns, what=what),
                           path)
    df = assemble(tables["whitebox"][0], tables["blackbox"][0], **given,
                  log=say("tight-table"))
    write_table(df, args.out, {"command": "tight-table",
                               **{f"{k}_table": prov for k, (_, prov) in tables.items()},
                               **{f"{k}_table": prov for k, (_, prov, _) in given.items()}})


def _plot(args) -> None:
    from ..io import read_provenance
    from ..plots.tight import plot_tight

    made_by(read_provenance(args.table), args.table, "tight-table")
    plot_tight(args.table, args.out)


def training_args(p, cells: str = "model and eps label") -> None:
    """The arguments the audits of a Jagielski task share (these and shuffle-audit): the
    task, the seed, the device, the output and the store (one subfolder per ``cells``)."""
    p.add_argument("--task", type=Path, required=True, help="task file from jagielski-task")
    p.add_argument("--seed", type=seed_arg, required=True, help="run seed (config `seed`)")
    p.add_argument("--device", default="auto", choices=DEVICES, help="where models train")
    p.add_argument("--out", type=out_file, required=True, help="result table (CSV)")
    p.add_argument("--store", type=out_dir, default=None, metavar="DIR",
                   help=f"folder that keeps every finished batch of runs (one subfolder per "
                        f"{cells}), so that a rerun trains only what it lacks")


def register(subparsers) -> None:
    p = subparsers.add_parser("tight-whitebox-audit",
                              help="white-box multi-run audit of DP-SGD (gradient canary, "
                                   "every iterate)")
    p.add_argument("--spec", type=spec_arg, required=True,
                   help=f"JSON with keys {', '.join(SPEC_KEYS)} (runs per side)")
    p.add_argument("--train", type=spec_arg, required=True,
                   help=f"DP-SGD set-up, JSON with keys {', '.join(FMNIST_TRAIN)} (noise: "
                        f"{{eps label: noise multiplier}})")
    training_args(p)
    p.set_defaults(func=_audit)

    p = subparsers.add_parser("tight-blackbox-audit",
                              help="black-box audit of full-batch DP-SGD from worst-case "
                                   "initial parameters (final model only)")
    p.add_argument("--spec", type=spec_arg, required=True,
                   help=f"JSON with keys {', '.join(blackbox_schema()['properties'])} (runs "
                        f"per side; the "
                        f"noise of each eps label is calibrated by PLD)")
    training_args(p)
    p.set_defaults(func=_blackbox)

    p = subparsers.add_parser("tight-table", help="the tight audits and the last-iterate "
                                                  "heuristic in one table")
    p.add_argument("--whitebox", type=Path, default=None, help="CSV from tight-whitebox-audit")
    p.add_argument("--blackbox", type=Path, default=None, help="CSV from tight-blackbox-audit")
    p.add_argument("--clipbkd", type=Path, default=None,
                   help="Figure 2 table (jagielski-audit --experiment fig2): its FMNIST ClipBKD "
                        "rows in the tight audits' cells")
    p.add_argument("--onerun", type=Path, default=None,
                   help="one-run table (onerun-audit): its white-box rows in the tight "
                        "audits' cells")
    p.add_argument("--out", type=out_file, required=True, help="result table (CSV)")
    p.set_defaults(func=_table)

    p = subparsers.add_parser("tight-plot", help="draw how tight each audit is against eps_th")
    p.add_argument("--table", type=Path, required=True, help="CSV from tight-table")
    p.add_argument("--out", type=figure_out, required=True, help=FIGURE_HELP)
    p.set_defaults(func=_plot)
