"""``lambda-gelu lab``: run the paper's ReLU-ization protocol on its tasks, report it, export it.

    lambda-gelu lab                      the demo: a small sweep on offline data and its report (≈ 2 min)
    lambda-gelu lab run TASK... [--seeds N] [--epochs E] [--arms A...] [--switch-at F] [--set k=v...] [--out DIR]
                     [--workers N] [--executor local|ray [--address ADDR]] [--threads T]
    lambda-gelu lab report [--out DIR] [--output FILE]
    lambda-gelu lab export --csv [--out DIR]
    lambda-gelu lab deploy [--out DIR] [--task T...]   int8 ONNX, verification, sparsity of stored models
    lambda-gelu lab reluize-report DIR... --output FILE  several conversions (seeds, schedules) side by side
    lambda-gelu lab tasks

The product's commands (reluize, generate, deploy DIR, verify) are :mod:`lambda_gelu.cli`'s.
"""
from __future__ import annotations

import argparse
import shlex
import sqlite3
import sys

from lambda_gelu.cli import Parser

DEFAULT_OUT = "runs/main"
DEMO_OUT = "runs/demo"
# The demo: every arm on three tasks, few seeds and short budgets; about 2 minutes on 2 idle cores.
DEMO = {"tasks": ["mnist1d-mlp", "tabular-mlp", "fmnist-mlp"], "seeds": 3,
        "epochs": {"mnist1d-mlp": 20, "breast-cancer-mlp": 40, "wine-mlp": 40, "fmnist-mlp": 1}}


