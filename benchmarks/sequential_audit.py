"""Anytime-valid audits: soundness of the confidence sequences, and runs to a verdict.

    python benchmarks/sequential_audit.py soundness [--reps 1000 --runs 10000]
    python benchmarks/sequential_audit.py cost [--reps 200]
    python benchmarks/sequential_audit.py overhead [--alphas 1e-10 1e-3 0.05]

``soundness``: mechanisms whose epsilon is known, a decision fixed in advance, bounds
looked at after EVERY run up to ``--runs`` per side. Gaussian scores N(mu, 1) against
N(0, 1) (mu-GDP: true eps(delta) by ``eps_from_mu``, true profile by ``delta_from_mu``;
threshold mu/2) and randomized response at eps (output 1 with probability e^eps / (1 +
e^eps) with the canary, 1 / (1 + e^eps) without; delta = 0, and the event "output 1" is
tight, so its eps is the true one). Printed per mechanism: how often a rate's sequence
ever left its true rate (each at most alpha/2), how often eps_LB ever exceeded the true
eps and how often V ever exceeded 0 against the true profile (each at most alpha). The
rate columns use the sequence's definition directly (the lower end exceeds p iff ``log
M_n(p) >= ln(2/alpha)`` and ``S/n > p``: the set is an interval around ``S/n``), one
mixture evaluation per look, so the full 10^4 looks are cheap; the eps_LB and V columns
run the public functions on every look of the first ``--e2e-runs`` runs.

``cost``: runs per side to a verdict, the fixed audit of ``audit-impl`` (1000 evaluation
runs per side, Clopper-Pearson, eps and profile tests) against the sequential driver's
schedule (same 500 validation runs per side; rounds of 20, x1.5, at most ``--max-runs``),
at alpha = 1e-10, on the same simulated runs. Subjects, at the Opacus example's claim (eps
1 at delta 1e-5, q = 0.2, T = 100, sigma for it by PLD):
white-box scores of DP-SGD's canary coordinate, exactly simulated (per step N(0, 1)
without the canary, N(b / sigma, 1) with it, b ~ Bernoulli(q); the score is the summed
likelihood ratio) for the registry's ``fixed`` (correct), ``half-noise`` (sigma / 2) and
``half-steps`` (sigma calibrated for T / 2 steps, T trained), and the noise on the mean (sigma /
100, batch 100) in the white box; and the black box of the Opacus ``noise_on_mean`` as a
Gaussian shift N(3.1, 1) against N(0, 1) (3.1 = Phi^-1(0.99) + Phi^-1(0.78), its measured
FPR / TPR at 1000 runs; a stand-in, not its exact distribution).

``overhead``: how many more runs the sequential audit needs for the fixed audit's eps_LB,
by alpha, without simulation: at TPR / FPR pairs and fixed-audit sizes n, the smallest
multiple m (steps of 0.02) such that the sequential audit's eps_LB at its last look, at most
m n runs per side (``n_opt`` = m n, the driver's), reaches the fixed audit's
Clopper-Pearson eps_LB at n, both at the expected counts (rate times runs, rounded).
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
from scipy import stats

from dpaudit import accounting, bounds
from dpaudit.bounds import sequential as seq
from dpaudit.experiments.tramer.claim import ALPHA
from dpaudit.experiments.tramer.profile import claimed_profile
from dpaudit.experiments.tramer.sequential import Schedule

GRID = np.linspace(0.0, 20.0, 2001)


def rate_failures(hits, p: float, alpha: float, n_opt: int) -> tuple[np.ndarray, np.ndarray]:
    """Per replication (rows of ``hits``, runs along axis 1): did the lower / upper end of
    the sequence ever pass the true rate ``p``, at any look?"""
    level = alpha / 2
    c, thr = seq.mixture_concentration(n_opt, level), math.log(1 / level)
    ct = np.cumsum(hits, axis=1, dtype=float)
    n = np.arange(1, hits.shape[1] + 1, dtype=float)
    u = math.log(p)
    out = seq._log_mixture(ct, np.broadcast_to(n, ct.shape), np.full(ct.shape, u), c)[0] >= thr
    return (out & (ct > p * n)).any(axis=1), (out & (ct < p * n)).any(axis=1)


def e2e_failures(hits_in, hits_out, alpha, eps_true, delta, profile, n_opt):
    """Per replication: did eps_LB (or V against ``profile``) ever pass the truth, looking
    after every run, through the public functions?"""
    tpr_lo = bounds.running_confidence_sequence(hits_in, alpha, n_opt)[0]
    fpr_hi = bounds.running_confidence_sequence(hits_out, alpha, n_opt)[1]
    eps = bounds.eps_from_rate_bounds(tpr_lo, fpr_hi, delta)
    over_eps = (eps > eps_true).any(axis=1)
    if profile is None:
        return over_eps, np.zeros_like(over_eps)
    v = bounds.profile_from_rate_bounds(tpr_lo[:, -1], fpr_hi[:, -1], GRID, profile)[0]
    return over_eps, v > 0  # the running bounds at the end: the tightest of every look


def soundness(args) -> None:
    rng = np.random.default_rng(args.seed)
    mechs = []
    for mu in (0.5, 1.0, 2.0):
        t = mu / 2
        mechs.append((f"Gaussian mu {mu} (eps {bounds.eps_from_mu(mu, args.delta):.2f} at "
                      f"delta {args.delta:g})", stats.norm.sf(t - mu), stats.norm.sf(t),
                      bounds.eps_from_mu(mu, args.delta), args.delta,
                      np.array([bounds.delta_from_mu(mu, e) for e in GRID])))
    for eps in (0.5, 1.0, 2.0):
        p = math.exp(eps) / (1 + math.exp(eps))
        mechs.append((f"randomized response eps {eps}", p, 1 - p, eps, 0.0, None))
    print(f"alpha {args.alpha}, n_opt {args.n_opt}, {args.reps} replications, looks after "
          f"every run up to {args.runs} (rates) and {args.e2e_runs} (eps_LB, V) per side")
    print("| mechanism | TPR, FPR | TPR_lo > TPR ever | FPR_hi < FPR ever | eps_LB > eps ever "
          "| V > 0 ever |")
    print("|---|---|---|---|---|---|")
    for name, tpr, fpr, eps_true, delta, profile in mechs:
        start = time.time()
        f_in = f_out = e_eps = e_v = 0
        for lo in range(0, args.reps, args.chunk):
            k = min(args.chunk, args.reps - lo)
            h_in = rng.random((k, args.runs)) < tpr
            h_out = rng.random((k, args.runs)) < fpr
            f_in += rate_failures(h_in, tpr, args.alpha, args.n_opt)[0].sum()
            f_out += rate_failures(h_out, fpr, args.alpha, args.n_opt)[1].sum()
            a, b = e2e_failures(h_in[:, :args.e2e_runs], h_out[:, :args.e2e_runs], args.alpha,
                                eps_true, delta, profile, args.n_opt)
            e_eps, e_v = e_eps + a.sum(), e_v + b.sum()
        r = args.reps
        print(f"| {name} | {tpr:.3f}, {fpr:.3f} | {f_in / r:.4f} | {f_out / r:.4f} | "
              f"{e_eps / r:.4f} | {e_v / r:.4f} |" + (f" ({time.time() - start:.0f} s)"
                                                      if args.times else ""), flush=True)


def whitebox_scores(rng, sigma: float, q: float, steps: int, shape, canary: bool):
    """Summed per-step likelihood ratio of the canary coordinate (module docstring)."""
    mu = 1 / sigma
    out = np.zeros(shape)
    for _ in range(steps):  # step by step: memory
        z = rng.normal(size=shape) + (mu * (rng.random(shape) < q) if canary else 0.0)
        out += np.log1p(q * np.expm1(np.minimum(mu * z - mu ** 2 / 2, 700.0)))
    return out


def cost_subjects(args):
    q, steps = 0.2, 100
    sigma = accounting.noise_multiplier(args.eps, q, steps, args.delta, "pld")
    half_steps = accounting.noise_multiplier(args.eps, q, steps // 2, args.delta, "pld")
    white = {"fixed (correct)": sigma, "half-steps": half_steps, "half-noise": sigma / 2}
    subjects = {}
    for name, s in white.items():
        subjects[f"{name}, white box"] = (
            lambda rng, shape, canary, s=s: whitebox_scores(rng, s, q, steps, shape, canary),
            f"{accounting.epsilon(s, q, steps, args.delta, 'pld'):.2f}")
    subjects["noise on the mean, white box"] = (
        lambda rng, shape, canary: whitebox_scores(rng, sigma / 100, q, steps, shape, canary),
        "> 100")
    for mu in args.shifts:
        subjects[f"Gaussian shift N({mu:g}, 1)"] = (
            lambda rng, shape, canary, mu=mu: rng.normal(mu if canary else 0.0, 1.0, shape),
            f"{bounds.eps_from_mu(mu, args.delta):.2f}")
    return sigma, subjects


def audit_pair(val_in, val_out, ev_in, ev_out, args, profile, schedules):
    """Fixed and sequential verdicts of one replication: whether the fixed audit found a
    violation, and per schedule (whether the sequential one did, its evaluation runs per
    side)."""
    tests = {"eps": (bounds.eps_lb_clopper_pearson, dict(delta=args.delta)),
             "profile": (bounds.profile_violation, dict(epsilons=profile.epsilons,
                                                        deltas=profile.deltas))}
    fixed, hit = False, {k: 0 for k in schedules}
    for test, (f, kw) in tests.items():
        tau = bounds.choose_threshold(val_in, val_out, lambda *a, f=f, kw=kw: f(*a, **kw),
                                      ALPHA, "youden").threshold
        h_in, h_out = ev_in > tau, ev_out > tau
        n = args.fixed_runs
        fixed |= f(h_in[:n].sum(), n, h_out[:n].sum(), n, ALPHA, **kw) > (
            args.eps if test == "eps" else 0.0)
        for k, sch in schedules.items():
            idx = np.array(sch.targets()) - 1
            n_opt = sch.n_opt or sch.max_runs
            lo = bounds.running_confidence_sequence(h_in[:sch.max_runs], ALPHA, n_opt)[0][idx]
            hi = bounds.running_confidence_sequence(h_out[:sch.max_runs], ALPHA, n_opt)[1][idx]
            if test == "eps":
                hit[k] = hit[k] | (bounds.eps_from_rate_bounds(lo, hi, args.delta) > args.eps)
            else:
                hit[k] = hit[k] | (bounds.profile_from_rate_bounds(
                    lo, hi, profile.epsilons, profile.deltas)[0] > 0)
    out = {}
    for k, sch in schedules.items():
        targets = sch.targets()
        out[k] = (bool(np.any(hit[k])), targets[int(np.argmax(hit[k]))] if np.any(hit[k])
                  else targets[-1])
    return bool(fixed), out


def cost(args) -> None:
    sigma, subjects = cost_subjects(args)
    profile = claimed_profile(sigma, 0.2, 100)
    schedules = {f"max {m}": Schedule(first=20, growth=1.5, max_runs=m)
                 for m in args.max_runs}
    print(f"claim eps {args.eps} at delta {args.delta:g} (sigma {sigma:.3f}, q 0.2, T 100), "
          f"alpha {ALPHA:g}, {args.val_runs} validation runs per side, {args.reps} "
          f"replications; fixed: {args.fixed_runs} evaluation runs per side")
    print("| subject | true eps | fixed: violation rate | " + " | ".join(
        f"sequential {k}: violation rate, mean (median) evaluation runs" for k in schedules)
          + " |")
    print("|---|---|---|" + "---|" * len(schedules))
    rng = np.random.default_rng(args.seed)
    top = max(max(args.max_runs), args.fixed_runs)
    for name, (draw, eps_true) in subjects.items():
        start = time.time()
        res = {k: [] for k in schedules}
        fixed = []
        for _ in range(args.reps):
            v_in, e_in = np.split(draw(rng, (args.val_runs + top,), True), [args.val_runs])
            v_out, e_out = np.split(draw(rng, (args.val_runs + top,), False), [args.val_runs])
            f, per = audit_pair(v_in, v_out, e_in, e_out, args, profile, schedules)
            fixed.append(f)
            for k in schedules:
                res[k].append(per[k])
        cells = [f"{np.mean([h for h, _ in r]):.2f}, {np.mean([n for _, n in r]):.0f} "
                 f"({np.median([n for _, n in r]):.0f})" for r in res.values()]
        print(f"| {name} | {eps_true} | {np.mean(fixed):.2f} | " + " | ".join(cells)
              + " |" + (f" ({time.time() - start:.0f} s)" if args.times else ""), flush=True)


def runs_multiple(tpr: float, fpr: float, n: int, alpha: float, delta: float) -> float | None:
    """The ``overhead`` study's m for one cell (module docstring); None past m = 4."""
    def eps_at(runs: int, sequential: bool) -> float:
        ct_pos, ct_neg = round(tpr * runs), round(fpr * runs)
        if sequential:
            return seq.eps_lb_sequential(ct_pos, runs, ct_neg, runs, alpha, delta, n_opt=runs)
        return bounds.eps_lb_clopper_pearson(ct_pos, runs, ct_neg, runs, alpha, delta)

    fixed = eps_at(n, False)
    return next((m for m in np.round(np.arange(1.0, 4.0, 0.02), 2)
                 if eps_at(int(m * n), True) >= fixed), None)


