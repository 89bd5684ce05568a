"""What running a user's training function in a worker process (dpaudit.user_code.Worker)
costs ``audit-impl``, against calling it in the auditor's process.

  overhead  per-call time of ``train_runs`` (one train call, predict on the canary and on a
            test set of 2000 rows of 784 features) with a trivial function (one fixed
            linear model per seed), in this process and in a worker, and the worker's
            start (a Python process importing torch and the function's module);
  threads   a small user training function (full-batch gradient descent of logistic
            regression 784 -> 2 on 500 rows, 50 steps, one model per seed, 8 seeds per
            call) in a worker with 1 thread (the default) and with 2.

Usage: ``python benchmarks/bench_worker.py [--calls N] [--repeats R]``; prints seconds per
call (best of R rounds). On a machine shared with other jobs the figures vary; say so.
"""

from __future__ import annotations

import argparse
import time

import torch


def trivial(X, y, seeds, spec):
    """One fixed linear model per seed (no training): the overhead of a call alone."""
    W = torch.stack([torch.randn(X.shape[1], 2, generator=torch.Generator().manual_seed(s))
                     for s in seeds])
    return lambda x: x @ W


def small(X, y, seeds, spec):
    """Full-batch gradient descent of logistic regression, 50 steps, one model per seed."""
    models = []
    for s in seeds:
        g = torch.Generator().manual_seed(s)
        W = 0.01 * torch.randn(X.shape[1], 2, generator=g)
        onehot = torch.nn.functional.one_hot(y, 2).float()
        for _ in range(50):
            W -= 0.1 * X.T @ (torch.softmax(X @ W, 1) - onehot) / len(X)
        models.append(W)
    W = torch.stack(models)
    return lambda x: x @ W


def _best(fn, calls: int, repeats: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def main() -> None:
    from dpaudit.experiments.tramer import train_runs
    from dpaudit.user_code import Worker

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    X, y = torch.rand(500, 784, generator=g), torch.arange(500) % 2
    test = (torch.rand(2000, 784, generator=g), torch.arange(2000) % 2)
    seeds = list(range(8))

    def runs(fn):
        return lambda: train_runs(fn, X, y, X[0], seeds, {}, 1, test, None, "runs", 60)

    tiny = (X[:, :10], y, X[0, :10], (test[0][:10, :10], test[1][:10]))
    cases = {"tiny (100 x 10 rows, 10 test rows)": tiny,
             "audit-sized (500 x 784 rows, 2000 test rows)": (X, y, X[0], test)}
    for name, (Xc, yc, xc, tc) in cases.items():
        def runs(fn):
            return lambda: train_runs(fn, Xc, yc, xc, seeds, {}, 1, tc, None, "runs", 60)

        here = _best(runs(trivial), args.calls, args.repeats)
        t0 = time.perf_counter()
        with Worker("bench_worker:trivial", trivial) as worker:
            runs(worker)()
            start = time.perf_counter() - t0
            there = _best(runs(worker), args.calls, args.repeats)
        print(f"overhead, trivial function, 8 seeds, {name}: in process {here * 1e3:.2f} ms, "
              f"in a worker {there * 1e3:.2f} ms per call ({(there - here) * 1e3:+.2f} ms); "
              f"worker start and first call {start:.2f} s")
    for threads in (1, 2):
        with Worker("bench_worker:small", small, threads) as worker:
            t = _best(lambda: train_runs(worker, X, y, X[0], seeds, {}, 1, test, None, "runs",
                                         600), max(1, args.calls // 50), args.repeats)
        print(f"threads: small training function (8 models x 50 full-batch steps, 500 x 784) "
              f"in a worker with {threads} thread(s): {t * 1e3:.1f} ms per call")

if __name__ == "__main__":
    main()
