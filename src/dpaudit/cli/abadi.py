"""Abadi et al. 2016, Figures 3 and 6: ``abadi-features`` pretrains the CIFAR feature CNN
on public images and extracts the private and test features (Figure 6); ``abadi-train``
trains one noise level of a figure and measures it after every epoch; ``abadi-table``
gathers the levels into ``results/abadi_accuracy.csv``; ``abadi-plot`` draws a figure."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..config import SpecError, section_schema, subset_schema, validate_section
from ..device import DEVICES
from . import FIGURE_HELP, figure_out, made_by, out_file, say, seed_arg, spec_arg

from ..experiments.abadi import FEATURE_KEYS, SHARED_KEYS

FIGURES = ("fig3", "fig6")
#: What ``abadi-table`` keeps of each level table's provenance.
LEVEL_PROVENANCE = ("figure", "spec", "level", "data", "features", "seed", "model_seed",
                    "device", "epochs", "dataset", "n", "n_test", "dpaudit_version")


def job_schema(figure: str, keys=None) -> dict:
    """The schema of what one job of ``figure`` is passed: the figure's section without its
    levels (or only ``keys`` of it), plus :data:`SHARED_KEYS` of the ``abadi`` section."""
    props = section_schema("abadi", figure)["properties"]
    node = subset_schema([k for k in props if k != "levels" and (keys is None or k in keys)],
                         "abadi", figure)
    node["properties"].update({k: section_schema("abadi", k) for k in SHARED_KEYS})
    node["required"] += SHARED_KEYS
    return node


def level_schema(figure: str) -> dict:
    return section_schema("abadi", figure)["properties"]["levels"]["items"]


def _features(args) -> None:
    from .. import features
    from ..device import resolve
    from ..experiments import abadi

    spec = validate_section(args.spec, "abadi", "fig6",
                            schema_node=job_schema("fig6", FEATURE_KEYS))
    data = validate_section(args.data, "data")
    arrays, prov = abadi.fig6_features(spec, data, args.seed, resolve(args.device),
                                       say("abadi-features"))
    features.save_features(args.out, arrays, {"command": "abadi-features", "spec": spec,
                                              "data": data, "seed": args.seed, **prov})


def _train(args) -> None:
    from ..device import describe, resolve
    from ..experiments import abadi
    from ..io import write_table

    spec = validate_section(args.spec, "abadi", args.figure, schema_node=job_schema(args.figure))
    level = validate_section(args.level, "abadi", args.figure, "levels",
                             schema_node=level_schema(args.figure))
    if args.figure == "fig3":
        if args.data is None:
            raise SpecError("abadi-train --figure fig3 needs --data (the data config section)")
        data = validate_section(args.data, "data")
    elif args.features is None:
        raise SpecError("abadi-train --figure fig6 needs --features (from abadi-features)")
    device = resolve(args.device)
    log = say("abadi-train")
    prov = {"command": "abadi-train", "figure": args.figure, "spec": spec, "level": level,
            "seed": args.seed, "device": describe(device)["device"]}
    if args.figure == "fig3":
        rows, info = abadi.fig3_level(spec, level, data, args.seed, device, log)
        prov["data"] = data
    else:
        from ..features import load_features

        arrays, feat = load_features(args.features, ("X", "y", "X_test", "y_test"))
        made_by(feat, args.features, "abadi-features")
        rows, info = abadi.fig6_level(spec, level, arrays, feat["pretrained_on"], args.seed,
                                      device, log, jpeg_reencoded=feat["jpeg_reencoded"])
        prov["features"] = {k: feat[k] for k in ("pretrained_on", "public_images",
                                                  "pretrain_epochs", "source", "n", "n_test")}
    write_table(rows, args.out, {**prov, **info})


def _table(args) -> None:
    import pandas as pd

    from ..experiments.abadi import SUMMARY_COLUMNS, summary
    from ..io import read_table, write_table

    frames, sources, levels = [], {}, {}
    for path in args.tables:
        df, prov = read_table(path, columns=SUMMARY_COLUMNS, what="abadi-train")
        level = json.dumps([prov.get("figure"), prov.get("level")], sort_keys=True)
        if level in levels:  # the same file twice, or two tables of one level
            raise SpecError(f"--tables: {path} and {levels[level]} are both the table of "
                            f"{prov.get('figure')} level {prov.get('level')}; give each "
                            "level once")
        levels[level] = path
        frames.append(df)
        # Each level's config (spec, level, data or features) and seeds, so that the summed
        # table records what made every row.
        sources[str(path)] = {k: prov[k] for k in LEVEL_PROVENANCE if k in prov}
    table = pd.concat(frames, ignore_index=True)
    write_table(table, args.out, {"command": "abadi-table", "levels": sources})
    last = summary(table)[[*SUMMARY_COLUMNS, "paper_test_acc"]]
    print(f"dpaudit abadi-table: last epoch of every level\n{last.to_string(index=False)}",
          file=sys.stderr)


def _plot(args) -> None:
    from ..plots.abadi import plot_abadi

    plot_abadi(args.table, args.figure, args.out)


def register(subparsers) -> None:
    p = subparsers.add_parser("abadi-features",
                              help="Abadi et al. Fig. 6: pretrain the CIFAR CNN on public "
                                   "images, extract private and test features")
    p.add_argument("--spec", type=spec_arg, required=True,
                   help="the abadi.fig6 keys the features depend on (JSON), with delta and "
                        "accountant")
    p.add_argument("--data", type=spec_arg, required=True, help="the data config section")
    p.add_argument("--seed", type=seed_arg, required=True)
    p.add_argument("--device", choices=DEVICES, default="auto")
    p.add_argument("--out", type=out_file, required=True, help="features .npz")
    p.set_defaults(func=_features)

    p = subparsers.add_parser("abadi-train",
                              help="Abadi et al. Fig. 3 or 6: train one noise level, measure "
                                   "train/test accuracy and eps after every epoch")
    p.add_argument("--figure", choices=FIGURES, required=True)
    p.add_argument("--spec", type=spec_arg, required=True,
                   help="the abadi.<figure> section without its levels, with abadi.delta "
                        "and abadi.accountant (JSON)")
    p.add_argument("--level", type=spec_arg, required=True,
                   help="one entry of abadi.<figure>.levels (JSON)")
    p.add_argument("--data", type=spec_arg, help="the data config section (fig3)")
    p.add_argument("--features", type=Path, help="features .npz of abadi-features (fig6)")
    p.add_argument("--seed", type=seed_arg, required=True)
    p.add_argument("--device", choices=DEVICES, default="auto")
    p.add_argument("--out", type=out_file, required=True, help="the level's CSV")
    p.set_defaults(func=_train)

    p = subparsers.add_parser("abadi-table", help="gather the levels' tables into one")
    p.add_argument("--tables", type=Path, nargs="+", required=True)
    p.add_argument("--out", type=out_file, required=True, help="results/abadi_accuracy.csv")
    p.set_defaults(func=_table)

    p = subparsers.add_parser("abadi-plot", help="draw Abadi et al. Fig. 3 or 6 from the table")
    p.add_argument("--figure", choices=FIGURES, required=True)
    p.add_argument("--table", type=Path, required=True, help="results/abadi_accuracy.csv")
    p.add_argument("--out", type=figure_out, required=True, help=FIGURE_HELP)
    p.set_defaults(func=_plot)
