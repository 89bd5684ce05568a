"""``dpaudit trials-needed`` and ``trials-needed-plot``: how many trials each way from counts
to epsilon needs (:mod:`dpaudit.experiments.trials_needed`), from the score tables of
cells the Jagielski et al. grids train."""

from __future__ import annotations

from pathlib import Path

from ..config import subset_schema, validate_section
from ..experiments.jagielski import AUDIT_KEYS
from . import FIGURE_HELP, figure_out, out_file, say, seed_arg, spec_arg


def _check_cell(cell: dict, spec: dict, path) -> None:
    """BadInputFile unless the score table at ``path`` is of a cell the trials_needed
    section names (its data set, model, attack, clip, init and one of its eps labels)."""
    from ..experiments.jagielski import init_label
    from ..io import BadInputFile

    want = {"dataset": spec["dataset"], "arch": spec["arch"], "attack": spec["attack"],
            "clip": float(spec["clip"]), "init": init_label(spec["init"])}
    for key, value in [*want.items(), ("eps", spec["eps"])]:
        if cell.get(key) not in (value if key == "eps" else [value]):
            raise BadInputFile(path, f"a score table of the cell with {key} "
                                     f"{cell.get(key)!r}, but trials_needed.{key} is {value!r}")


def _run(args) -> None:
    from ..experiments import trials_needed as tn
    from ..experiments.jagielski import read_scores
    from ..io import write_markdown, write_table

    spec = validate_section(args.spec, "trials_needed")
    audit = validate_section(args.audit, "jagielski",
                             schema_node=subset_schema(AUDIT_KEYS, "jagielski"))
    tables = []
    for path in args.scores:
        scores, prov = read_scores(path)
        _check_cell(prov["cell"], spec, path)
        tables.append((scores, prov["cell"]))

    table = tn.study(tables, audit["alpha"], audit["delta"], audit["select_frac"],
                     spec["n_min"], spec["n_points"], spec["subsamples"], args.seed,
                     say("trials-needed"))
    summ = tn.summary(table, spec["fraction"])
    prov = {"command": "trials-needed", "spec": spec, "audit": audit, "seed": args.seed,
            "scores": [str(p) for p in args.scores]}
    digest = write_table(summ, args.summary, prov)
    write_markdown(tn.markdown(summ, spec["fraction"], audit["alpha"], spec["subsamples"]),
                   args.md, digest)
    write_table(table, args.out, prov)


def _plot(args) -> None:
    from ..plots.trials_needed import plot_trials_needed

    plot_trials_needed(args.table, args.summary, args.out)


def register(subparsers) -> None:
    p = subparsers.add_parser("trials-needed",
                              help="bounds of subsampled trials: how many each method needs")
    p.add_argument("--scores", type=Path, nargs="+", required=True,
                   help="score tables of jagielski-train, one per cell")
    p.add_argument("--spec", type=spec_arg, required=True, help="the trials_needed config section")
    p.add_argument("--audit", type=spec_arg, required=True,
                   help=f"JSON object with the jagielski keys {', '.join(AUDIT_KEYS)}")
    p.add_argument("--seed", type=seed_arg, required=True, help="run seed (config `seed`)")
    p.add_argument("--out", type=out_file, required=True, help="one row per subsample (CSV)")
    p.add_argument("--summary", type=out_file, required=True,
                   help="trials needed per cell and method (CSV)")
    p.add_argument("--md", type=out_file, required=True, help="the summary as Markdown")
    p.set_defaults(func=_run)

    p = subparsers.add_parser("trials-needed-plot", help="median bound against trials per side")
    p.add_argument("--table", type=Path, required=True, help="CSV of trials-needed --out")
    p.add_argument("--summary", type=Path, required=True, help="CSV of trials-needed --summary")
    p.add_argument("--out", type=figure_out, required=True, help=FIGURE_HELP)
    p.set_defaults(func=_plot)
