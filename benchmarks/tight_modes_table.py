"""The table "How much the tight modes gain" of docs/audit_your_implementation.md: the eps
test and the profile test of `dpaudit audit-impl` in each mode, on the registry subjects.

    python benchmarks/tight_modes_table.py --data-root DATA --out-dir results/tight_modes

The case-study setting (FMNIST 0/1, n = 500, logistic regression, q = 0.2, T = 100, lr
50, clip 0.1, the checkerboard canary), claims (0.21, 1e-5) and (2, 1e-5), seed 0, on the
CPU. Stage 1 trains: for every claim, subject and mode one `dpaudit audit-impl` with the
largest run count (as many validation as evaluation runs per side), which keeps every
run's canary loss (white box: score) in OUT_DIR; a table already there is kept. Stage 2
audits the first n runs of each split and side for every n of the grid, at each alpha:
the runs of `--runs n --val-runs n` are exactly these (a run's seed is a prefix of the
larger run's), but for the canary label of the black-box modes, which the larger run chose
on all its validation runs (at 200 runs per side identical, checked at the claim 2).
`fixed`, `half-noise` and `half-steps` are trained with up to 5000 runs per side
(:data:`PLANS`, :data:`SMALLER`), `buggy` with 200, where the script reports the fewest
runs at which each test flags it.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from dpaudit import bounds, subjects
from dpaudit.cli import main as cli
from dpaudit.experiments import tramer
from dpaudit.io import read_table

SPEC = {"arch": "lr", "epochs": 20, "batch_size": 100, "lr": 50.0, "clip": 0.1,
        "device": "cpu"}
N_TRAIN, DELTA = 500, 1e-5
#: (implementations, largest runs per side by mode, n audited): buggy where it is
#: flagged, the others up to 5000 runs per side (half-steps: 1000 in the black-box modes,
#: which see nothing of it).
PLANS = [(["buggy"], dict.fromkeys(tramer.MODES, 200), [*range(2, 50), *range(50, 201, 5)]),
         (["half-noise", "fixed"], dict.fromkeys(tramer.MODES, 5000),
          [200, 500, 1000, 2000, 5000]),
         (["half-steps"], {"black-box": 1000, "worst-case-init": 1000, "white-box": 5000},
          [200, 1000, 2000, 5000])]
#: At the claim 0.21 the black-box modes train at most 2000 runs per side: there no test
#: sees half-noise (the profile test would need about 10^4 even with the white box).
SMALLER = {(0.21, "black-box"): 2000, (0.21, "worst-case-init"): 2000}


def calls(targets: list[str], mode: str) -> list[tuple[str, list[str]]]:
    """(file name, implementations) of the audit-impl calls of one plan: the black-box mode
    trains the registry subjects of one spec as columns of one call, the tight modes one
    subject per call."""
    if mode == "black-box" and len(targets) > 1:
        return [("both", targets)]
    return [(t, [t]) for t in targets]


def train(out_dir: Path, claim: float, name: str, targets: list[str], runs: int, mode: str,
          root: str) -> Path:
    """Stage 1: the losses table of one `audit-impl` call (trained unless kept)."""
    out = out_dir / f"c{claim:g}_{name}_{mode}_{runs}.csv"
    losses = out.with_name(f"{out.stem}_losses.csv")
    if not losses.exists():
        start = time.perf_counter()
        code = cli(["audit-impl", "--train", *targets, "--eps", str(claim), "--delta",
                    str(DELTA), "--runs", str(runs), "--val-runs", str(runs), "--spec",
                    json.dumps(SPEC), "--data-root", root, "--seed", "0", "--out", str(out),
                    "--mode", mode, "--batch-runs", "1000"])
        if code:
            raise SystemExit(f"audit-impl of {out.name} failed ({code})")
        print(f"{out.name}: trained in {time.perf_counter() - start:.0f} s", flush=True)
    return losses


def audit(losses: pd.DataFrame, claim: float, n: int, alpha: float,
          profile: tramer.ClaimedProfile) -> dict:
    """Stage 2: both tests on the first n runs of each split and side."""
    first = losses[losses.run < n]
    column = "score" if "score" in first else "loss"
    g = {k: v[column].to_numpy(float) for k, v in first.groupby(["split", "canary_in"])}
    args = (g[("validation", True)], g[("validation", False)], g[("evaluation", True)],
            g[("evaluation", False)], claim, DELTA, alpha, profile)
    return (tramer.audit_scores if column == "score" else tramer.audit_losses)(*args)


def plug_in_violation(ct_pos, n_pos, ct_neg, n_neg, alpha, epsilons, deltas):
    """V of the rates themselves, no confidence bounds (``alpha`` unused): the selection
    rule :func:`compare_selection` sets against the audit's."""
    p1, p0 = np.asarray(ct_pos) / n_pos, np.asarray(ct_neg) / n_neg
    grow = np.exp(epsilons)
    lb = np.maximum(p1[:, None] - grow * p0[:, None], (1 - p0)[:, None] - grow * (1 - p1)[:, None])
    return (lb - deltas).max(1)


