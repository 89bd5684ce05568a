"""What the tight audits' statistics can certify at a given number of runs: the scores of
the strongest test of each audited mechanism, run through the audits' own split and bounds
(docs/tight.md, "Results at the full config's settings").

    python benchmarks/tight_ideal_scores.py [--runs 1000] [--draws 20]

- Black box (full batch, sample rate 1, 100 steps): the mechanism is exactly mu-GDP with
  mu = sqrt(steps) / sigma, sigma calibrated so that its PLD eps is the label
  (`dpaudit.experiments.tight.blackbox.blackbox_noise`); the best score is N(mu, 1) against N(0, 1).
- White box (the FMNIST cell: q = 250 / 6000, 576 steps, the noise of `config/config.yaml`'s
  FMNIST table and `tight.noise`): the canary's coordinate sees, at each step, N(0, 1)
  without the canary and N(b mu, 1) with it, b ~ Bernoulli(q), mu = 1 / sigma; the best
  score is the per-step likelihood ratio summed over steps (the audit's `whitebox-llr`
  with the data's gradients absent).

Prints, per label, the mean (range) over draws of the certified Clopper-Pearson eps_lb, of
the GDP estimate and the AUC, each draw `--runs` per side, the first half of each side
choosing the threshold (`whitebox.audit_scores`, the same statistics as both audits).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import yaml

from dpaudit.experiments.tight.blackbox import blackbox_noise
from dpaudit.experiments.tight.whitebox import audit_scores

ROOT = Path(__file__).parents[1]
ALPHA, DELTA = 0.05, 1e-5


def _summary(rows: list[dict]) -> str:
    out = []
    for name, key in (("certified eps_lb", "eps_lb"), ("GDP estimate", "eps_lb_gdp"),
                      ("AUC", "auc")):
        v = np.array([r[key] for r in rows])
        out.append(f"{name} {v.mean():.2f} ({v.min():.2f}-{v.max():.2f})")
    return ", ".join(out)


def blackbox(label: str, runs: int, draws: int, steps: int = 100) -> str:
    mu = np.sqrt(steps) / blackbox_noise(label, steps, DELTA)
    rows = []
    for draw in range(draws):
        rng = np.random.default_rng([draw, 1, int(float(label) * 10)])
        rows.append(audit_scores(rng.normal(mu, 1, runs), rng.normal(0, 1, runs), ALPHA,
                                 DELTA))
    return f"mu {mu:.2f}: " + _summary(rows)


def whitebox(sigma: float, runs: int, draws: int, q: float, steps: int, label: str) -> str:
    mu = 1 / sigma

    def llr(z):  # log(1 - q + q exp(mu z - mu^2 / 2)), summed over steps
        return np.log1p(q * np.expm1(mu * z - mu ** 2 / 2)).sum(axis=1)

    rows = []
    for draw in range(draws):
        rng = np.random.default_rng([draw, 2, int(float(label) * 10)])
        out = llr(rng.normal(size=(runs, steps)))
        sampled = rng.random((runs, steps)) < q
        rows.append(audit_scores(llr(rng.normal(size=(runs, steps)) + mu * sampled), out,
                                 ALPHA, DELTA))
    return f"sigma {sigma:.2f}: " + _summary(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=1000, help="runs per side")
    p.add_argument("--draws", type=int, default=20, help="independent audits per label")
    args = p.parse_args()
    cfg = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    fmnist = cfg["jagielski"]["datasets"]["fmnist"]
    noise = {**cfg["tight"]["noise"], **fmnist["noise"]}
    n = 6000  # the FMNIST task's training rows (classes 0 and 1)
    q, steps = fmnist["batch_size"] / n, round(fmnist["epochs"] * n / fmnist["batch_size"])
    print(f"{args.runs} runs per side, {args.draws} draws, alpha {ALPHA}, delta {DELTA}")
    for label in cfg["tight"]["eps"]:
        print(f"label {label}: black box {blackbox(label, args.runs, args.draws)}")
        wb = whitebox(noise[label], args.runs, args.draws, q, steps, label)
        print(f"label {label}: white box {wb}")


if __name__ == "__main__":
    main()
