"""``lambda-gelu``: run the ReLU-ization protocol, report it, export it.

    lambda-gelu                      the demo: a small sweep on offline data and its report (≈ 2 min)
    lambda-gelu run TASK... [--seeds N] [--epochs E] [--arms A...] [--switch-at F] [--set k=v...] [--out DIR]
                     [--workers N] [--executor local|ray [--address ADDR]] [--threads T]
    lambda-gelu report [--out DIR] [--output FILE]
    lambda-gelu export --csv [--out DIR]
    lambda-gelu deploy DIR [--original MODEL]      a converted checkpoint in ONNX Runtime (fp32, int8) vs its original
    lambda-gelu deploy [--out DIR] [--task T...]   int8 ONNX, verification, sparsity of stored models
    lambda-gelu reluize MODEL --out DIR [--steps N | --minutes M] [--text FILE...] [--schedule swap|anneal|blockwise]
                     [--refit N] [--batching length|shuffled] [--lr-schedule linear|constant] [--overwrite]
                                                      a pretrained Hugging Face GELU model → exact ReLU
    lambda-gelu reluize-report DIR... --output FILE  several conversions (seeds, schedules) side by side
    lambda-gelu tasks
"""
from __future__ import annotations

import argparse
import shlex
import sqlite3
import sys

DEFAULT_OUT = "runs/main"
DEMO_OUT = "runs/demo"
# The demo: every arm on three tasks, few seeds and short budgets; about 2 minutes on 2 idle cores.
DEMO = {"tasks": ["mnist1d-mlp", "tabular-mlp", "fmnist-mlp"], "seeds": 3,
        "epochs": {"mnist1d-mlp": 20, "breast-cancer-mlp": 40, "wine-mlp": 40, "fmnist-mlp": 1}}


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (what was wrong, where to look), exit status 2."""

    def error(self, message):
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")


def _switch_at(text: str) -> float | str:
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a fraction of training such as 0.25, or 'auto'; got {text!r}") from None


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="lambda-gelu", description="λ-GELU: learn gating hardness, then ReLU-ize.")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)

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

    sub.add_parser("demo", help="the default sweep (same as `lambda-gelu run` with no task)").add_argument(
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

    dep = sub.add_parser("deploy", help="a converted checkpoint DIR in ONNX Runtime, fp32 and int8, against its "
                         "original; or, without DIR, int8 ONNX, verification and sparsity of a results store's models")
    dep.add_argument("checkpoint", nargs="?", metavar="DIR", help="a `lambda-gelu reluize` --out directory (or any "
                     "Hugging Face ReLU checkpoint with --original): writes DIR/deploy_report.md and DIR/onnx/")
    _deploy_options(dep)
    dep.add_argument("--out", default=None, help=f"without DIR: results directory with trained runs ({DEFAULT_OUT})")
    dep.add_argument("--task", dest="tasks", nargs="+", default=None,
                     help=f"without DIR: tasks ({' '.join(_DEPLOY_LAB['tasks'])})")
    dep.add_argument("--seeds", type=int, default=None, help="without DIR: how many seeds' models (5)")
    dep.add_argument("--points", type=int, default=None, help="without DIR: test points to verify per ε (20)")
    dep.add_argument("--time-limit", type=float, default=None, help="without DIR: seconds of MILP per point (10)")
    dep.add_argument("--threads", type=int, default=None)
    dep.set_defaults(func=_deploy)

    rz = sub.add_parser("reluize", help="convert a pretrained Hugging Face GELU model into an exact-ReLU checkpoint")
    rz.add_argument("model", metavar="MODEL", help="a local Hugging Face model directory, or all-minilm-l6-v2")
    rz.add_argument("--out", required=True, help="where to write the ReLU checkpoint and reluize_report.md")
    _config_options(rz)
    rz.add_argument("--overwrite", action="store_true", help="replace an earlier conversion's --out")
    rz.add_argument("--quiet", action="store_true", help="no progress bar")
    rz.add_argument("--threads", type=int, default=None)
    rz.set_defaults(func=_reluize)

    rr = sub.add_parser("reluize-report", help="several `reluize` conversions of one model (seeds, schedules) side by side")
    rr.add_argument("dirs", nargs="+", metavar="DIR", help="output directories of `lambda-gelu reluize`")
    rr.add_argument("--output", required=True, help="the Markdown file to write; its plot goes beside it")
    rr.add_argument("--title", default=None, help="the report's title (default: MODEL → exact ReLU)")
    rr.set_defaults(func=_reluize_report)

    ver = sub.add_parser("verify", help="decide a VNN-LIB robustness property of an ONNX ReLU network: sat, unsat or "
                         "unknown, as VNN-COMP's verifiers answer")
    ver.add_argument("onnx", metavar="MODEL.onnx")
    ver.add_argument("vnnlib", metavar="PROPERTY.vnnlib")
    ver.add_argument("--time-limit", type=float, default=60.0, help="seconds of search in all (default 60)")
    ver.set_defaults(func=_verify)

    sub.add_parser("tasks", help="list the tasks").set_defaults(func=_tasks)
    return p


def _config_options(parser: argparse.ArgumentParser) -> None:
    """``lambda-gelu reluize``'s settings: one option per field of ConversionConfig and ReluizeConfig (less the
    refit in batches, which the command counts in sentences), with the field's help, choices and default."""
    from lambda_gelu.hf import ConversionConfig
    from lambda_gelu.reluize import ReluizeConfig
    _field_options(parser, "c_", ConversionConfig, skip=("reluize",),
                   names={"texts": "--text", "eval_texts": "--eval-text"},
                   metavars={"texts": "FILE", "eval_texts": "FILE"})
    _field_options(parser, "r_", ReluizeConfig, skip=("refit",))


