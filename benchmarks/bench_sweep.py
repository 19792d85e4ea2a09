"""Sweep throughput: the same 8 mnist1d-mlp runs (2 seeds × the 4 default arms, 60 epochs each) trained
with every way of spending this machine's cores.

    python benchmarks/bench_sweep.py [--rounds 2] [--no-ray]

Each variant is one `lambda-gelu run` in a fresh process and a fresh results directory, timed whole
(process start, data, training, storing), the variants interleaved round by round so machine load hits
them alike; the medians give runs per hour and the ratio to one process of 2 threads. Every variant
must store the same 8 runs. Writes benchmarks/results/sweep.json.
"""
from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

from _common import header, positive_int, print_table, save

RUNS = ["run", "mnist1d-mlp", "--seeds", "2", "--quiet", "--no-report"]
VARIANTS = {  # label: the arguments that make it
    "1 process × 1 thread": ["--threads", "1"],
    "1 process × 2 threads": ["--threads", "2"],
    "2 worker processes × 1 thread": ["--workers", "2", "--threads", "1"],
    "2 Ray tasks × 1 thread": ["--executor", "ray", "--workers", "2", "--threads", "1"],
}
BASELINE = "1 process × 2 threads"


def sweep(args: list[str]) -> tuple[float, int]:
    """Seconds for the whole sweep, and how many runs it stored."""
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "lambda_gelu_lab", *RUNS, *args, "--out", out], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        seconds = time.perf_counter() - t0
        with sqlite3.connect(os.path.join(out, "results.sqlite")) as db:
            (stored,), = db.execute("SELECT count(*) FROM runs").fetchall()
    return seconds, stored


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=positive_int, default=2)
    p.add_argument("--no-ray", action="store_true", help="leave out the Ray variant")
    args = p.parse_args()
    variants = {k: v for k, v in VARIANTS.items() if not (args.no_ray and "Ray" in k)}
    times = {k: [] for k in variants}
    for r in range(args.rounds):
        for label, extra in variants.items():
            seconds, stored = sweep(extra)
            if stored != 8:
                raise SystemExit(f"{label} stored {stored} runs, not 8")
            times[label].append(seconds)
            print(f"round {r + 1}: {label}: {seconds:.1f} s", file=sys.stderr)
    head = header()
    base = statistics.median(times[BASELINE])
    results = [{"variant": k, "seconds": statistics.median(ts), "runs_per_hour": 8 * 3600 / statistics.median(ts),
                "ratio": base / statistics.median(ts), "all_seconds": ts} for k, ts in times.items()]
    rows = [[r["variant"], f"{r['seconds']:.1f}", f"{r['runs_per_hour']:.0f}", f"{r['ratio']:.2f}"] for r in results]
    print_table(f"sweep of 8 mnist1d-mlp runs (medians of {args.rounds} interleaved rounds)", head, rows,
                ["variant", "s", "runs/hour", f"× {BASELINE}"])
    print(save("sweep", {"header": head, "rounds": args.rounds, "baseline": BASELINE, "results": results}))


if __name__ == "__main__":
    main()
