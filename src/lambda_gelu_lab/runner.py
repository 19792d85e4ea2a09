"""A sweep: every (task, seed, arm) not yet in the store is trained and stored; the rest is skipped.

Runs train in this process (the default), in ``workers`` local processes, or as Ray tasks on a local
or existing cluster. Wherever they train, only this process writes the store, one run at a time as
each finishes, so resuming and "no duplicates" hold exactly as for a sequential sweep, and a run's
result depends only on its configuration and its thread count, not on where it ran.
"""
from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterable

from .arms import ARMS
from .config import ConfigError, RunConfig
from .data import Splits
from .store import Store
from .tasks import TASKS, Task
from .train import RunResult, train_run

EXECUTORS = ("local", "processes", "ray")


class SweepError(RuntimeError):
    """Some runs were lost (a worker died twice, a cluster went away); the finished ones are stored."""


def plan(tasks: Iterable[Task], arms: Iterable[str], seeds: Iterable[int], overrides: dict) -> list[tuple[Task, RunConfig]]:
    """All runs of a sweep, each config built (and so validated) before anything trains."""
    return [(task, RunConfig(task=task.name, arm=arm, seed=seed, **{**task.defaults, **overrides}))
            for task in tasks for seed in seeds for arm in arms]


def train_remote(cfg: RunConfig, splits: Splits, keep_weights: bool, threads: int) -> RunResult:
    """One run in a worker process or Ray task, on ``threads`` threads."""
    import torch
    torch.set_num_threads(threads)
    return train_run(TASKS[cfg.task], splits, cfg, keep_weights=keep_weights)


_SPLITS: dict[str, Splits] = {}  # a pool worker's datasets, handed over once when it starts


def _start_worker(splits: dict[str, Splits]) -> None:
    _SPLITS.update(splits)


def _train_in_worker(cfg: RunConfig, keep_weights: bool, threads: int) -> RunResult:
    return train_remote(cfg, _SPLITS[cfg.task], keep_weights, threads)


def run_sweep(runs: list[tuple[Task, RunConfig]], store: Store, data_dir: str | None = None,
              keep_weights: bool = True, progress: bool = True, command: str | None = None,
              executor: str = "local", workers: int = 1, threads: int | None = None,
              address: str | None = None) -> int:
    """Train and store every run the store does not have yet; returns how many were trained. The
    sweep's ``command`` is recorded in the store once its data has loaded.

    ``executor``: ``"local"`` (this process, torch's threads unless ``threads``), ``"processes"``
    (``workers`` local processes of ``threads`` threads each, default 1) or ``"ray"`` (a Ray task of
    ``threads`` CPUs per run; a local cluster of ``workers`` × ``threads`` CPUs, or the cluster at
    ``address``). A worker that dies loses only its run, which is retried once.
    """
    if executor not in EXECUTORS:
        raise ConfigError(f"executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    todo = [(t, c) for t, c in runs if not store.has(c)]
    splits = {}  # every dataset loaded first, once, here: a missing one fails before hours of training
    for task, _ in todo:
        if task.name not in splits:
            splits[task.name] = task.load(data_dir)
    if executor == "ray" and todo:  # reach the cluster before writing anything
        _connect_ray(workers, threads or 1, address)
    if command is not None:
        store.record_sweep(command)
    print(f"{len(runs)} runs planned, {len(runs) - len(todo)} already in {store.path}, {len(todo)} to train",
          file=sys.stderr)
    bar = _progress(len(todo), progress)

    def finish(cfg: RunConfig, result: RunResult) -> None:
        try:
            store.add(cfg, result)
        except sqlite3.IntegrityError:  # another sweep sharing the store stored it meanwhile: keep the first
            pass
        else:
            m = result.metrics
            bar.set_postfix_str(f"test {m['test_acc']:.4f}" +
                                (f" → ReLU {m['sub_test_acc']:.4f}" if "sub_test_acc" in m else ""))
        bar.update()

    try:
        if executor == "local":
            for task, cfg in todo:
                bar.set_description(f"{cfg.task} {cfg.variant} seed {cfg.seed}")
                if store.has(cfg):  # another process sharing the store finished it meanwhile
                    bar.update()
                    continue
                if threads:
                    import torch
                    torch.set_num_threads(threads)
                finish(cfg, train_run(task, splits[task.name], cfg, keep_weights=keep_weights))
        elif executor == "processes":
            _run_processes(_longest_first(todo, splits), finish, splits, keep_weights, workers, threads or 1)
        else:
            _run_ray(_longest_first(todo, splits), finish, splits, keep_weights, threads or 1)
    finally:
        bar.close()
    return len(todo)


def _longest_first(todo, splits):
    """Runs side by side start longest first (most examples × epochs, then the arms that learn an
    activation's parameters), so that no worker is left with a long run while the others idle."""
    return sorted(todo, key=lambda tc: (tc[1].epochs * len(splits[tc[0].name].y_train), bool(ARMS[tc[1].arm].fields)),
                  reverse=True)


def _run_processes(todo, finish, splits, keep_weights, workers: int, threads: int) -> None:
    pending = [cfg for _, cfg in todo]
    for attempt in (1, 2):  # a worker that dies breaks the pool: the lost runs get one more try
        lost = []
        pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                                      initializer=_start_worker, initargs=(splits,))
        try:
            futures = {}
            for cfg in pending:
                try:
                    futures[pool.submit(_train_in_worker, cfg, keep_weights, threads)] = cfg
                except (cf.process.BrokenProcessPool, OSError):  # a worker died while the runs were handed out
                    # (OSError "handle is closed": CPython's pool, to 3.11, closes its wakeup pipe when a worker dies
                    # without the lock submit() and shutdown() write to it under; a killed sweep stopped so, with an
                    # error about its --out)
                    lost = pending[len(futures):]
                    break
            for future in cf.as_completed(futures):
                try:
                    result = future.result()
                except cf.process.BrokenProcessPool:
                    lost.append(futures[future])
                    continue
                finish(futures[future], result)
        finally:
            try:
                pool.shutdown()
            except OSError:  # that race under shutdown's own write: the pool is broken, its lost runs counted
                pass
        if not lost:
            return
        print(f"a worker process died; {len(lost)} unfinished runs " + ("are retried" if attempt == 1 else "are lost"),
              file=sys.stderr)
        pending = lost
    raise SweepError(f"{len(pending)} runs were lost when worker processes died (e.g. {pending[0].task} "
                     f"{pending[0].variant} seed {pending[0].seed}); the finished runs are stored: rerun the same "
                     "command to train the rest")