def _deploy_options(parser: argparse.ArgumentParser) -> None:
    """``lambda-gelu deploy DIR``'s settings: the fields of DeployConfig (threads is the command's own)."""
    from lambda_gelu.hf.deploy import DeployConfig
    _field_options(parser, "d_", DeployConfig, skip=("threads",), scope="with DIR: ",
                   metavars={"original": "MODEL", "batch_sizes": "N", "rounds": "N", "sentences": "N",
                             "max_tokens": "N"})


def _field_options(parser: argparse.ArgumentParser, prefix: str, cls, skip=(), scope: str = "", names=None,
                   metavars=None) -> None:
    """One option per field of the config dataclass ``cls`` (less ``skip``): the field's help (after ``scope``),
    choices and default, its type from its annotation (a tuple takes several values, a bool is a flag); the value
    lands in ``prefix + name``, None when the option is not given, so that the config's own default applies."""
    import dataclasses
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        default = f.default if f.default is not dataclasses.MISSING else None
        shown = (f" (default {' '.join(map(str, default)) if isinstance(default, tuple) else default})"
                 if default not in (None, ()) else "")
        kind = str(f.type)
        text = (scope + f.metadata.get("help", "") + shown).replace("%", "%%")  # argparse formats help with %
        options = {"dest": prefix + f.name, "default": None, "help": text,
                   "type": float if "float" in kind else int if "int" in kind else str}
        if kind == "bool":  # a flag: True when given
            options["action"] = "store_true"
            del options["type"]
        if "choices" in f.metadata:
            options["choices"] = f.metadata["choices"]
        if "tuple" in kind:
            options["nargs"] = "+"
        if metavars and f.name in metavars:
            options["metavar"] = metavars[f.name]
        elif "choices" not in options and kind != "bool":  # LR rather than argparse's R_LR, the destination
            options["metavar"] = f.name.upper()
        parser.add_argument((names or {}).get(f.name, "--" + f.name.replace("_", "-")), **options)


def _conversion_config(args):
    from lambda_gelu.hf import ConversionConfig
    from lambda_gelu.reluize import ReluizeConfig
    given = {k: v for k, v in vars(args).items() if v is not None}
    settings = {k[2:]: v for k, v in given.items() if k.startswith("r_")}
    conversion = {k[2:]: tuple(v) if isinstance(v, list) else v  # a tuple of files: --text, --eval-text
                  for k, v in given.items() if k.startswith("c_")}
    return ConversionConfig(**conversion, reluize=ReluizeConfig(**settings))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    command = "lambda-gelu " + shlex.join(argv)
    try:
        from .config import ConfigError
        from .data import DataError
        from .runner import SweepError
        from .store import StoreError
    except ImportError as e:  # pragma: no cover - only without the [lab] extra
        if getattr(args, "func", None) not in (_reluize, _verify) and getattr(args, "checkpoint", None) is None:
            # reluize, verify and deploy DIR need none of the lab
            print(f"error: the lab needs its extra: pip install 'lambda-gelu[lab]' ({e})", file=sys.stderr)
            return 2
        ConfigError = DataError = StoreError = SweepError = ()  # noqa: N806
    try:
        _check_args(args)
        if getattr(args, "threads", None) and getattr(args, "executor", "local") == "local" and (
                getattr(args, "workers", None) or 1) == 1:  # otherwise each worker takes --threads
            import torch
            torch.set_num_threads(args.threads)
        if args.command in ("report", "export") or args.command == "deploy" and args.checkpoint is None:
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
        if args.command == "reluize":
            print("interrupted: nothing was written to --out", file=sys.stderr)
        else:
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
    if args.checkpoint is not None:
        from lambda_gelu.hf.deploy import DeployConfig, deploy_checkpoint
        settings = {k[2:]: v for k, v in vars(args).items() if k.startswith("d_") and v is not None}
        if "batch_sizes" in settings:
            settings["batch_sizes"] = tuple(settings["batch_sizes"])
        print(deploy_checkpoint(args.checkpoint, DeployConfig(**settings, threads=args.threads),
                                log=lambda line: print(line, file=sys.stderr)))
        return 0
    from .deploy_eval import run_deploy
    from .report import build_report
    from .tasks import resolve_tasks
    names = [t.name for t in resolve_tasks(args.tasks)]
    run_deploy(args.out, names, args.seeds, args.points, args.time_limit)
    print(f"report: {build_report(args.out)}")
    return 0


