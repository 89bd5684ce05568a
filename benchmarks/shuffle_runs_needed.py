"""How many runs per side a certified violation of shuffled DP-SGD's Poisson claim takes:
the white box with crafted batch mates sees Chua et al.'s pair (docs/shuffle.md), so its
audit is simulated on the pair itself, with the audit's statistics (half the runs choose
the threshold, Clopper-Pearson on the rest, dpaudit.bounds).

    python benchmarks/shuffle_runs_needed.py [--steps 10] [--epochs 5] [--eps 2]
        [--runs 3000 10000 30000 100000] [--draws 3] [--seed 3]

Prints, per run count, the certified eps_lb of each draw, and the claim and Chua et al.'s
lower bound at the noise whose Poisson PLD eps is the claim (the shuffle target's noise).
"""

from __future__ import annotations

import argparse
from functools import partial

import numpy as np

from dpaudit import accounting, bounds
from dpaudit.experiments.runs_needed import shuffle_pair_llr as pair_llr
from dpaudit.shuffle_accounting import shuffle_eps_lower


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=10, help="batches per epoch S")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--eps", type=float, default=2.0, help="the Poisson claim")
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--runs", type=int, nargs="+", default=[3000, 10000, 30000, 100000])
    ap.add_argument("--draws", type=int, default=3)
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args()
    S, E = args.steps, args.epochs
    sigma = accounting.noise_multiplier(args.eps, 1 / S, S * E, args.delta, "pld")
    print(f"S {S}, E {E}: noise {sigma:.4f}, claim {args.eps:g}, Chua et al.'s lower bound "
          f"{shuffle_eps_lower(sigma, S, E, args.delta):.3f}")
    rng = np.random.default_rng(args.seed)
    cp = partial(bounds.eps_lb_clopper_pearson, delta=args.delta)
    for runs in args.runs:
        got = []
        for _ in range(args.draws):
            pos = pair_llr(rng, runs, S, E, sigma, True)
            neg = pair_llr(rng, runs, S, E, sigma, False)
            audit = bounds.threshold_holdout_audit(*bounds.split_trials(pos, neg, 0.5), cp,
                                                   args.alpha)
            got.append(f"{float(audit.value):.2f}")
        print(f"{runs} runs per side: certified eps_lb {', '.join(got)}", flush=True)


if __name__ == "__main__":
    main()
