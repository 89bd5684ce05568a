"""Coverage of the count-to-epsilon methods by simulation on randomized response.

    python benchmarks/bound_coverage.py                  # the table of docs/statistics.md
    python benchmarks/bound_coverage.py --audits 500 --bayes-audits 200   # a quicker look

Randomized response at eps (output 1 with probability e^eps / (1 + e^eps) when the
canary is in, 1 / (1 + e^eps) when out) is exactly eps-DP and the event "output 1" is
tight, so a method's lower bound exceeds the true eps in at most alpha of the audits if
it is valid.  For each (eps, trials per side n) the script audits ``--audits`` times and
prints, per method, the fraction of audits whose bound exceeds eps (nominal: alpha), the
median bound, and the fraction of audits with a zero count on some side (where Katz uses
its +0.5 correction).  ``eps_lb_bayes`` is a credible bound: its frequentist coverage is
measured here for information, it promises none.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from dpaudit import bounds

METHODS = {"clopper_pearson": bounds.eps_lb_clopper_pearson, "katz": bounds.eps_lb_katz,
           "bayes": bounds.eps_lb_bayes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--eps", type=float, nargs="+", default=[0.5, 1.0, 2.0, 4.0])
    parser.add_argument("--n", type=int, nargs="+", default=[10, 20, 50, 100, 1000])
    parser.add_argument("--audits", type=int, default=4000)
    parser.add_argument("--bayes-audits", type=int, default=1000,
                        help="audits for the (slower) Bayesian bound, the first of --audits")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"alpha = {args.alpha}; P[bound > eps] (nominal {args.alpha}), median bound; "
          f"{args.audits} audits ({args.bayes_audits} for Bayes)")
    print("| eps | n | zero count | " + " | ".join(f"{m}: over, median" for m in METHODS) + " |")
    print("|---" * (3 + len(METHODS)) + "|")
    start = time.time()
    for eps in args.eps:
        fpr = 1 / (1 + np.exp(eps))
        for n in args.n:
            ct_pos = rng.binomial(n, np.exp(eps) * fpr, args.audits)
            ct_neg = rng.binomial(n, fpr, args.audits)
            zero = np.mean((ct_neg == 0) | (ct_pos == n) | (ct_pos == 0) | (ct_neg == n))
            cells = []
            for name, fn in METHODS.items():
                m = args.bayes_audits if name == "bayes" else args.audits
                lb = np.asarray(fn(ct_pos[:m], n, ct_neg[:m], n, args.alpha))
                cells.append(f"{np.mean(lb > eps):.3f}, {np.median(lb):.2f}")
            print(f"| {eps:g} | {n} | {zero:.2f} | " + " | ".join(cells) + " |", flush=True)
    print(f"({time.time() - start:.0f} s)")


if __name__ == "__main__":
    main()
