"""The trials-needed study at paper scale on simulated scores of a known mechanism.

    python benchmarks/trials_needed_sim.py               # the tables of docs/statistics.md
    python benchmarks/trials_needed_sim.py --trials 400 --pools 2 --subsamples 5   # quicker

Score tables in the layout of ``jagielski-train`` whose statistic is N(k mu, 1) for the
models trained with k canaries and N(0, 1) without: a per-row mu-GDP mechanism, whose
eps at delta is known (``eps_from_mu``).  Each (mu, pool) is an independent table of
``--trials`` trials per side, audited exactly as the workflow's ``trials_needed_table``
rule audits a real cell (:func:`dpaudit.experiments.trials_needed.study`), and summarised
as ``results/trials_needed.md`` is (:func:`~dpaudit.experiments.trials_needed.summary`:
the trials each method needs to reach ``--fraction`` of the certified bound's median at
the full count).  Printed: the medians against n (median over pools), the trials needed
per pool (median and range over pools), and, for comparison, the criterion the study used
before (the first grid point reaching ``--fraction`` of the method's own full-count
median), whose answer jumps between grid points from pool to pool.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np
import pandas as pd

from dpaudit import bounds, seeds
from dpaudit.experiments import trials_needed as tn


def gaussian_cell(trials: int, mu: float, ks, rng) -> pd.DataFrame:
    sides = [("out", 0, 0, 0.0)] + [(f"k{k}", 1, k, k * mu) for k in ks]
    parts = []
    for side, label, k, mean in sides:
        s = rng.normal(mean, 1.0, trials)
        parts.append(pd.DataFrame({"side": side, "label": label, "k": k,
                                   "trial": np.arange(trials), "seed": np.arange(trials),
                                   "clipbkd": s, "clipbkd_logit": s, "test_acc": 1.0}))
    return pd.concat(parts, ignore_index=True)


def own_full_first_point(table: pd.DataFrame, fraction: float) -> pd.DataFrame:
    """The former criterion: the first grid n whose median reaches ``fraction`` of the
    method's own median at the full count."""
    med = table.groupby(["arch", "dataset", "n"])[list(tn.METHODS)].median()
    rows = []
    for (arch, pool), grp in med.groupby(level=[0, 1]):
        grp = grp.droplevel([0, 1])
        for m in tn.METHODS:
            reached = grp.index[grp[m] >= fraction * grp[m].iloc[-1]]
            rows.append({"arch": arch, "dataset": pool, "method": m,
                         "n_own": int(reached[0]) if grp[m].iloc[-1] > 0 else np.nan})
    return pd.DataFrame(rows)


def per_pool(grp: pd.DataFrame) -> str:
    """The trials needed in each pool, sorted: '<= n' where the first grid point already
    reaches the target, '-' where the full count does not."""
    texts = sorted(((math.inf if math.isnan(n) else n), ("-" if math.isnan(n) else
                    f"<= {n:.0f}" if first else f"{n:.0f}"))
                   for n, first in zip(grp.n_needed, grp.at_first))
    return ", ".join(text for _, text in texts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--mu", type=float, nargs="+", default=[0.5, 1.0, 3.0])
    parser.add_argument("--pools", type=int, default=5, help="independent tables per mu")
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--n-min", type=int, default=50)
    parser.add_argument("--n-points", type=int, default=8)
    parser.add_argument("--subsamples", type=int, default=20)
    parser.add_argument("--fraction", type=float, default=0.9)
    parser.add_argument("--alpha", type=float, default=0.01)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    tables = [(gaussian_cell(args.trials, mu, args.ks,
                             seeds.rng(args.seed, f"trials_needed_sim/{mu:g}/{pool}")),
               {"dataset": f"pool{pool}", "arch": f"mu{mu:g}", "clip": 1.0, "init": "fixed",
                "eps": f"{bounds.eps_from_mu(mu, args.delta):.2f}", "attack": "clipbkd"})
              for mu in args.mu for pool in range(args.pools)]
    start = time.time()
    table = tn.study(tables, args.alpha, args.delta, 0.5, args.n_min, args.n_points,
                     args.subsamples, args.seed, lambda msg: print(msg, file=sys.stderr))
    summ = tn.summary(table, args.fraction)
    print(f"Simulated per-row mu-GDP cells, {args.pools} pools of {args.trials} trials per "
          f"side each (eps_th label = the true per-row eps at delta = {args.delta:g}); ks "
          f"{args.ks}; {args.subsamples} subsamples per n; level {1 - args.alpha:.0%}.\n")
    med = (table.groupby(["arch", "dataset", "n"])[list(tn.METHODS)].median()
           .groupby(level=[0, 2]).median().round(2))
    print("Median over subsamples, then median over pools:")
    print(med.to_string(), "\n")
    print(f"Trials per side to reach {args.fraction:.0%} of the certified bound's full-count "
          "median (the target, per pool): the target's median and range over pools, the trials each pool needs:")
    target = summ.groupby("arch").target.agg(["median", "min", "max"]).round(2)
    rows = {m: summ[summ.method == m].groupby("arch")[["n_needed", "at_first"]].apply(per_pool)
            for m in tn.METHODS}
    print(pd.concat([target, pd.DataFrame(rows)], axis=1).to_string(), "\n")
    own = own_full_first_point(table, args.fraction)
    print(f"Former criterion (first grid n reaching {args.fraction:.0%} of the method's own "
          "full-count median), per pool:")
    print(own.pivot_table(index="arch", columns="method", values="n_own",
                          aggfunc=lambda v: sorted(v.tolist()))[list(tn.METHODS)].to_string())
    print(f"({time.time() - start:.0f} s)")


if __name__ == "__main__":
    main()