def _switch_at(text: str) -> float | str:
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a fraction of training such as 0.25, or 'auto'; got {text!r}") from None


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog="lambda-gelu lab", description="λ-GELU's lab: the paper's protocol on its tasks, and reports.")
    sub = p.add_subparsers(dest="command", parser_class=Parser)

    run = sub.add_parser("run", help="train the protocol's arms on tasks, several seeds; resumable")
    run.add_argument("tasks", nargs="*", metavar="TASK", help="task or group names (`lambda-gelu tasks`); none: the demo")
    run.add_argument("--seeds", type=int, default=None, help="number of seeds (default 10; demo 3)")
    run.add_argument("--first-seed", type=int, default=0)
    run.add_argument("--epochs", type=int, default=None, help="override every task's epochs")
    run.add_argument("--arms", nargs="+", default=None, help="arms to run (default: all four)")
    run.add_argument("--switch-at", type=_switch_at, default=None, metavar="F|auto",
                     help="fraction of training before hardening (0.25), or 'auto': when the sign patterns settle")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override any run setting, e.g. --set lr=0.1 (repeatable)")
    run.add_argument("--out", default=None, help=f"results directory (default {DEFAULT_OUT}; demo {DEMO_OUT})")
    run.add_argument("--data-dir", default=None, help="Fashion-MNIST IDX directory (default: the Debian package's)")
    run.add_argument("--no-weights", action="store_true", help="do not store trained weights")
    run.add_argument("--no-report", action="store_true", help="do not write report.md after the sweep")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument("--threads", type=int, default=None,
                     help="torch threads (in this process: torch's choice; per worker: 1)")
    run.add_argument("--workers", type=int, default=None,
                     help="train this many runs at once in local processes (or Ray's local cluster size)")
    run.add_argument("--executor", choices=("local", "ray"), default="local",
                     help="where runs train: here (local, with --workers: local processes) or as Ray tasks")
    run.add_argument("--address", default=None, help="an existing Ray cluster (with --executor ray)")
    run.set_defaults(func=_run)

    sub.add_parser("demo", help="the default sweep (same as `lambda-gelu lab run` with no task)").add_argument(
        "--out", default=DEMO_OUT)

    rep = sub.add_parser("report", help="write report.md and plots from a results directory")
    rep.add_argument("--out", default=DEFAULT_OUT, help="results directory")
    rep.add_argument("--output", default=None, help="report file (default OUT/report.md); images go beside it")
    rep.add_argument("--title", default=None, help="the report's title (default: λ-GELU ReLU-ization results)")
    rep.set_defaults(func=_report)

    exp = sub.add_parser("export", help="export the results tables")
    exp.add_argument("--out", default=DEFAULT_OUT, help="results directory")
    exp.add_argument("--csv", action="store_true", required=True, help="write runs.csv and lambdas.csv")
    exp.add_argument("--to", default=None, help="destination directory (default: the results directory)")
    exp.set_defaults(func=_export)

    dep = sub.add_parser("deploy", help="int8 ONNX, verification and sparsity of a results store's models (a "
                         "converted checkpoint: `lambda-gelu deploy DIR`)")
    dep.add_argument("--out", default=DEFAULT_OUT, help=f"results directory with trained runs ({DEFAULT_OUT})")
    dep.add_argument("--task", dest="tasks", nargs="+", default=_DEPLOY_LAB["tasks"],
                     help=f"tasks ({' '.join(_DEPLOY_LAB['tasks'])})")
    dep.add_argument("--seeds", type=int, default=_DEPLOY_LAB["seeds"], help="how many seeds' models (5)")
    dep.add_argument("--points", type=int, default=_DEPLOY_LAB["points"], help="test points to verify per ε (20)")
    dep.add_argument("--time-limit", type=float, default=_DEPLOY_LAB["time_limit"],
                     help="seconds of MILP per point (10)")
    dep.add_argument("--threads", type=int, default=None)
    dep.set_defaults(func=_deploy)

    rr = sub.add_parser("reluize-report", help="several `reluize` conversions of one model (seeds, schedules) side by side")
    rr.add_argument("dirs", nargs="+", metavar="DIR", help="output directories of `lambda-gelu reluize`")
    rr.add_argument("--output", required=True, help="the Markdown file to write; its plot goes beside it")
    rr.add_argument("--title", default=None, help="the report's title (default: MODEL → exact ReLU)")
    rr.set_defaults(func=_reluize_report)

    sub.add_parser("tasks", help="list the tasks").set_defaults(func=_tasks)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    command = "lambda-gelu lab " + shlex.join(argv)
    try:
        from .config import ConfigError
        from .data import DataError
        from .runner import SweepError
        from .store import StoreError
    except ImportError as e:  # pragma: no cover - only without the [lab] extra
        print(f"error: the lab needs its extra: pip install 'lambda-gelu[lab]' ({e})", file=sys.stderr)
        return 2
    try:
        _check_args(args)
        if getattr(args, "threads", None) and getattr(args, "executor", "local") == "local" and (
                getattr(args, "workers", None) or 1) == 1:  # otherwise each worker takes --threads
            import torch
            torch.set_num_threads(args.threads)
        if args.command in ("report", "export", "deploy"):
            _require_store(args.out)
        if args.command in (None, "demo") or (args.command == "run" and not args.tasks):
            return _demo(args, command)
        return args.func(args, command)
    except (ConfigError, DataError, StoreError, ValueError) as e:  # a setting a config refused, one line
        print(f"error: {e}", file=sys.stderr)
        return 2
    except SweepError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except sqlite3.DatabaseError as e:  # a store damaged after its first page, or one that cannot be written
        where = getattr(args, "out", None) or "the results directory"
        print(f"error: the results store in {where} cannot be used ({e}); restore it from a copy or choose another "
              "--out (the file was not changed)", file=sys.stderr)
        return 2
    except OSError as e:  # an unwritable --out, a full disk: the environment, not a bug
        where = f" ({e.filename})" if e.filename else ""
        print(f"error: {e.strerror or e}{where}; choose another --out or free the place", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: finished runs are stored; rerun the same command to resume", file=sys.stderr)
        return 130


def _report(args, command) -> int:
    from .report import build_report
    print(build_report(args.out, args.output, command, args.title))
    return 0


def _export(args, command) -> int:
    from .store import Store
    with Store(args.out) as store:
        for path in store.export_csv(args.to):
            print(path)
    return 0


def _deploy(args, command) -> int:
    from .deploy_eval import run_deploy
    from .report import build_report
    from .tasks import resolve_tasks
    names = [t.name for t in resolve_tasks(args.tasks)]
    run_deploy(args.out, names, args.seeds, args.points, args.time_limit)
    print(f"report: {build_report(args.out)}")
    return 0


def _reluize_report(args, command) -> int:
    from .report.conversions import conversions_report
    print(conversions_report(args.dirs, args.output, command, args.title))
    return 0


def _tasks(args, command) -> int:
    from .tasks import GROUPS, TASKS
    for t in TASKS.values():
        print(f"{t.name:20s} {t.description}")
    for g, members in GROUPS.items():
        print(f"{g:20s} group: {', '.join(members)}")
    return 0


# `lambda-gelu lab deploy`: its options and their defaults
_DEPLOY_LAB = {"out": DEFAULT_OUT, "tasks": ["fmnist-mlp", "mnist1d-mlp"], "seeds": 5, "points": 20, "time_limit": 10.0}
# options the demo does not use, with their defaults: given with no task, they are an error, not ignored
_DEMO_IGNORES = {"seeds": None, "epochs": None, "arms": None, "switch_at": None, "overrides": [], "first_seed": 0,
                 "no_weights": False, "no_report": False, "workers": None, "executor": "local", "address": None}


def _check_args(args) -> None:
    """Values argparse's types cannot check and no config owns: each a ConfigError naming the option."""
    from .config import ConfigError
    if args.command == "run" and not args.tasks:
        given = [f"--{k.replace('_', '-')}" if k != "overrides" else "--set"
                 for k, default in _DEMO_IGNORES.items() if getattr(args, k) != default]
        if given:
            raise ConfigError(f"{', '.join(given)}: these options need a task: name one (see `lambda-gelu tasks`), "
                              "or run the demo without them")
    if getattr(args, "address", None) and args.executor != "ray":
        raise ConfigError("--address names a Ray cluster: use it with --executor ray")
    for name, low in (("threads", 1), ("seeds", 1), ("points", 1), ("epochs", 1), ("first_seed", 0), ("workers", 1)):
        value = getattr(args, name, None)
        if value is not None and not low <= value <= 2 ** 31:
            raise ConfigError(f"--{name.replace('_', '-')} must be ≥ {low}, got {value}" if value < low else
                              f"--{name.replace('_', '-')} must be at most 2^31, got {value}")
    if args.command == "deploy" and not 0 < args.time_limit < float("inf"):
        raise ConfigError(f"--time-limit must be > 0 seconds, got {args.time_limit}")


def _require_store(out: str) -> None:
    from pathlib import Path

    from .config import ConfigError
    from .store import DB_NAME
    if not (Path(out) / DB_NAME).is_file():
        raise ConfigError(f"no results in {out} (no {DB_NAME}): run `lambda-gelu lab run TASK --out {out}` first")


def _sweep(task_names, seeds, first_seed, epochs_for, arms, overrides, out, data_dir, keep_weights, quiet, command,
           execution=None):
    from .arms import DEFAULT_ARMS
    from .runner import plan, run_sweep
    from .store import Store
    from .tasks import resolve_tasks

    tasks = resolve_tasks(task_names)
    runs = []
    for task in tasks:
        task_overrides = dict(overrides)
        if epochs_for(task.name) is not None:
            task_overrides["epochs"] = epochs_for(task.name)
        runs += plan([task], arms or DEFAULT_ARMS, range(first_seed, first_seed + seeds), task_overrides)
    with Store(out) as store:
        run_sweep(runs, store, data_dir=data_dir, keep_weights=keep_weights, progress=not quiet, command=command,
                  **(execution or {}))
    return out


def _execution(args) -> dict:
    """--executor / --workers / --threads / --address as run_sweep's arguments."""
    import os
    if args.executor == "ray":
        threads = args.threads or 1
        return {"executor": "ray", "threads": threads, "address": args.address,
                "workers": args.workers or max(1, (os.cpu_count() or 1) // threads)}
    if args.workers and args.workers > 1:
        return {"executor": "processes", "workers": args.workers, "threads": args.threads or 1}
    return {}


def _run(args, command) -> int:
    from .config import parse_overrides
    overrides = parse_overrides(args.overrides)
    if args.switch_at is not None:
        overrides["switch_at"] = args.switch_at
    out = _sweep(args.tasks, 10 if args.seeds is None else args.seeds, args.first_seed, lambda name: args.epochs, args.arms, overrides,
                 args.out or DEFAULT_OUT, args.data_dir, not args.no_weights, args.quiet, command, _execution(args))
    if not args.no_report:
        from .report import build_report
        print(f"report: {build_report(out)}")
    return 0


def _demo(args, command) -> int:
    out = getattr(args, "out", None) or DEMO_OUT
    data_dir = getattr(args, "data_dir", None)
    _sweep(DEMO["tasks"], DEMO["seeds"], 0, DEMO["epochs"].get, None, {}, out, data_dir, True,
           getattr(args, "quiet", False), command)
    from .report import build_report
    print(f"report: {build_report(out)}")
    return 0
