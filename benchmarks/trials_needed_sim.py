"""The trials-needed study at paper scale on simulated scores of a known mechanism.

    python benchmarks/trials_needed_sim.py               # the table of docs/statistics.md
    python benchmarks/trials_needed_sim.py --trials 400 --subsamples 5   # a quicker look

Score tables in the layout of ``jagielski-train`` whose statistic is N(k mu, 1) for the
models trained with k canaries and N(0, 1) without: a per-row mu-GDP mechanism, whose
eps at delta is known (``eps_from_mu``).  They are audited exactly as the workflow's
``trials_needed_table`` rule audits real cells (:func:`dpaudit.experiments.trials_needed.study`)
and the summary printed as ``results/trials_needed.md`` is.  For a perfect attack (mu
large) every bound is limited by the trials and grows until the full count; for a
partial one the bounds level off, and the trials each method needs can be read off.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import pandas as pd

from dpaudit import bounds
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--mu", type=float, nargs="+", default=[0.5, 1.0, 3.0])
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--n-min", type=int, default=50)
    parser.add_argument("--n-points", type=int, default=8)
    parser.add_argument("--subsamples", type=int, default=20)
    parser.add_argument("--fraction", type=float, default=0.9)
    parser.add_argument("--alpha", type=float, default=0.01)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    tables = [(gaussian_cell(args.trials, mu, args.ks, rng),
               {"dataset": "sim", "arch": f"mu{mu:g}", "clip": 1.0, "init": "fixed",
                "eps": f"{bounds.eps_from_mu(mu, args.delta):.2f}", "attack": "clipbkd"})
              for mu in args.mu]
    start = time.time()
    table = tn.study(tables, args.alpha, args.delta, 0.5, args.n_min, args.n_points,
                     args.subsamples, args.seed, lambda msg: print(msg, file=sys.stderr))
    print("Simulated per-row mu-GDP cells (`arch` = mu, eps_th label = its eps at delta):")
    print(tn.markdown(tn.summary(table, args.fraction), args.fraction, args.alpha,
                      args.subsamples))
    med = table.groupby(["arch", "n"])[list(tn.METHODS)].median().round(2)
    print(med.to_string())
    print(f"({time.time() - start:.0f} s)")


if __name__ == "__main__":
    main()
