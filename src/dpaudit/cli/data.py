"""``dpaudit data``: fetch a data set once (or, offline, find and check it) before any job
reads it, so that jobs running at once never download the same files side by side."""

from __future__ import annotations

import sys

from ..config import validate_section
from . import out_file, spec_arg

#: Data set (a key of ``jagielski.datasets``, or MNIST) -> its preparation, given the data
#: section.
PREPARE = {
    "fmnist": lambda data, d: data.prepare_fmnist(d["root"], d["download"]),
    "mnist": lambda data, d: data.prepare_mnist(d["root"], d["download"]),
    "cifar": lambda data, d: data.prepare_cifar(d["root"], d["download"], d["cifar10_tarball"],
                                                d["cifar100_root"]),
}


def _prepare(args) -> None:
    import pandas as pd

    from .. import data
    from ..io import write_table

    spec = validate_section(args.data, "data")
    rows = PREPARE[args.dataset](data, spec)
    for row in rows:
        print(f"data {args.dataset}: {row['data_set']} {row['split']}: {row['n']} images "
              f"({row['source']})", file=sys.stderr)
    write_table(pd.DataFrame(rows), args.out,
                {"command": "data", "dataset": args.dataset, "data": spec})


def register(subparsers) -> None:
    p = subparsers.add_parser("data", help="fetch (or check) a data set once, before its jobs")
    p.add_argument("--dataset", choices=sorted(PREPARE), required=True)
    p.add_argument("--data", type=spec_arg, required=True, help="the data config section")
    p.add_argument("--out", type=out_file, required=True, help="CSV: one row per split found")
    p.set_defaults(func=_prepare)
