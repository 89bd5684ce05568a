"""``dpaudit jagielski-*``: the DP-SGD audits of Jagielski et al. 2020.

``jagielski-task`` prepares a data set's task (FMNIST, or CIFAR-10 features of a
pretrained CNN) once; ``jagielski-init`` draws the shared "fixed" initialisation;
``jagielski-train`` trains and scores the cells of one set-up and attack at several eps
labels (every side, T trials each) into one score table per cell; ``jagielski-audit``
turns the score tables of Figure 2 or Table 2 into bounds; ``jagielski-plot`` draws them
and ``jagielski-md`` writes Table 2's Markdown from its table (as from ``reference/``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..config import SpecError, section_schema, subset_schema, validate_section
from ..device import DEVICES, resolve
from . import (FIGURE_HELP, figure_out, int_at_least, made_by, out_dir, out_file, say, seed_arg,
               spec_arg)

from ..experiments.jagielski import AUDIT_KEYS, MADE_WITH_KEYS, PAPER_TOL, TASK_KEYS, TRAIN_KEYS


def _train_schema(dataset: str) -> dict:
    """The schema of ``jagielski-train --spec`` (:data:`TRAIN_KEYS`): each key the
    ``jagielski`` section's where it has it, else the data set's section's; ``noise`` only
    for the eps labels the job trains."""
    jag = section_schema("jagielski")["properties"]
    per_dataset = section_schema("jagielski", "datasets", dataset)["properties"]
    props = {k: jag[k] if k in jag else per_dataset[k] for k in TRAIN_KEYS}
    props["noise"] = {**per_dataset["noise"], "minProperties": 1,
                      "description": "DP-SGD noise multiplier of each eps label the job trains"}
    return {"type": "object", "additionalProperties": False, "required": list(TRAIN_KEYS),
            "properties": props}


def _dpsgd_config(ds: dict, clip: float, noise: float, init: str, sampling: str):
    """DP-SGD hyper-parameters of a cell (``init``: ``fixed`` or ``g<Glorot scale>``, as
    :func:`_cells` checked)."""
    from ..dpsgd import DPSGDConfig

    if init == "fixed":
        return DPSGDConfig(ds["epochs"], ds["batch_size"], ds["lr"], clip, noise, sampling, "fixed")
    return DPSGDConfig(ds["epochs"], ds["batch_size"], ds["lr"], clip, noise, sampling,
                       "glorot", float(init[1:]))


def _task(args) -> None:
    from .. import features
    from ..experiments import jagielski

    keys = [k for k in TASK_KEYS if k in section_schema("jagielski", "datasets", args.dataset)
            ["properties"]]
    ds = validate_section(args.spec, "jagielski", "datasets", args.dataset,
                          schema_node=subset_schema(keys, "jagielski", "datasets", args.dataset))
    data = validate_section(args.data, "data")
    log = say("jagielski-task")
    common = {"root": data["root"], "download": data["download"],
              "seed": args.seed, "clipbkd_norm": ds.get("clipbkd_norm")}
    if args.dataset == "fmnist":
        task, prov = jagielski.fmnist_task(**common)
    else:
        task, prov = jagielski.cifar_task(**common, tarball=data["cifar10_tarball"],
                                          cifar100_root=data["cifar100_root"],
                                          pretrain_epochs=ds["pretrain_epochs"],
                                          pretrain_images=ds["pretrain_images"],
                                          device=resolve(args.device), log=log)
    log(f"{prov['source']}: n={prov['n']}, ClipBKD label y_p={task.y_p}, "
        f"|x_p|={float((task.x_p ** 2).sum()) ** 0.5:.3g}")
    features.save_features(args.out, task.arrays(),
                           {"command": "jagielski-task", "spec": ds, "data": data,
                            "seed": args.seed, **prov})


def _init(args) -> None:
    from .. import dpsgd, features

    arrays, prov = features.load_features(args.task, ["X"])
    made_by(prov, args.task, "jagielski-task", dataset=args.dataset)
    model = dpsgd.ModelSpec(args.arch, arrays["X"].shape[1], args.hidden)
    # On the CPU: init draws differ across devices, and the shared "fixed" init must not
    # depend on the machine that happened to draw it.
    dpsgd.save_params(args.out, dpsgd.init_params(model, 1, [args.seed], device="cpu"), model)


def _cells_schema() -> dict:
    """The schema of ``--cells``: a non-empty list of distinct ``[clip, init label, eps
    label]``, the clip as ``jagielski.fig2.clip``, the init ``fixed`` or ``g<Glorot
    scale>`` (its scale checked as the config's, by :func:`_cells`), the eps label as a
    key of ``jagielski.datasets.<name>.noise``."""
    fig2 = section_schema("jagielski", "fig2")["properties"]
    noise = section_schema("jagielski", "datasets", "fmnist")["properties"]["noise"]
    init = {"type": "string", "pattern": "^(fixed|g.+)$",
            "description": "fixed or g<Glorot scale>, e.g. g1"}
    label = {"type": "string", **noise["propertyNames"], "description": "an eps label"}
    return {"type": "array", "minItems": 1, "uniqueItems": True,
            "items": {"type": "array", "minItems": 3, "maxItems": 3,
                      "prefixItems": [fig2["clip"], init, label],
                      "description": "[clip, init, eps label], e.g. [1.0, \"g1\", \"8\"]"}}


def _cells(value: str) -> list[tuple[float, str, str]]:
    """``--cells``: a JSON list of [clip, init label, eps label], checked against
    :func:`_cells_schema`, each Glorot scale as the config's ``jagielski.fig2.init``."""
    import json

    try:
        cells = json.loads(value)
    except ValueError as err:
        raise SpecError(f"--cells {value!r}: must be a JSON list of [clip, init, eps] "
                        f"(e.g. [[1.0, \"g1\", \"8\"]]): {err}") from None
    validate_section(cells, "--cells", schema_node=_cells_schema())
    scale = next(b for b in section_schema("jagielski", "fig2")["properties"]["init"]["oneOf"]
                 if b.get("type") == "number")
    for i, (_, init, _) in enumerate(cells):
        if init != "fixed":
            try:
                s = float(init[1:])
            except ValueError:
                s = init[1:]
            validate_section(s, f"--cells[{i}][1] (Glorot scale of {init!r})",
                             schema_node=scale)
    return [(float(c), i, e) for c, i, e in cells]


def _train(args) -> None:
    from ..locks import Busy, hold

    # The group's folder is this command's alone while it runs (dpaudit.locks).
    try:
        with hold(args.out_dir):
            _train_group(args)
    except Busy as exc:
        raise SystemExit(f"dpaudit jagielski-train: {exc}") from None


def _fixed_init(path, model):
    """The one model every ``fixed``-init cell starts from: ``--init-file``'s, which must
    hold ``model``."""
    from .. import dpsgd

    if path is None:
        raise SpecError("init 'fixed' needs --init-file (from jagielski-init)")
    init, saved = dpsgd.load_params(path)
    if saved != model:
        raise SpecError(f"{path} holds {saved}, not {model}")
    return init


def _save_models(parts: list, path, model) -> int:
    """Save the kept models of one cell and side (``--save-models``) in one file; how
    many."""
    import torch

    from .. import dpsgd

    params = dpsgd.Params([torch.cat(w) for w in zip(*(p.W for p in parts))],
                          [torch.cat(b) for b in zip(*(p.b for p in parts))])
    dpsgd.save_params(path, params, model)
    return params.K


def _cell_setups(args, spec: dict, cells, n: int, init_sha: str | None):
    """Each cell's DPSGDConfig, its key in the store (its noise, and the digest of a fixed
    init) and the columns of its table, by cell id."""
    from ..experiments import jagielski

    cfgs, cell_keys, info = {}, {}, {}
    for clip, init_label, eps in cells:
        noise = float(spec["noise"][eps])
        cid = jagielski.cell_file(clip, init_label, eps)[:-4]
        cfgs[cid] = _dpsgd_config(spec, clip, noise, init_label, spec["sampling"])
        cell_keys[cid] = {"noise": noise, **({"init_sha256": init_sha}
                                              if init_label == "fixed" else {})}
        info[cid] = {"dataset": args.dataset, "arch": args.arch, "clip": clip,
                     "init": init_label, "eps": eps, "noise": noise, "attack": args.attack,
                     "n": n, "steps": cfgs[cid].steps(n)}
    return cfgs, cell_keys, info


def _train_group(args) -> None:
    import pandas as pd

    from .. import dpsgd, features
    from ..device import describe, is_gpu, jobs_per_gpu, reproduce_key
    from ..experiments import jagielski
    from ..io import array_digest, write_table

    spec = validate_section(args.spec, "jagielski", schema_node=_train_schema(args.dataset))
    cells = _cells(args.cells)
    unknown = sorted({e for _, _, e in cells if e not in spec["noise"]})
    if unknown:
        raise SpecError(f"--cells: eps labels {unknown} are not keys of the spec's noise "
                        f"(allowed: {sorted(spec['noise'])})")
    log = say("jagielski-train")
    arrays, task_prov = features.load_features(args.task, jagielski.TASK_ARRAYS)
    task = jagielski.Task.from_arrays(arrays)
    model = dpsgd.ModelSpec(args.arch, task.X.shape[1], spec["hidden"])
    init = _fixed_init(args.init_file, model) if any(i == "fixed" for _, i, _ in cells) \
        else None
    init_sha = None if init is None else init.digest()
    device = resolve(args.device)
    # The precision the trainer ran in: TF32 exists on CUDA only (under a forced GPU
    # description its branch, the lowered clip, with float32 products; forced_gpu says so).
    where = {**describe(device), "matmul_precision": spec["matmul_precision"]
             if is_gpu(device) else "fp32"}
    # What every cell of a kept block shares; a block trained elsewhere (another device
    # kind or GPU model, torch version, trainer code) is trained again, so that a seed
    # gives the same model in every cell of a result.
    shared = {k: spec[k] for k in TRAIN_KEYS if k not in ("trials", "ks", "noise")}
    key = {"group": [args.dataset, args.arch, args.attack], "spec": shared, "seed": args.seed,
           "task_sha256": array_digest(arrays), "trainer": jagielski.trainer_digest(),
           "device": reproduce_key(device)}
    cfgs, cell_keys, info = _cell_setups(args, spec, cells, len(task.X), init_sha)
    log(f"{args.dataset}/{args.arch}/{args.attack}: {len(cells)} cells, {spec['trials']} "
        f"trials per side, blocks of {args.block_trials}, on {where['device']}"
        + (f" ({where['gpu_name']})" if where.get("gpu_name") else "")
        + (f" (forced GPU description: {where['forced_gpu']})" if "forced_gpu" in where
           else ""))
    kept_models: dict = {}

    def keep(side, start, trained):  # the first --save-models models of each side and cell
        for cid, params in trained.items():
            have = kept_models.setdefault((cid, side), [])
            take = min(args.save_models - sum(p.K for p in have), params.K)
            if take > 0:
                have.append(params.select(list(range(take))).to("cpu"))

    save = args.save_models > 0
    calls = jagielski.Calls(args.block_trials, device, jobs_per_gpu=jobs_per_gpu(),
                            precision=spec["matmul_precision"], log=log,
                            on_trained=keep if save else None)
    store = None if save or args.store is None else jagielski.Store(args.store, key, cell_keys)
    scores = jagielski.run_group(
        task, args.attack, model, cfgs, spec["ks"], spec["trials"], args.seed,
        (args.dataset, args.arch), init, spec["clipbkd_d0"], calls=calls, store=store)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for cid, table in scores.items():
        out = args.out_dir / f"{cid}.csv"
        for (kc, side), parts in kept_models.items():
            if kc == cid:
                path = out.with_name(f"{out.stem}_models_{side}.pt")
                log(f"saved the first {_save_models(parts, path, model)} models of side "
                    f"{side} to {path}")
        cell = info[cid]
        table = pd.concat([pd.DataFrame({k: [v] * len(table) for k, v in cell.items()}),
                           table], axis=1)
        write_table(table, out, {"command": "jagielski-train",
                                 "spec": {**spec, "noise": cell["noise"]}, "seed": args.seed,
                                 "cell": cell, "inputs": {"task_sha256": key["task_sha256"],
                                                          **cell_keys[cid]},
                                 "trainer": {"digest": key["trainer"], **where},
                                 "dpsgd": vars(cfgs[cid]), "task": task_prov})


def _audit(args) -> None:
    import pandas as pd

    from .. import dpsgd, seeds
    from ..experiments import jagielski
    from ..io import write_markdown, write_table

    # AUDIT_KEYS are used; the rest, what the cells were trained with, only recorded
    if args.experiment == "table2" and args.md is None:
        raise SpecError("--experiment table2 needs --md (the Markdown table)")
    node = subset_schema((*AUDIT_KEYS, *MADE_WITH_KEYS, "fig2", "table2"), "jagielski")
    spec = validate_section(args.spec, "jagielski", schema_node={**node, "required": list(AUDIT_KEYS)})
    rows = []
    log = say("jagielski-audit")
    for i, path in enumerate(args.scores):
        scores, prov = jagielski.read_scores(path)
        cell = prov["cell"]
        cfg = dpsgd.DPSGDConfig(**prov["dpsgd"])
        # the re-splits of a cell are drawn from the run seed and the cell's name
        cell_name = jagielski.cell_file(cell["clip"], cell["init"], cell["eps"])
        resplit_seed = seeds.sequence(args.seed, "jagielski/resplits", cell["dataset"],
                                      cell["arch"], cell["attack"], cell_name)
        row = {**cell, "eps_label": cell["eps"],
               **jagielski.theoretical_eps(cell["noise"], cell["n"], cfg, spec["delta"]),
               **jagielski.summarize_cell(
                   scores, cell["attack"], spec["alpha"], spec["delta"], spec["select_frac"],
                   jagielski.RESPLITS, resplit_seed, jagielski.BOOTSTRAPS,
                   seeds.sequence(args.seed, "jagielski/bootstrap", cell["dataset"],
                                  cell["arch"], cell["attack"], cell_name)),
               "jpeg_reencoded": bool(prov["task"].get("jpeg_reencoded", False)),
               "pretrained_on": prov["task"].get("pretrained_on", "")}
        del row["eps"]
        rows.append(row)
        log(f"{i + 1}/{len(args.scores)} cells audited ({path})")
    table = pd.DataFrame(rows)
    prov = {"command": "jagielski-audit", "experiment": args.experiment, "spec": spec,
            "seed": args.seed, "resplits": jagielski.RESPLITS, "bootstraps": jagielski.BOOTSTRAPS}
    if args.experiment == "table2":
        table = jagielski.with_paper_table2(table)
    digest = write_table(table, args.out, prov)
    if args.experiment == "table2":
        write_markdown(jagielski.table2_markdown(table), args.md, digest)


def _tolerance(text: str) -> float:
    """argparse type of --tolerance: a number >= 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a number >= 0")
    return value


def _markdown(args) -> None:
    from ..experiments import jagielski
    from ..io import BODY_SHA256, read_provenance, write_markdown

    table = jagielski.read_result_table(args.table, jagielski.TABLE2_COLUMNS,
                                        "jagielski-audit --experiment table2")
    try:
        text = jagielski.table2_markdown(table, args.tolerance)
    except ValueError as exc:
        raise SpecError(f"--table {args.table}: {exc}") from exc
    write_markdown(text, args.out, read_provenance(args.table)[BODY_SHA256])


def _plot(args) -> None:
    from ..plots import jagielski as plots

    if args.experiment == "fig2":
        plots.plot_fig2(args.table, args.out)
    else:
        plots.plot_table2(args.table, args.out)


def register(subparsers) -> None:
    def common(p, spec_help="the jagielski config section"):
        p.add_argument("--spec", type=spec_arg, required=True, help=spec_help)
        p.add_argument("--seed", type=seed_arg, required=True, help="run seed (config `seed`)")

    p = subparsers.add_parser("jagielski-task", help="prepare an audit task (data, canaries)")
    p.add_argument("--dataset", choices=["fmnist", "cifar"], required=True)
    p.add_argument("--data", type=spec_arg, required=True, help="the data config section")
    common(p, "the data set's section of jagielski.datasets")
    p.add_argument("--device", default="auto", choices=DEVICES,
                   help="where the CIFAR feature extractor is pretrained")
    p.add_argument("--out", type=out_file, required=True, help="task file (.npz)")
    p.set_defaults(func=_task)

    p = subparsers.add_parser("jagielski-init", help="draw the shared 'fixed' initialisation")
    p.add_argument("--dataset", choices=["fmnist", "cifar"], required=True)
    p.add_argument("--arch", choices=["lr", "fnn"], required=True)
    p.add_argument("--task", type=Path, required=True, help="task file from jagielski-task")
    p.add_argument("--hidden", type=int_at_least(1), default=32, help="hidden width of fnn")
    p.add_argument("--seed", type=seed_arg, required=True, help="run seed (config `seed`)")
    p.add_argument("--out", type=out_file, required=True, help="weights (.pt)")
    p.set_defaults(func=_init)

    p = subparsers.add_parser(
        "jagielski-train", help="train and score every cell of one data set, model and attack")
    p.add_argument("--task", type=Path, required=True, help="task file from jagielski-task")
    p.add_argument("--dataset", choices=["fmnist", "cifar"], required=True)
    p.add_argument("--arch", choices=["lr", "fnn"], required=True)
    p.add_argument("--attack", choices=["mi", "backdoor", "clipbkd"], required=True)
    p.add_argument("--cells", required=True,
                   help="JSON list of the cells [clip, init, eps]: init 'fixed' or "
                        "'g<Glorot scale>' (e.g. g1), eps a label of the spec's noise table")
    p.add_argument("--init-file", type=Path, default=None,
                   help="weights from jagielski-init (for the 'fixed' cells)")
    p.add_argument("--device", default="auto", choices=DEVICES, help="where models train")
    p.add_argument("--block-trials", type=int_at_least(1), default=100, metavar="N",
                   help="trials per side trained (and kept) together: an interrupted job "
                        "loses at most one block")
    p.add_argument("--store", type=out_dir, default=None, metavar="DIR",
                   help="keep each finished block of trials in DIR, and reuse a kept block's "
                        "cells when DIR holds them from the same spec, seed, task, init, "
                        "device kind and trainer code (the workflow's reruns train only "
                        "missing blocks and cells)")
    p.add_argument("--save-models", type=int_at_least(0), default=0, metavar="N",
                   help="also save the weights of the first N models of each side and cell, "
                        "beside each cell table as <cell>_models_<side>.pt "
                        "(dpsgd.load_params reads them); then nothing is reused or kept")
    common(p, f"JSON object with keys {', '.join(TRAIN_KEYS)}")
    p.add_argument("--out-dir", type=out_dir, required=True,
                   help="folder of the cell score tables (one CSV per cell, named "
                        "c<clip>_<init>_e<eps>.csv)")
    p.set_defaults(func=_train)

    p = subparsers.add_parser("jagielski-audit", help="bounds of Figure 2 or Table 2")
    p.add_argument("--experiment", choices=["fig2", "table2"], required=True)
    p.add_argument("--scores", type=Path, nargs="+", required=True, help="score tables")
    common(p, f"JSON object with the jagielski keys {', '.join(AUDIT_KEYS)} and, recorded "
              f"in the table's provenance, any of {', '.join(MADE_WITH_KEYS)}, fig2, table2")
    p.add_argument("--out", type=out_file, required=True, help="result table (CSV)")
    p.add_argument("--md", type=out_file, default=None, help="Markdown table (table2)")
    p.set_defaults(func=_audit)

    p = subparsers.add_parser(
        "jagielski-md", help="Table 2 as Markdown, beside the paper's, from its CSV")
    p.add_argument("--table", type=Path, required=True,
                   help="Table 2 CSV from jagielski-audit --experiment table2")
    p.add_argument("--tolerance", type=_tolerance, default=PAPER_TOL,
                   help="count the cells within this distance of the paper's value "
                        f"(default {PAPER_TOL})")
    p.add_argument("--out", type=out_file, required=True, help="Markdown file")
    p.set_defaults(func=_markdown)

    p = subparsers.add_parser("jagielski-plot", help="draw Figure 2 or the Table 2 heatmap")
    p.add_argument("--experiment", choices=["fig2", "table2"], required=True)
    p.add_argument("--table", type=Path, required=True, help="CSV from jagielski-audit")
    p.add_argument("--out", type=figure_out, required=True, help=FIGURE_HELP)
    p.set_defaults(func=_plot)