RAY_CONNECT_TIMEOUT = 60.0  # seconds; Ray itself retries an unresponsive cluster for minutes


def _connect_ray(workers: int, threads: int, address: str | None) -> None:
    if address:
        _probe(address)
    try:
        import ray
    except ImportError:
        raise ConfigError("--executor ray needs Ray: pip install 'lambda-gelu[ray]'") from None
    kwargs = {"address": address} if address else {"num_cpus": workers * threads}
    try:
        ray.init(**kwargs, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    except Exception as e:  # noqa: BLE001 - ConnectionError, RuntimeError, ValueError...: one message
        where = f"the Ray cluster at {address}" if address else "a new local Ray cluster"
        raise ConfigError(f"cannot reach {where}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def _probe(address: str) -> None:
    """Fail in seconds, not minutes, when no Ray cluster answers at ``address``: first a TCP connection
    (nothing listening), then a connection by Ray in a child process that is given up after
    RAY_CONNECT_TIMEOUT (a port that answers but is not Ray's: ray.init would retry without end, and
    it cannot be run in a thread of ours to time it out)."""
    if address not in ("auto", "local"):
        host, _, port = address.removeprefix("ray://").rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"--address must be auto, HOST:PORT or ray://HOST:PORT, got {address!r}")
        try:
            socket.create_connection((host, int(port)), timeout=10).close()
        except OSError as e:
            raise ConfigError(f"cannot reach the Ray cluster at {address}: {e.strerror or e}; start one there with "
                              "`ray start --head`, or leave out --address for a local cluster") from None
    connect = ("import sys, ray; ray.init(address=sys.argv[1], include_dashboard=False, log_to_driver=False, "
               "logging_level='ERROR'); ray.shutdown()")
    try:
        child = subprocess.run([sys.executable, "-c", connect, address], capture_output=True, text=True,
                               timeout=RAY_CONNECT_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"the Ray cluster at {address} did not answer within {RAY_CONNECT_TIMEOUT:.0f} s: is "
                          "it a Ray head node (`ray start --head`)?") from None
    if child.returncode != 0:
        lines = [ln for ln in child.stderr.splitlines() if ln.strip() and not ln.startswith(("[", " "))]
        if lines and lines[-1].startswith("ModuleNotFoundError"):
            raise ConfigError("--executor ray needs Ray: pip install 'lambda-gelu[ray]'")
        why = lines[-1] if lines else "ray.init failed"
        if "InvalidAuthToken" in child.stderr:
            why += " (the cluster wants Ray's authentication token, which this process does not have)"
        raise ConfigError(f"cannot reach the Ray cluster at {address}: {why}")


def _run_ray(todo, finish, splits, keep_weights, threads: int) -> None:
    import ray
    try:
        data = {name: ray.put(s) for name, s in splits.items()}  # in the object store once, not once per run
        remote = ray.remote(num_cpus=threads, max_retries=1)(train_remote)  # a dead worker's run is retried
        refs = {remote.remote(cfg, data[cfg.task], keep_weights, threads): cfg for _, cfg in todo}
        lost = []
        while refs:
            (done,), _ = ray.wait(list(refs), num_returns=1)
            cfg = refs.pop(done)
            try:
                result = ray.get(done)
            except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                    ray.exceptions.RayActorError):
                lost.append(cfg)
                continue
            finish(cfg, result)
        if lost:
            raise SweepError(f"{len(lost)} runs were lost on the Ray cluster (e.g. {lost[0].task} {lost[0].variant} "
                             f"seed {lost[0].seed}); the finished runs are stored: rerun the same command")
    finally:
        ray.shutdown()


def _progress(total: int, enabled: bool):
    try:
        from tqdm import tqdm
        return tqdm(total=total, disable=not enabled, dynamic_ncols=True)
    except ImportError:
        class _Quiet:
            def __getattr__(self, name):
                return lambda *a, **k: None
        return _Quiet()
