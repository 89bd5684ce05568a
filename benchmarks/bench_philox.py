"""Normals and words per second of the CPU's Philox draws (dpaudit.dpsgd.philox): the
torch operations, the bulk path (compiled: dpaudit.dpsgd.cpu_draws), and torch's own
generator as drawn before the counter-based generator (one Mersenne Twister per run), at
the white box's noise draw (K runs x 25,186 parameters, one step). The three take turns in
every round (load from other processes hits them alike); best of ``--repeats``. The
first call of the bulk path compiles it where numba has not cached it yet (seconds).

    python benchmarks/bench_philox.py [--threads 2] [--repeats 5] [--runs 128] [--count 25186]
"""

from __future__ import annotations

import argparse
import time

import torch

from dpaudit.dpsgd import philox


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--runs", type=int, default=128)
    ap.add_argument("--count", type=int, default=25186)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    K, n = args.runs, args.count
    key = philox.keys(range(K), "cpu")
    gens = [torch.Generator().manual_seed(k) for k in range(K)]

    def path(bulk: bool, kind: str):
        def call():
            old, philox.CPU_BULK_BLOCKS = philox.CPU_BULK_BLOCKS, 0 if bulk else 2 ** 62
            try:
                philox.draw(kind, key, philox.NOISE, 3, n)
            finally:
                philox.CPU_BULK_BLOCKS = old
        return call

    def mersenne():
        out = torch.empty(K, n)
        for k in range(K):
            torch.randn(n, generator=gens[k], out=out[k])

    calls = {"normals, torch operations": path(False, "normal"),
             "normals, bulk (compiled)": path(True, "normal"),
             "normals, torch.randn per run (before)": mersenne,
             "words, torch operations": path(False, "words"),
             "words, bulk (compiled)": path(True, "words")}
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(args.repeats):
        for name, call in calls.items():
            t = time.perf_counter()
            call()
            best[name] = min(best[name], time.perf_counter() - t)
    print(f"{K} runs x {n} values, {args.threads} threads, best of {args.repeats}")
    base = best["normals, torch.randn per run (before)"]
    for name, t in best.items():
        print(f"{name}: {K * n / t / 1e6:.1f} M/s ({t / (K * n) * 1e9:.1f} ns each, "
              f"{base / t:.2f}x torch.randn)")


if __name__ == "__main__":
    main()
