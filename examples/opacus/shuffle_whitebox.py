"""The shuffling gap in real Opacus code: poisson_sampling=False (a shuffled DataLoader,
while Opacus reports the Poisson epsilon) audited in the white-box mode with Chua et al.'s
crafted batch mates (-1), at a setting where their lower bound is far above the claim.

    python examples/opacus/shuffle_whitebox.py --runs 400 --data-root DIR

--poisson: the control, correct Opacus (Poisson sampling) at the same noise, audited
the same way (its claim an upper bound on its epsilon: never certified above it).

Logistic regression on the first n = 100 rows of Fashion-MNIST classes 0/1, batch size 1,
one epoch (S = 100 steps), clip 1, lr 0.1, at the noise multiplier for which Poisson
accounting (PLD, q = 1/100) claims (2, 1e-5). The Dirac canary sits on the weight of the
quietest pixel, as in audit-impl --mode white-box; --runs runs per side train with
it and without it (zero-out, docs/shuffle.md), each scored by its llr (Chua et al.'s pair,
dpaudit.dpsgd.CanaryScores), and the bounds are those of shuffle-audit
(dpaudit.experiments.tight.whitebox.audit_scores: half the runs choose the
threshold, the other half give the Clopper-Pearson eps_LB at --alpha and the GDP
estimate). Prints one line. With --runs 5000 (about 40 minutes on one core) it
certifies the violation (docs/audit_your_implementation.md, "The Opacus settings that
break a claim"). Needs Opacus: pip install -e ".[opacus]".
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import warnings

import torch
from torch import nn

from dpaudit import dpsgd
from dpaudit.adapters.opacus import OpacusTrainer
from dpaudit.data import load_fmnist
from dpaudit.experiments import shuffle
from dpaudit.experiments.tight import whitebox

N, BATCH, EPOCHS, CLIP, LR, EPS, DELTA, MATES = 100, 1, 1, 1.0, 0.1, 2.0, 1e-5, -1.0


def measure(X: torch.Tensor, y: torch.Tensor, runs: int, seed: int, alpha: float,
            poisson: bool = False) -> str:
    """The audit of the shuffled (or ``poisson``) Opacus training on the first N rows of
    (X, y); its line."""
    setting = shuffle.Setting("lr", BATCH, N // BATCH, EPOCHS, EPS)
    lines = shuffle.theory(setting, DELTA)
    train = OpacusTrainer(lambda: nn.Linear(X.shape[1], 2),
                          lambda p: torch.optim.SGD(p, lr=LR), max_grad_norm=CLIP,
                          batch_size=BATCH, epochs=EPOCHS, n=N,
                          noise_multiplier=lines["noise"], poisson_sampling=poisson)
    X, y = X[:N], y[:N]
    model = dpsgd.ModelSpec("lr", X.shape[1], n_classes=2)
    direction = whitebox.canary(X.numpy(), model, CLIP, seed, device="cpu")
    llr, start = {}, time.perf_counter()
    for side, seeds in whitebox.run_seeds(runs, seed, "lr").items():
        given = dpsgd.GradientCanaries(direction, torch.full((runs, 1), side == "in"),
                                       mates=MATES)
        llr[side] = train(X, y, seeds, {}, canaries=given).llr[:, 0].numpy()
    took = time.perf_counter() - start
    s = whitebox.audit_scores(llr["in"], llr["out"], alpha, DELTA)
    theory = ("" if poisson else f"; Chua et al.'s lower bound {lines['shuffle'][0]:.2f}, "
              f"no amplification {lines['shuffle'][1]:.2f}")
    return (f"Opacus poisson_sampling={poisson}, lr n={N} B={BATCH} E={EPOCHS}, sigma "
            f"{lines['noise']:.3f} (claim {lines['claimed_eps']:.2f} by PLD, "
            f"{train.epsilon(DELTA):.2f} by Opacus' {train.accountant}), white box, mates "
            f"{MATES:g}, {runs} runs per side in {took:.0f} s: eps_LB {s['eps_lb']:.2f} "
            f"(certified, alpha {alpha:g}), GDP estimate {s['eps_lb_gdp']:.2f}, TPR / FPR "
            f"{s['tpr']:.3f} / {s['fpr']:.3f}, AUC {s['auc']:.3f}{theory}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=400, help="runs per side (default 400)")
    p.add_argument("--poisson", action="store_true", help="the control: Poisson sampling")
    p.add_argument("--alpha", type=float, default=0.05,
                   help="1 - the confidence of eps_LB (default 0.05)")
    p.add_argument("--seed", type=int, default=0, help="master seed of the runs (default 0)")
    p.add_argument("--data-root", default=None, help="the data folder holding Fashion-MNIST "
                   "(default $DPAUDIT_DATA or ~/.cache/dpaudit/data; Debian's "
                   "dataset-fashion-mnist package is found without it)")
    a = p.parse_args(argv)
    if a.runs < 4:
        p.error(f"--runs {a.runs}: must be >= 4 (half the runs choose the threshold, half "
                f"evaluate it, at least 2 per side each)")
    torch.set_num_threads(1)  # tiny models (examples/opacus/audit.py)
    # Poisson batches at q = 1/100 are often empty; Opacus warns at every one.
    logging.getLogger("opacus.data_loader").setLevel(logging.ERROR)
    X, y = load_fmnist(a.data_root, (0, 1))
    with warnings.catch_warnings():
        # Opacus' PRV accountant bounds its domain with RDP, whose orders it warns about.
        warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
        print(measure(torch.as_tensor(X), torch.as_tensor(y), a.runs, a.seed, a.alpha,
                      a.poisson))
    return 0


if __name__ == "__main__":
    sys.exit(main())
