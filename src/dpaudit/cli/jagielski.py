"""``dpaudit jagielski-*``: the DP-SGD audits of Jagielski et al. 2020.

``jagielski-task`` prepares a data set's task (FMNIST, or CIFAR-10 features of a
pretrained CNN) once; ``jagielski-init`` draws the shared "fixed" initialisation;
``jagielski-train`` trains and scores the cells of one set-up and attack at several eps
labels (every side, T trials each) into one score table per cell; ``jagielski-audit``
turns the score tables of Figure 2 or Table 2 into bounds; ``jagielski-plot`` draws them.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..config import SpecError, section_schema, subset_schema, validate_section
from ..device import DEVICES, resolve
from . import spec_arg

from ..experiments.jagielski import AUDIT_KEYS, TASK_KEYS, TRAIN_KEYS


def _train_schema() -> dict:
    node = subset_schema(TRAIN_KEYS[:4], "jagielski")
    per_dataset = section_schema("jagielski", "datasets", "fmnist")["properties"]
    node["properties"].update({k: per_dataset[k] for k in TRAIN_KEYS[4:8]})
    node["properties"]["noise"] = {
        "type": "object", "minProperties": 1,
        "additionalProperties": {"type": "number", "minimum": 0},
        "description": "DP-SGD noise multiplier of each eps label the job trains"}
    node["required"] = list(TRAIN_KEYS)
    return node


def _say(command: str):
    return lambda msg: print(f"dpaudit {command}: {msg}", file=sys.stderr, flush=True)


def _dpsgd_config(ds: dict, clip: float, noise: float, init: str, sampling: str):
    """DP-SGD hyper-parameters of a cell (``init``: ``fixed`` or ``g<Glorot scale>``)."""
    from ..dpsgd import DPSGDConfig

    if init == "fixed":
        return DPSGDConfig(ds["epochs"], ds["batch_size"], ds["lr"], clip, noise, sampling, "fixed")
    if not init.startswith("g"):
        raise SpecError(f"init={init!r}: must be 'fixed' or 'g<Glorot scale>' (e.g. g1)")
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
    log = _say("jagielski-task")
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

    arrays, _ = features.load_features(args.task)
    model = dpsgd.ModelSpec(args.arch, arrays["X"].shape[1], args.hidden)
    # On the CPU: init draws differ across devices, and the shared "fixed" init must not
    # depend on the machine that happened to draw it.
    dpsgd.save_params(args.out, dpsgd.init_params(model, 1, [args.seed], device="cpu"), model)


def _train(args) -> None:
    import pandas as pd
    import torch

    from .. import __version__, dpsgd, features
    from ..experiments import jagielski
    from ..io import array_digest, keep_table, restore_table, write_table

    spec = validate_section(args.spec, "jagielski", schema_node=_train_schema())
    if len(args.eps) != len(args.out):
        raise SpecError(f"--eps has {len(args.eps)} labels and --out {len(args.out)} paths: "
                        "give one score table per label")
    if len(set(args.out)) != len(args.out):
        raise SpecError("--out: each score table must be a different path")
    unknown = [e for e in args.eps if e not in spec["noise"]]
    if unknown:
        raise SpecError(f"--eps {unknown}: not keys of the spec's noise "
                        f"(allowed: {sorted(spec['noise'])})")
    log = _say("jagielski-train")
    arrays, task_prov = features.load_features(args.task)
    task = jagielski.Task.from_arrays(arrays)
    model = dpsgd.ModelSpec(args.arch, task.X.shape[1], spec["hidden"])
    # What, beside the spec, seed and cell, a kept table must have been trained on.
    inputs = {"task_sha256": array_digest(arrays)}
    init = None
    if args.init == "fixed":
        if args.init_file is None:
            raise SpecError("init 'fixed' needs --init-file (from jagielski-init)")
        init, saved = dpsgd.load_params(args.init_file)
        if saved != model:
            raise SpecError(f"{args.init_file} holds {saved}, not {model}")
        inputs["init_sha256"] = array_digest({f"{name}{i}": t for name, ts in
                                              (("W", init.W), ("b", init.b))
                                              for i, t in enumerate(ts)})
    device = K = None  # chosen when a cell first needs training (a restore needs no GPU)
    for i, (eps, out) in enumerate(zip(args.eps, args.out), 1):
        noise = float(spec["noise"][eps])
        cfg = _dpsgd_config(spec, args.clip, noise, args.init, spec["sampling"])
        cell = {"dataset": args.dataset, "arch": args.arch, "clip": args.clip,
                "init": args.init, "eps": eps, "noise": noise, "attack": args.attack,
                "n": len(task.X), "steps": cfg.steps(len(task.X))}
        made_by = {"spec": {**spec, "noise": noise}, "seed": args.seed, "cell": cell,
                   "inputs": inputs, "dpaudit_version": __version__}
        where = f"cell {i}/{len(args.eps)} ({out.name})"
        if (args.keep_dir is not None and not args.save_models
                and restore_table(out, args.keep_dir, made_by)):
            log(f"{where}: restored from {args.keep_dir}, where it was kept when trained "
                "with the same spec, seed, task, init and dpaudit version (delete it there "
                "to retrain)")
            continue
        log(f"{where}: {cell}, {spec['trials']} trials per side")
        if device is None:
            device = resolve(args.device)
            # one K for the job: the cells share the model and batch shapes
            K = args.models_per_call or dpsgd.pick_k(model, len(task.X), device, cfg)
        kept: dict = {}

        def keep(side, seeds, params):  # the first --save-models models of each side
            have = kept.setdefault(side, [])
            take = min(args.save_models - sum(p.K for p in have), params.K)
            if take > 0:
                have.append(params.select(list(range(take))).to("cpu"))

        scores = jagielski.run_cell(task, args.attack, model, cfg, spec["ks"], spec["trials"],
                                    args.seed, (args.dataset, args.arch), init,
                                    spec["clipbkd_d0"], K, device, log,
                                    keep if args.save_models else None)
        for side, parts in kept.items():
            params = dpsgd.Params([torch.cat(w) for w in zip(*(p.W for p in parts))],
                                  [torch.cat(b) for b in zip(*(p.b for p in parts))])
            path = out.with_name(f"{out.stem}_models_{side}.pt")
            dpsgd.save_params(path, params, model)
            log(f"saved the first {params.K} models of side {side} (trials 0..) to {path}")
        scores = pd.concat([pd.DataFrame({k: [v] * len(scores) for k, v in cell.items()}),
                            scores], axis=1)
        write_table(scores, out, {"command": "jagielski-train", **made_by,
                                  "device": args.device, "dpsgd": vars(cfg), "task": task_prov})
        if args.keep_dir is not None:
            keep_table(out, args.keep_dir)


def _audit(args) -> None:
    import pandas as pd

    from .. import dpsgd
    from ..experiments import jagielski
    from ..io import read_table, write_table, write_text

    spec = validate_section(args.spec, "jagielski",
                            schema_node=subset_schema(AUDIT_KEYS, "jagielski"))
    rows = []
    for path in args.scores:
        scores, prov = read_table(path)
        cell = prov["cell"]
        cfg = dpsgd.DPSGDConfig(**prov["dpsgd"])
        row = {**cell, "eps_label": cell["eps"],
               **jagielski.theoretical_eps(cell["noise"], cell["n"], cfg, spec["delta"]),
               **jagielski.summarize_cell(scores, cell["attack"], spec["alpha"], spec["delta"],
                                          spec["select_frac"]),
               "jpeg_reencoded": bool(prov["task"].get("jpeg_reencoded", False)),
               "pretrained_on": prov["task"].get("pretrained_on", "")}
        del row["eps"]
        rows.append(row)
    table = pd.DataFrame(rows)
    prov = {"command": "jagielski-audit", "experiment": args.experiment, "spec": spec,
            "seed": args.seed}
    if args.experiment == "table2":
        if args.md is None:
            raise SpecError("--experiment table2 needs --md (the Markdown table)")
        table = jagielski.with_paper_table2(table)
        write_text(jagielski.table2_markdown(table), args.md)
    write_table(table, args.out, prov)


def _plot(args) -> None:
    from ..plots import jagielski as plots

    if args.experiment == "fig2":
        plots.plot_fig2(args.table, args.out)
    else:
        plots.plot_table2(args.table, args.out)


def register(subparsers) -> None:
    def common(p, spec_help="the jagielski config section"):
        p.add_argument("--spec", type=spec_arg, required=True, help=spec_help)
        p.add_argument("--seed", type=int, required=True, help="run seed (config `seed`)")

    p = subparsers.add_parser("jagielski-task", help="prepare an audit task (data, canaries)")
    p.add_argument("--dataset", choices=["fmnist", "cifar"], required=True)
    p.add_argument("--data", type=spec_arg, required=True, help="the data config section")
    common(p, "the data set's section of jagielski.datasets")
    p.add_argument("--device", default="auto", choices=DEVICES,
                   help="where the CIFAR feature extractor is pretrained")
    p.add_argument("--out", type=Path, required=True, help="task file (.npz)")
    p.set_defaults(func=_task)

    p = subparsers.add_parser("jagielski-init", help="draw the shared 'fixed' initialisation")
    p.add_argument("--dataset", choices=["fmnist", "cifar"], required=True)
    p.add_argument("--arch", choices=["lr", "fnn"], required=True)
    p.add_argument("--task", type=Path, required=True, help="task file from jagielski-task")
    p.add_argument("--hidden", type=int, default=32, help="hidden width of fnn")
    p.add_argument("--seed", type=int, required=True, help="run seed (config `seed`)")
    p.add_argument("--out", type=Path, required=True, help="weights (.pt)")
    p.set_defaults(func=_init)

    p = subparsers.add_parser(
        "jagielski-train", help="train and score the models of one set-up at several eps")
    p.add_argument("--task", type=Path, required=True, help="task file from jagielski-task")
    p.add_argument("--dataset", choices=["fmnist", "cifar"], required=True)
    p.add_argument("--arch", choices=["lr", "fnn"], required=True)
    p.add_argument("--attack", choices=["mi", "backdoor", "clipbkd"], required=True)
    p.add_argument("--clip", type=float, required=True, help="clipping norm C")
    p.add_argument("--init", required=True, help="'fixed' or 'g<Glorot scale>', e.g. g1")
    p.add_argument("--eps", nargs="+", required=True,
                   help="eps labels of the spec's noise table (e.g. 8 inf): one cell each")
    p.add_argument("--init-file", type=Path, default=None, help="weights from jagielski-init")
    p.add_argument("--device", default="auto", choices=DEVICES, help="where models train")
    p.add_argument("--models-per-call", type=int, default=0,
                   help="models trained at once (0: as many as fit)")
    p.add_argument("--keep-dir", type=Path, default=None, metavar="DIR",
                   help="keep every trained table in DIR too, and restore a cell from DIR "
                        "instead of training it when DIR holds it from the same spec, seed, "
                        "task, init and dpaudit version (the workflow's reruns train only "
                        "new cells)")
    p.add_argument("--save-models", type=int, default=0, metavar="N",
                   help="also save the weights of the first N models of each side, beside "
                        "each OUT as OUT_models_<side>.pt (dpsgd.load_params reads them); "
                        "cells are then always trained")
    common(p, f"JSON object with keys {', '.join(TRAIN_KEYS)}")
    p.add_argument("--out", type=Path, nargs="+", required=True,
                   help="score table (CSV) of each --eps label, in the same order")
    p.set_defaults(func=_train)

    p = subparsers.add_parser("jagielski-audit", help="bounds of Figure 2 or Table 2")
    p.add_argument("--experiment", choices=["fig2", "table2"], required=True)
    p.add_argument("--scores", type=Path, nargs="+", required=True, help="score tables")
    common(p, f"JSON object with keys {', '.join(AUDIT_KEYS)}")
    p.add_argument("--out", type=Path, required=True, help="result table (CSV)")
    p.add_argument("--md", type=Path, default=None, help="Markdown table (table2)")
    p.set_defaults(func=_audit)

    p = subparsers.add_parser("jagielski-plot", help="draw Figure 2 or the Table 2 heatmap")
    p.add_argument("--experiment", choices=["fig2", "table2"], required=True)
    p.add_argument("--table", type=Path, required=True, help="CSV from jagielski-audit")
    p.add_argument("--out", type=Path, required=True, help="figure PDF (a PNG is written beside)")
    p.set_defaults(func=_plot)
