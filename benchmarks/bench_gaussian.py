"""Time the HW3 Gaussian sum-audit grids and report their peak memory.

    python benchmarks/bench_gaussian.py                      # full config, 2 threads
    python benchmarks/bench_gaussian.py --config config/quick.yaml --threads 1

Each grid runs in its own process (as a Snakemake job does), so its peak resident
memory (``ru_maxrss``) is its own.  Prints one line per grid and the total; the grids
run one after another, each with ``--threads`` drawing threads, which is what
``snakemake --cores 2`` does with the ``threads: 2`` hw3 rules.

``--config`` other than ``config/config.yaml`` is an overlay, as for Snakemake's
``--configfile``: it is merged over ``config/config.yaml`` key by key, recursively, with
lists replaced whole.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BASE_CONFIG = ROOT / "config" / "config.yaml"


def _merge(base: dict, overlay: dict) -> dict:
    """``overlay`` over ``base`` as Snakemake merges a ``--configfile``: dicts recursively,
    anything else (lists included) replaced whole."""
    out = dict(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def load_config(path: Path) -> dict:
    """``config/config.yaml``, with ``path`` merged over it unless it is that file."""
    config = yaml.safe_load(BASE_CONFIG.read_text())
    if path.resolve() != BASE_CONFIG.resolve():
        config = _merge(config, yaml.safe_load(path.read_text()) or {})
    return config


def _run_one(spec: dict, grid: str, seed: int, threads: int) -> None:
    """Child process: run one grid and print its time and peak memory as JSON."""
    from dpaudit.experiments.gaussian_sum import audit_grid

    axes = spec["grids"][grid]
    start = time.perf_counter()
    df = audit_grid(grid, axes["eps"], axes["m"], axes["d"], spec["delta"], spec["repeats"],
                    seed, spec["beta"], spec["max_m1"], threads, int(spec["cache_mb"] * 2**20))
    seconds = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    normals = sum(2 * m * d for m in axes["m"] for d in axes["d"]) * spec["repeats"]
    print(json.dumps({"grid": grid, "seconds": seconds, "peak_mb": peak_mb, "rows": len(df),
                      "upper_normals": normals}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=BASE_CONFIG,
                        help="config/config.yaml, or an overlay over it (config/quick.yaml)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--grids", nargs="+", default=["eps", "m", "d"])
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    config = load_config(args.config)
    spec, seed = config["hw3"], config["seed"]
    if args.one:
        _run_one(spec, args.one, seed, args.threads)
        return
    print(f"# {args.config.name}: repeats={spec['repeats']}, threads={args.threads}, "
          f"cache_mb={spec['cache_mb']}")
    print(f"{'grid':>5} {'rows':>6} {'seconds':>8} {'peak MB':>8} {'ns/normal (<=2 passes)':>23}")
    total = 0.0
    for grid in args.grids:
        out = subprocess.run([sys.executable, __file__, "--config", str(args.config),
                              "--threads", str(args.threads), "--one", grid],
                             check=True, capture_output=True, text=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        total += r["seconds"]
        print(f"{grid:>5} {r['rows']:6d} {r['seconds']:8.1f} {r['peak_mb']:8.0f} "
              f"{1e9 * r['seconds'] / r['upper_normals']:23.2f}")
    print(f"total {total:.1f} s")


if __name__ == "__main__":
    main()
