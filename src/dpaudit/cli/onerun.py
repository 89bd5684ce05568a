"""``dpaudit onerun-audit`` and ``dpaudit onerun-plot``: one-run audits of DP-SGD beside
the many-model audits of Jagielski et al. 2020 (:mod:`dpaudit.experiments.onerun`)."""

from __future__ import annotations

import sys
from pathlib import Path

from ..config import SpecError, section_schema, subset_schema, validate_section
from ..device import DEVICES, resolve
from . import (FIGURE_HELP, FMNIST_TRAIN, figure_out, fmnist_train_schema, out_file, seed_arg,
               spec_arg)

#: Keys of the ``onerun`` section the audit depends on (``--spec``): all but
#: ``compare_many_model``, which only the workflow and the plot read (config/README.md).
AUDIT_KEYS = tuple(k for k in section_schema("onerun")["properties"]
                   if k != "compare_many_model")


def _audit(args) -> None:
    from .. import features
    from ..experiments import onerun
    from ..experiments.jagielski import TASK_ARRAYS, Task
    from ..io import write_table

    spec = validate_section(args.spec, "onerun", schema_node=subset_schema(AUDIT_KEYS, "onerun"))
    train = validate_section(args.train, "--train", schema_node=fmnist_train_schema())
    missing = [e for e in spec["eps"] if e not in train["noise"]]
    if missing:
        raise SpecError(f"onerun.eps: {missing} are not keys of jagielski.datasets.fmnist.noise "
                        f"(allowed: {sorted(train['noise'])})")
    arrays, task_prov = features.load_features(args.task, TASK_ARRAYS)
    task = Task.from_arrays(arrays)
    if "dirac" in spec["canaries"]:  # fail before training, naming the key
        from .. import dpsgd

        for arch in spec["archs"]:
            fan_in, fan_out = dpsgd.ModelSpec(arch, task.X.shape[1], train["hidden"]).shapes[0]
            if spec["m"] > fan_in * fan_out:
                raise SpecError(f"onerun.m={spec['m']}: the {arch} model has only "
                                f"{fan_in * fan_out} first-layer weights for Dirac canaries")
    if "input" in spec["canaries"]:
        import numpy as np
        try:
            onerun.input_canaries(task, onerun.input_count(task, spec["m"], spec["input_kind"]),
                                  spec["input_kind"], np.random.default_rng(0))
        except ValueError as exc:
            raise SpecError(f"onerun.m / onerun.input_kind: {exc}") from exc
    inits, init_sha = _fixed_inits(spec, args.init_files, task.X.shape[1], train["hidden"])
    df = onerun.audit_grid(task, spec, train, args.seed, resolve(args.device),
                           log=lambda msg: print(f"dpaudit onerun-audit: {msg}", file=sys.stderr,
                                                 flush=True), inits=inits)
    write_table(df, args.out, {"command": "onerun-audit", "spec": spec, "train": train,
                               "seed": args.seed, "device": args.device, "task": task_prov,
                               **({"init_sha256": init_sha} if init_sha else {})})


def _fixed_inits(spec: dict, files, in_dim: int, hidden: int):
    """``(arch -> Params, arch -> digest)`` of ``--init-files`` for ``init: fixed`` (one file
    per arch of ``spec``, from jagielski-init); ``(None, None)`` for a Glorot scale."""
    from .. import dpsgd
    from ..io import array_digest

    if spec["init"] != "fixed":
        if files:
            raise SpecError(f"--init-files: only used with onerun.init: fixed (got init "
                            f"{spec['init']})")
        return None, None
    inits, digests = {}, {}
    for path in files or []:
        params, saved = dpsgd.load_params(path)
        want = dpsgd.ModelSpec(saved.arch, in_dim, hidden)
        if saved.arch not in spec["archs"] or saved != want or saved.arch in inits:
            raise SpecError(f"--init-files: {path} holds {saved}; want one file for each of "
                            f"{[str(dpsgd.ModelSpec(a, in_dim, hidden)) for a in spec['archs']]}")
        inits[saved.arch] = params
        digests[saved.arch] = array_digest({f"{name}{i}": t for name, ts in
                                            (("W", params.W), ("b", params.b))
                                            for i, t in enumerate(ts)})
    missing = [a for a in spec["archs"] if a not in inits]
    if missing:
        raise SpecError(f"onerun.init: fixed needs --init-files with the saved initialisation "
                        f"(jagielski-init) of the archs {missing}")
    return inits, digests


def _plot(args) -> None:
    from ..plots.onerun import plot_onerun

    plot_onerun(args.table, args.out, args.many_model)


def register(subparsers) -> None:
    p = subparsers.add_parser("onerun-audit", help="one-run audits of DP-SGD (input and "
                                                    "gradient canaries)")
    p.add_argument("--task", type=Path, required=True, help="FMNIST task from jagielski-task")
    p.add_argument("--spec", type=spec_arg, required=True,
                   help=f"the onerun config section's keys {', '.join(AUDIT_KEYS)}")
    p.add_argument("--train", type=spec_arg, required=True,
                   help=f"DP-SGD set-up, JSON with keys {', '.join(FMNIST_TRAIN)}")
    p.add_argument("--init-files", type=Path, nargs="+", default=None,
                   help="with onerun.init: fixed, the saved initialisation of each arch "
                        "(jagielski-init)")
    p.add_argument("--seed", type=seed_arg, required=True, help="run seed (config `seed`)")
    p.add_argument("--device", default="auto", choices=DEVICES, help="where models train")
    p.add_argument("--out", type=out_file, required=True, help="result table (CSV)")
    p.set_defaults(func=_audit)

    p = subparsers.add_parser("onerun-plot", help="draw the one-run audits against eps_th")
    p.add_argument("--table", type=Path, required=True, help="CSV from onerun-audit")
    p.add_argument("--many-model", type=Path, default=None,
                   help="jagielski-audit table of the same FMNIST ClipBKD cells, to draw the "
                        "many-model bounds")
    p.add_argument("--out", type=figure_out, required=True, help=FIGURE_HELP)
    p.set_defaults(func=_plot)