def compare_selection(df: pd.DataFrame, out_dir: Path, profiles: dict) -> str:
    """The profile test's V with its threshold chosen on the validation runs by the plug-in
    V instead of the audit's (the Clopper-Pearson V at its alpha), on every audit of
    ``df`` but buggy's: how often it is larger, equal, smaller, and the flags it changes."""
    counts = dict.fromkeys(("larger", "equal", "smaller"), 0)
    changed = []
    for row in df[df.implementation != "buggy"].itertuples():
        name = "both" if row.mode == "black-box" and row.implementation != "half-steps" \
            else row.implementation
        path = next(out_dir.glob(f"c{row.claim:g}_{name}_{row.mode}_*_losses.csv"))
        losses, _ = read_table(path)
        first = losses[(losses.implementation == row.implementation) & (losses.run < row.runs)]
        sign, column = (1, "score") if "score" in first else (-1, "loss")
        g = {k: sign * v[column].to_numpy(float) for k, v in first.groupby(["split", "canary_in"])}
        prof = profiles[row.claim]
        res = bounds.threshold_holdout_audit(
            g[("validation", True)], g[("validation", False)], g[("evaluation", True)],
            g[("evaluation", False)], partial(plug_in_violation, epsilons=prof.epsilons,
                                             deltas=prof.deltas), 0.5, ties="youden")
        v = bounds.profile_violation(res.ct_pos, res.n_pos, res.ct_neg, res.n_neg, row.alpha,
                                     prof.epsilons, prof.deltas)
        d = v - row.profile_violation
        counts["larger" if d > 1e-12 else "smaller" if d < -1e-12 else "equal"] += 1
        if (v > 0) != row.profile_violated:
            changed.append(f"{row.implementation} {row.mode} claim {row.claim:g} {row.runs} "
                           f"runs alpha {row.alpha:g}: V {row.profile_violation:+.3f} -> {v:+.3f}")
    return f"plug-in selection: {counts}\n" + "\n".join(changed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", required=True)
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--claims", type=float, nargs="+", default=[0.21, 2.0])
    parser.add_argument("--alphas", type=float, nargs="+", default=[1e-10, 0.05])
    parser.add_argument("--compare-selection", action="store_true",
                        help="also choose the profile test's threshold by the plug-in V")
    args = parser.parse_args()
    logging.getLogger("absl").setLevel(logging.ERROR)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    rows, profiles = [], {}
    for claim in args.claims:
        spec = {**SPEC, "eps": claim, "delta": DELTA, "n": N_TRAIN}
        profile = tramer.claimed_profile(*subjects.claimed_dpsgd(spec, claim, DELTA, N_TRAIN))
        profiles[claim] = profile
        for targets, largest, grid in PLANS:
            for mode in tramer.MODES:
                runs = min(largest[mode], SMALLER.get((claim, mode), largest[mode]))
                audited = [n for n in grid if n <= runs]
                for name, these in calls(targets, mode):
                    path = train(args.out_dir, claim, name, these, runs, mode, args.data_root)
                    for impl, losses in read_table(path)[0].groupby("implementation"):
                        for n in audited:
                            for alpha in args.alphas:
                                rows.append({"claim": claim, "implementation": impl,
                                             "mode": mode, "runs": n, "alpha": alpha,
                                             **audit(losses, claim, n, alpha, profile)})
    df = pd.DataFrame(rows)
    df.to_csv(args.out_dir / "table.csv", index=False)
    print(markdown(df))
    if args.compare_selection:
        print(compare_selection(df, args.out_dir, profiles))


def _cell(row) -> str:
    """eps_LB / V, each bold where its test flags."""
    eps = f"{row.eps_lb:.2f}"
    v = f"{row.profile_violation:+.3f}"
    return (f"**{eps}**" if row.eps_lb > row.claim else eps) + " / " + (
        f"**{v}**" if row.profile_violated else v)


def markdown(df: pd.DataFrame) -> str:
    """The docs' tables: per claim, eps_LB / V of each mode by subject, runs and alpha; and
    the fewest runs (of the grid) at which each test flags `buggy`."""
    lines = []
    order = {t: i for i, t in enumerate(t for targets, _, _ in PLANS for t in targets)}
    df = df.sort_values("implementation", key=lambda c: c.map(order), kind="stable")
    for claim, mine in df[df.implementation != "buggy"].groupby("claim", sort=False):
        lines += [f"claim ({claim:g}, {DELTA:g}):", "",
                  "| subject | runs per side | alpha | " + " | ".join(tramer.MODES) + " |",
                  "|---|---|---|---|---|---|"]
        for (impl, n, alpha), grp in mine.groupby(["implementation", "runs", "alpha"],
                                                  sort=False):
            by_mode = {r.mode: _cell(r) for r in grp.itertuples()}
            lines.append(f"| `{impl}` | {n} | {alpha:g} | " + " | ".join(
                by_mode.get(m, "") for m in tramer.MODES) + " |")
        lines.append("")
    lines += ["| claim | alpha | " + " | ".join(tramer.MODES) + " |", "|---|---|---|---|---|"]
    bug = df[df.implementation == "buggy"]
    for (claim, alpha), grp in bug.groupby(["claim", "alpha"], sort=False):
        cells = []
        for mode in tramer.MODES:
            mine = grp[grp["mode"] == mode]
            tried = sorted(mine.runs)
            found = [mine[mine.eps_lb > claim].runs.min(), mine[mine.profile_violated].runs.min()]
            cells.append(" / ".join(
                f"> {tried[-1]}" if pd.isna(n) else f"<= {n}" if n == tried[0] else str(n)
                for n in found))
        lines.append(f"| {claim:g} | {alpha:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