def overhead(args) -> None:
    pairs = ((0.9, 0.05), (0.78, 0.01), (0.5, 0.02), (0.3, 0.05))
    sizes = (100, 300, 1000)
    print(f"runs per side of the sequential audit (at most m n) for the fixed audit's eps_LB "
          f"at n, delta {args.delta:g}; cells: m (- where the fixed eps_LB is 0)")
    print("| alpha | TPR / FPR | " + " | ".join(f"n = {n}" for n in sizes) + " |")
    print("|---|---|" + "---|" * len(sizes))
    for alpha in args.alphas:
        for tpr, fpr in pairs:
            cells = []
            for n in sizes:
                if bounds.eps_lb_clopper_pearson(round(tpr * n), n, round(fpr * n), n, alpha,
                                                 args.delta) <= 0:
                    cells.append("-")
                    continue
                m = runs_multiple(tpr, fpr, n, alpha, args.delta)
                cells.append("> 4" if m is None else f"{m:.2f}")
            print(f"| {alpha:g} | {tpr:g} / {fpr:g} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", choices=("soundness", "cost", "overhead"))
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--times", action="store_true", help="print each row's seconds")
    parser.add_argument("--alpha", type=float, default=0.05, help="soundness: the level")
    parser.add_argument("--runs", type=int, default=10_000, help="soundness: looks per side")
    parser.add_argument("--e2e-runs", type=int, default=2000,
                        help="soundness: looks per side through eps_LB and V")
    parser.add_argument("--n-opt", type=int, default=1000, help="soundness: the tuning n")
    parser.add_argument("--chunk", type=int, default=50, help="soundness: replications at once")
    parser.add_argument("--eps", type=float, default=1.0, help="cost: the claimed eps")
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--val-runs", type=int, default=500)
    parser.add_argument("--fixed-runs", type=int, default=1000)
    parser.add_argument("--max-runs", type=int, nargs="+", default=[1000, 1300])
    parser.add_argument("--shifts", type=float, nargs="+", default=[0.8, 0.9, 1.0, 1.5, 3.1],
                        help="cost: Gaussian shifts mu (black-box stand-ins; 3.1: Opacus "
                             "noise_on_mean)")
    parser.add_argument("--alphas", type=float, nargs="+", default=[1e-10, 1e-3, 0.05],
                        help="overhead: the levels")
    args = parser.parse_args()
    if args.reps is None:
        args.reps = 300 if args.study == "soundness" else 40
    start = time.time()
    {"soundness": soundness, "cost": cost, "overhead": overhead}[args.study](args)
    print(f"({time.time() - start:.0f} s)")


if __name__ == "__main__":
    main()
