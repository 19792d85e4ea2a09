"""Shared by the benchmark scripts: interleaved timing, medians, the header, JSON output, their arguments' types."""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

import torch

from lambda_gelu.hf.save import REPORT
from lambda_gelu.timing import time_interleaved

RESULTS = Path(__file__).resolve().parent / "results"


def positive_int(text: str) -> int:
    """An argument's type for rounds, repetitions, tokens and threads: a whole number ≥ 1 (argparse refuses any other
    in one line, before a model is loaded)."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"a whole number ≥ 1, got {text!r}")
    return n


def checkpoint(text: str) -> str:
    """An argument's type for a model directory (a Hugging Face checkpoint: its config.json), refused in one line."""
    if not (Path(text) / "config.json").is_file():
        raise argparse.ArgumentTypeError(f"{text} is not a model directory (no config.json in it)")
    return text


def converted(text: str) -> str:
    """:func:`checkpoint`, written by `lambda-gelu reluize` (its report names the original)."""
    if not (Path(checkpoint(text)) / REPORT).is_file():
        raise argparse.ArgumentTypeError(f"{text} is not a checkpoint written by `lambda-gelu reluize` "
                                         f"(no {REPORT} in it)")
    return text


def header() -> dict:
    return {"torch": torch.__version__, "threads": torch.get_num_threads(), "python": platform.python_version(),
            "machine": f"{platform.machine()}, {os.cpu_count()} logical CPUs, {_cpu_name()}", "code": _code()}


def _code() -> str | None:
    """The commit of the code measured, ``-dirty`` if the library or the benchmarks had changes not committed (results
    files aside: a run of several benchmarks writes them), or None outside a git checkout."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=RESULTS.parent.parent, capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()
    try:
        changed = git("status", "--porcelain", "--untracked-files=no", "--", "src", "benchmarks",
                      ":(exclude)benchmarks/results")
        return git("rev-parse", "--short", "HEAD") + ("-dirty" if changed else "")
    except (OSError, subprocess.SubprocessError):
        return None


def _cpu_name() -> str:
    """The CPU's model name, with its family and model numbers and its last-level cache where the kernel gives them:
    a name such as "AMD EPYC" stands for several generations, whose results differ."""
    fields = {}
    try:
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
            if not line.strip():
                break
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or "unknown CPU"
    details = [f"family {fields['cpu family']} model {fields['model']}"] if "cpu family" in fields else []
    try:
        size = Path("/sys/devices/system/cpu/cpu0/cache/index3/size").read_text().strip()
        details.append(f"{int(size[:-1]) // 1024} MiB L3" if size.endswith("K") else f"{size} L3")
    except (OSError, ValueError):
        pass
    return f"{name} ({'; '.join(details)})" if details else name  # no ", ": the report splits the machine on it


def bandwidth(threads: int, gib: float = 1.0, reps: int = 7) -> float:
    """Bytes per second a sum over a ``gib`` GiB float32 tensor reads, the best of ``reps``."""
    torch.set_num_threads(threads)
    x = torch.ones(int(gib * 2 ** 28))
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t)
    return x.numel() * 4 / best


def interleaved(fns: dict, reps: int, warmup: int = 2) -> dict[str, float]:
    """Median seconds per call of each function, timed round-robin so drifts in machine load hit
    every variant alike."""
    return {name: statistics.median(ts) for name, ts in time_interleaved(fns, reps, warmup).items()}


def speedup_quartiles(slow: list[float], fast: list[float]) -> list[float]:
    """The first and third quartiles of the round-by-round speed-ups (the slow variant's time over the fast one's in
    the same round); one round: its own speed-up, twice."""
    ratios = [s / f for s, f in zip(slow, fast)]
    q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    return [q1, q3]


def save(name: str, payload: dict) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=1) + "\n")
    return path


def print_table(title: str, head: dict, rows: list[list], columns: list[str]) -> None:
    print(f"# {title}")
    print(f"# torch {head['torch']}, {head['threads']} threads, {head['machine']}")
    widths = [max(len(str(c)), *(len(str(r[i])) for r in rows)) for i, c in enumerate(columns)]
    print("  ".join(str(c).ljust(w) for c, w in zip(columns, widths)))
    for r in rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths)))
