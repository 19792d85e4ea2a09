"""Timing several computations side by side, so that their ratios hold on a machine whose speed drifts (the
benchmarks, and ``lambda-gelu deploy``'s latencies)."""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping

__all__ = ["time_interleaved"]


def time_interleaved(calls: Mapping[str, Callable[[], object]], rounds: int = 30,
                     warmup: int = 1) -> dict[str, list[float]]:
    """Seconds of each call, in ``rounds`` rounds that run every call once in turn (after ``warmup`` untimed
    rounds): what the machine does meanwhile slows all of them alike, so ratios of round-by-round times hold
    where absolute times drift."""
    for _ in range(warmup):
        for call in calls.values():
            call()
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            t0 = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t0)
    return times