def _reluize(args, command) -> int:
    from lambda_gelu.hf import reluize_checkpoint
    print(reluize_checkpoint(args.model, args.out, _conversion_config(args), overwrite=args.overwrite,
                             progress=not args.quiet, log=lambda line: print(line, file=sys.stderr)))
    return 0


def _reluize_report(args, command) -> int:
    from .report.conversions import conversions_report
    print(conversions_report(args.dirs, args.output, command, args.title))
    return 0


def _verify(args, command) -> int:
    """Prints VNN-COMP's verdict word, and for sat the counterexample as ((X_i value) ... (Y_j value) ...); for
    unknown, why, on standard error."""
    import torch

    from lambda_gelu.onnx_chain import load_onnx_chain
    from lambda_gelu.verify import affine_layers, verify_property
    from lambda_gelu.vnnlib import VERDICTS, read_property
    if not 0 < args.time_limit < float("inf"):
        raise ValueError(f"--time-limit must be > 0 seconds, got {args.time_limit}")
    model = load_onnx_chain(args.onnx)
    layers, _ = affine_layers(model)
    prop = read_property(args.vnnlib, num_inputs=layers[0][0].shape[1], num_outputs=layers[-1][0].shape[0])
    result = verify_property(model, prop.lo, prop.hi, prop.unsafe, time_limit=args.time_limit)
    print(VERDICTS[result.status])
    if result.counterexample is not None:
        x = torch.as_tensor(result.counterexample, dtype=torch.float32)
        with torch.no_grad():
            y = model(x.reshape(1, -1))[0]
        print("(" + "\n".join([f"(X_{i} {float(v)!r})" for i, v in enumerate(x)]
                              + [f"(Y_{j} {float(v)!r})" for j, v in enumerate(y)]) + ")")
    elif result.status == "timeout":
        print(f"unknown: {result.detail.get('note', '')}", file=sys.stderr)
    return 0


def _tasks(args, command) -> int:
    from .tasks import GROUPS, TASKS
    for t in TASKS.values():
        print(f"{t.name:20s} {t.description}")
    for g, members in GROUPS.items():
        print(f"{g:20s} group: {', '.join(members)}")
    return 0


# `lambda-gelu deploy` without DIR: the lab's options and their defaults
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
    if args.command == "deploy":
        mode = "lab" if args.checkpoint is None else "checkpoint"
        wrong = [k for k in (_DEPLOY_LAB if mode == "checkpoint" else ()) if getattr(args, k) is not None]
        wrong += [k[2:] for k, v in vars(args).items() if k.startswith("d_") and v is not None and mode == "lab"]
        if wrong:
            names = ", ".join("--" + ("task" if k == "tasks" else k.replace("_", "-")) for k in wrong)
            raise ConfigError(f"{names}: " + ("for a results store, not with DIR" if mode == "checkpoint" else
                                              "for a checkpoint: give its DIR"))
        for k, default in _DEPLOY_LAB.items():
            if mode == "lab" and getattr(args, k) is None:
                setattr(args, k, default)
    if args.command == "deploy" and args.checkpoint is None and not 0 < args.time_limit < float("inf"):
        raise ConfigError(f"--time-limit must be > 0 seconds, got {args.time_limit}")


def _require_store(out: str) -> None:
    from pathlib import Path

    from .config import ConfigError
    from .store import DB_NAME
    if not (Path(out) / DB_NAME).is_file():
        raise ConfigError(f"no results in {out} (no {DB_NAME}): run `lambda-gelu run TASK --out {out}` first")


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
