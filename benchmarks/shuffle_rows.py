"""How robust each certified violation of reference/shuffle_audit.csv is: the p-value of the
claim from the row's own evaluation counts (the smallest alpha at which its Clopper-Pearson
eps_LB still exceeds the claim, dpaudit.bounds.claim_p_value), and the spread of eps_LB over
replications of the audit on the exact pair the row's white box sees (Chua et al.'s pair
with crafted batch mates, docs/shuffle.md; persistent shuffling is the one-epoch pair at
sigma / sqrt(E)) at the row's run count, with the same split and statistics
(dpaudit.experiments.tight.whitebox.audit_scores): mean, standard deviation, range, and the
fraction of replications above the claim (the power at that count).

    python benchmarks/shuffle_rows.py [--table reference/shuffle_audit.csv] [--reps 100]
        [--seed 0]
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from dpaudit import bounds, io, seeds
from dpaudit.experiments.runs_needed import shuffle_pair_llr
from dpaudit.experiments.tight.whitebox import audit_scores


def replicate(row, reps: int, seed: int) -> np.ndarray:
    """eps_LB of ``reps`` audits of the row's exact pair at its run count."""
    persistent = row.sampling == "shuffle-once"
    sigma = row.noise / math.sqrt(row.epochs) if persistent else row.noise
    epochs = 1 if persistent else int(row.epochs)
    rng = seeds.rng(seed, "shuffle-rows", row.subject, int(row.steps_per_epoch))
    out = []
    for _ in range(reps):
        pos, neg = (shuffle_pair_llr(rng, int(row.runs), int(row.steps_per_epoch), epochs,
                                     sigma, inside) for inside in (True, False))
        out.append(audit_scores(pos, neg, row.alpha, row.delta, row.select_frac)["eps_lb"])
    return np.array(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", default="reference/shuffle_audit.csv")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    table, _ = io.read_table(args.table)
    rows = table[table.violation & (table.method == "whitebox-llr")]
    for row in rows.itertuples():
        n_eval = int(round(row.runs * (1 - row.select_frac)))
        ct_pos, ct_neg = round(row.tpr * n_eval), round(row.fpr * n_eval)
        p = bounds.claim_p_value(ct_pos, n_eval, ct_neg, n_eval, row.claimed_eps, row.delta)
        eps = replicate(row, args.reps, args.seed)
        print(f"{row.subject} B {row.batch_size}, S {row.steps_per_epoch}, E {row.epochs}: "
              f"certified {row.eps_lb:.3f} (counts {ct_pos}/{n_eval}, {ct_neg}/{n_eval}) "
              f"holds for alpha >= {p:.3g} (confidence <= {1 - p:.4f}); {args.reps} "
              f"replications of the exact pair at {row.runs} runs per side: eps_lb "
              f"{eps.mean():.2f} +- {eps.std(ddof=1):.2f} (range {eps.min():.2f} to "
              f"{eps.max():.2f}), above the claim {row.claimed_eps:g} in "
              f"{np.mean(eps > row.claimed_eps):.0%}", flush=True)


if __name__ == "__main__":
    main()
