"""``dpaudit tight-whitebox-audit``: the white-box multi-run audit of DP-SGD (Nasr et al.
2023) on a Jagielski task, one row per arch x eps label x method
(:mod:`dpaudit.experiments.tight.whitebox`)."""

from __future__ import annotations

from pathlib import Path

from ..config import SpecError
from ..device import DEVICES, resolve
from . import say, spec_arg

#: Keys of ``--train``: the DP-SGD set-up of the FMNIST cells of Jagielski et al. 2020.
TRAIN_KEYS = ("epochs", "batch_size", "lr", "hidden", "noise", "clip")
#: Keys of ``--spec``: what the audit runs and its statistics.
SPEC_KEYS = ("runs", "archs", "eps", "alpha", "delta", "select_frac")


def _keys(value: dict, allowed: tuple, flag: str) -> None:
    """Exactly the ``allowed`` keys, or a SpecError naming the first wrong one."""
    for key in value:
        if key not in allowed:
            raise SpecError(f"{flag}.{key}: unknown key; allowed keys are {list(allowed)}")
    missing = [k for k in allowed if k not in value]
    if missing:
        raise SpecError(f"{flag}: missing keys {missing} (needs {list(allowed)})")


def _audit(args) -> None:
    import pandas as pd

    from .. import dpsgd, features
    from ..experiments.jagielski import Task
    from ..experiments.tight import whitebox
    from ..io import write_table

    spec, train = args.spec, args.train
    _keys(spec, SPEC_KEYS, "--spec")
    _keys(train, TRAIN_KEYS, "--train")
    bad = [a for a in spec["archs"] if a not in dpsgd.ARCHS]
    if not spec["archs"] or bad:
        raise SpecError(f"--spec.archs={spec['archs']!r}: must be a non-empty list of "
                        f"{list(dpsgd.ARCHS)}")
    missing = [e for e in spec["eps"] if e not in train["noise"]]
    if not spec["eps"] or missing:
        raise SpecError(f"--spec.eps={spec['eps']!r}: must be a non-empty list of keys of "
                        f"--train.noise (allowed: {sorted(train['noise'])})")
    arrays, task_prov = features.load_features(args.task)
    task = Task.from_arrays(arrays)
    log, device, rows = say("tight-whitebox-audit"), resolve(args.device), []
    for arch in spec["archs"]:
        model = dpsgd.ModelSpec(arch, task.X.shape[1], train["hidden"])
        for label in spec["eps"]:
            cfg = dpsgd.DPSGDConfig(train["epochs"], train["batch_size"], train["lr"],
                                    train["clip"], float(train["noise"][label]), "poisson")
            try:
                got = whitebox.audit(task.X, task.y, model, cfg, spec["runs"], args.seed,
                                     spec["alpha"], spec["delta"], spec["select_frac"],
                                     device=device)
            except ValueError as exc:  # a bad runs, alpha, delta or select_frac, by name
                raise SpecError(f"--spec: {exc}") from exc
            rows += [{"eps_label": label, **r} for r in got]
            log(f"{arch} eps {label}: " + ", ".join(
                f"{r['method']} eps_lb {r['eps_lb']:.3f}" for r in got)
                + f" (eps_th {got[0]['eps_th']:.3g})")
    write_table(pd.DataFrame(rows), args.out,
                {"command": "tight-whitebox-audit", "spec": spec, "train": train,
                 "seed": args.seed, "device": args.device, "task": task_prov})


def register(subparsers) -> None:
    p = subparsers.add_parser("tight-whitebox-audit",
                              help="white-box multi-run audit of DP-SGD (gradient canary, "
                                   "every iterate)")
    p.add_argument("--task", type=Path, required=True, help="task file from jagielski-task")
    p.add_argument("--spec", type=spec_arg, required=True,
                   help=f"JSON with keys {', '.join(SPEC_KEYS)} (runs per side)")
    p.add_argument("--train", type=spec_arg, required=True,
                   help=f"DP-SGD set-up, JSON with keys {', '.join(TRAIN_KEYS)} (noise: "
                        f"{{eps label: noise multiplier}})")
    p.add_argument("--seed", type=int, required=True, help="run seed (config `seed`)")
    p.add_argument("--device", default="auto", choices=DEVICES, help="where models train")
    p.add_argument("--out", type=Path, required=True, help="result table (CSV)")
    p.set_defaults(func=_audit)
