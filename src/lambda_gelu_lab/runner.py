"""A sweep: every (task, seed, arm) not yet in the store is trained and stored; the rest is skipped."""
from __future__ import annotations

import sqlite3
import sys
from collections.abc import Iterable

from .config import RunConfig
from .store import Store
from .tasks import Task
from .train import train_run


def plan(tasks: Iterable[Task], arms: Iterable[str], seeds: Iterable[int], overrides: dict) -> list[tuple[Task, RunConfig]]:
    """All runs of a sweep, each config built (and so validated) before anything trains."""
    return [(task, RunConfig(task=task.name, arm=arm, seed=seed, **{**task.defaults, **overrides}))
            for task in tasks for seed in seeds for arm in arms]


def run_sweep(runs: list[tuple[Task, RunConfig]], store: Store, data_dir: str | None = None,
              keep_weights: bool = True, progress: bool = True, command: str | None = None) -> int:
    """Train and store every run the store does not have yet; returns how many were trained. The
    sweep's ``command`` is recorded in the store once its data has loaded."""
    todo = [(t, c) for t, c in runs if not store.has(c)]
    splits = {}
    for task, _ in todo:  # load every dataset first: a missing one fails before hours of training
        if task.name not in splits:
            splits[task.name] = task.load(data_dir)
    if command is not None:
        store.record_sweep(command)
    print(f"{len(runs)} runs planned, {len(runs) - len(todo)} already in {store.path}, {len(todo)} to train",
          file=sys.stderr)
    bar = _progress(len(todo), progress)
    for task, cfg in todo:
        bar.set_description(f"{cfg.task} {cfg.variant} seed {cfg.seed}")
        if store.has(cfg):  # another process sharing the store finished it meanwhile
            bar.update()
            continue
        result = train_run(task, splits[task.name], cfg, keep_weights=keep_weights)
        try:
            store.add(cfg, result)
        except sqlite3.IntegrityError:  # ... or finished it while this one trained: keep the first
            bar.update()
            continue
        m = result.metrics
        bar.set_postfix_str(f"test {m['test_acc']:.4f}" + (f" → ReLU {m['sub_test_acc']:.4f}" if "sub_test_acc" in m else ""))
        bar.update()
    bar.close()
    return len(todo)


def _progress(total: int, enabled: bool):
    try:
        from tqdm import tqdm
        return tqdm(total=total, disable=not enabled, dynamic_ncols=True)
    except ImportError:
        class _Quiet:
            def __getattr__(self, name):
                return lambda *a, **k: None
        return _Quiet()
