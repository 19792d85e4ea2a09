"""The command line with bad input: one clear line on stderr, exit status 2, no traceback, and the
results directory exactly as it was."""
import re
import sqlite3
from pathlib import Path

import pytest
import torch

from lambda_gelu_lab.cli import main
from lambda_gelu_lab.store import DB_NAME, Store

GARBAGE = b"these are not the results you are looking for\n" * 20


def _store_dir(tmp_path, kind):
    """A results directory: 'store' (a real one, with a sweep recorded), 'garbage' (a results.sqlite
    that is not a database), 'foreign' (another program's SQLite file), 'empty', or 'under-a-file'."""
    out = tmp_path / "out"
    if kind == "under-a-file":
        (tmp_path / "file").write_text("a file, not a directory")
        return tmp_path / "file" / "out"
    out.mkdir()
    if kind == "store":
        with Store(out) as store:
            store.record_sweep("lambda-gelu run wine-mlp")
    elif kind == "garbage":
        (out / DB_NAME).write_bytes(GARBAGE)
    elif kind == "foreign":
        with sqlite3.connect(out / DB_NAME) as db:
            db.execute("CREATE TABLE invoices (id INTEGER)")
    elif kind == "corrupt":  # the first page (the schema) readable, the pages of its rows overwritten
        with Store(out) as store:
            for i in range(200):
                store.record_sweep(f"lambda-gelu run wine-mlp --seeds {i} " + "x" * 500)
        data = bytearray((out / DB_NAME).read_bytes())
        data[8192:] = GARBAGE[:1].ljust(len(data) - 8192, b"\xff")
        (out / DB_NAME).write_bytes(bytes(data))
    elif kind == "missing-weights":  # every arm deploy needs, stored, and one weights file gone
        from lambda_gelu_lab.config import RunConfig
        from lambda_gelu_lab.train import RunResult
        with Store(out) as store:
            for arm in ("gelu", "lambda-harden", "relu"):
                store.add(RunConfig(task="mnist1d-mlp", arm=arm, seed=0),
                          RunResult(metrics={"test_acc": 0.5}, state_dict={"w": torch.zeros(1)}))
            first = store.runs()[0]["weights"]
        (out / first).unlink()
    return out


def _snapshot(path):
    return {p.relative_to(path): p.read_bytes() for p in path.rglob("*") if p.is_file()} if path.is_dir() else None


CASES = [  # (argv, results directory, message)
    (["run", "fmnist-mpl"], "store", "unknown task 'fmnist-mpl'; known: fmnist-mlp"),
    (["run", "wine-mlp", "--set", "lrr=0.1"], "store", "unknown config key 'lrr'; known: epochs"),
    (["run", "wine-mlp", "--set", "lr=-1"], "store", "lr=-1.0 is invalid: must be a finite number > 0"),
    (["run", "wine-mlp", "--set", "temperature=-1"], "store", "temperature=-1.0 is invalid: must be a finite number > 0"),
    (["run", "wine-mlp", "--set", "multiplier=-1"], "store", "multiplier=-1.0 is invalid: must be a finite number ≥ 0"),
    (["run", "wine-mlp", "--set", "epochs=ten"], "store", "epochs needs a int, got 'ten'"),
    (["run", "wine-mlp", "--arms", "gelu", "swish"], "store", "arm='swish' is invalid: must be one of gelu"),
    (["run", "wine-mlp", "--switch-at", "1.5"], "store", r"switch_at=1.5 is invalid: must be in \[0, 1\)"),
    (["run", "wine-mlp", "--seeds", "0"], "store", "--seeds must be ≥ 1, got 0"),
    (["run", "wine-mlp", "--first-seed", str(10 ** 20)], "store", "--first-seed must be at most 2"),
    (["run", "wine-mlp", "--seeds", str(10 ** 20)], "store", "--seeds must be at most 2"),
    (["run", "wine-mlp", "--epochs", "0"], "store", "--epochs must be ≥ 1, got 0"),
    (["run", "wine-mlp", "--threads", "-1"], "store", "--threads must be ≥ 1, got -1"),
    (["run", "wine-mlp", "--threads", "two"], "store", "argument --threads: invalid int value: 'two'"),
    (["run", "wine-mlp", "--workers", "0"], "store", "--workers must be ≥ 1, got 0"),
    (["run", "wine-mlp", "--executor", "dask"], "store", "argument --executor: invalid choice: 'dask'"),
    (["run", "wine-mlp", "--address", "10.0.0.1:6379"], "store", "--address names a Ray cluster: use it with --executor ray"),
    (["run", "wine-mlp", "--executor", "ray", "--address", "head"], "store", "--address must be auto, HOST:PORT or ray://"),
    (["run", "--workers", "2"], "store", "--workers: these options need a task"),
    (["run", "fmnist-mlp", "--data-dir", "/nonexistent"], "store", "Fashion-MNIST not found in /nonexistent"),
    (["run", "wine-mlp"], "garbage", "is not a results store"),
    (["run", "wine-mlp"], "foreign", "an SQLite database of something else"),
    (["run", "wine-mlp"], "under-a-file", "Not a directory .*choose another --out"),
    (["run", "--seeds", "3"], "store", "--seeds: these options need a task"),
    (["run", "--no-weights", "--first-seed", "2"], "store", "--first-seed, --no-weights: these options need a task"),
    (["run", "--no-report"], "store", "--no-report: these options need a task"),
    (["demo", "--seeds", "3"], "store", "unrecognized arguments: --seeds 3"),
    (["report"], "empty", "no results in .*: run `lambda-gelu lab run TASK --out"),
    (["report"], "garbage", "is not a results store"),
    (["report"], "corrupt", "the results store in .* cannot be used .*the file was not changed"),
    (["run", "wine-mlp"], "corrupt", "the results store in .* cannot be used"),
    (["deploy", "--task", "mnist1d-mlp", "--seeds", "1"], "missing-weights",
     r"its weights file .* is missing; restore it, or delete the run from the store and rerun it"),
    (["export", "--csv"], "garbage", "is not a results store"),
    (["deploy"], "empty", "no results in .*: run `lambda-gelu lab run TASK --out"),
    (["deploy"], "foreign", "an SQLite database of something else"),
    (["deploy", "--points", "0"], "store", "--points must be ≥ 1, got 0"),
    (["deploy", "--seeds", "0"], "store", "--seeds must be ≥ 1, got 0"),
    (["deploy", "--time-limit", "0"], "store", "--time-limit must be > 0 seconds"),
    (["deploy", "--threads", "-1"], "store", "--threads must be ≥ 1, got -1"),
    (["deploy", "--task", "nope"], "store", "unknown task 'nope'"),
    (["nonsense"], "store", "argument command: invalid choice: 'nonsense'"),
]


@pytest.mark.slow
@pytest.mark.parametrize("argv, kind, message", CASES, ids=[" ".join(c[0]) + f" [{c[1]}]" for c in CASES])
def test_bad_input_is_one_clear_line_and_leaves_the_results_untouched(tmp_path, capsys, argv, kind, message):
    out = _store_dir(tmp_path, kind)
    before = _snapshot(out)
    with pytest.raises(SystemExit) if argv[0] in ("nonsense", "demo") or "two" in argv or "dask" in argv else _no_exit() as exited:
        status = main(argv + ["--out", str(out)] + (["--quiet"] if argv[0] == "run" else []))
    if exited is not None:
        status = exited.value.code
    err = capsys.readouterr().err
    assert status == 2
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    assert re.search(message, lines[0]), lines[0]
    assert _snapshot(out) == before


class _no_exit:
    value = None

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("argv, victim, message", [
    (["report", "--output", "{out}/results.sqlite"], None, "is not a file this command wrote"),
    (["report", "--output", "{tmp}/notes.md"], "{tmp}/notes.md", "notes.md exists and is not a file this command wrote"),
    (["report", "--output", "{tmp}"], None, "is a directory: give the path of a file"),
    (["export", "--csv", "--to", "{tmp}"], "{tmp}/runs.csv", "runs.csv exists and is not a file this command wrote"),
    (["export", "--csv", "--to", "{tmp}/notes.md"], "{tmp}/notes.md", "is a file: give a directory"),
    (["reluize-report", "{tmp}", "--output", "{tmp}/notes.md"], "{tmp}/notes.md", "is not a file this command wrote"),
])
def test_outputs_never_overwrite_what_the_tool_did_not_write(tmp_path, capsys, argv, victim, message):
    """--output / --to pointed by mistake at the results store or the user's own file: refused, the
    file intact; a file the command wrote before is replaced as usual."""
    out = _store_dir(tmp_path, "store")
    (tmp_path / "notes.md").write_text("my own notes\n")
    (tmp_path / "runs.csv").write_text("my,own,table\n")
    fill = lambda a: a.format(out=out, tmp=tmp_path)  # noqa: E731
    before = _snapshot(tmp_path)
    status = main([fill(a) for a in argv] + (["--out", str(out)] if argv[0] != "reluize-report" else []))
    err = capsys.readouterr().err
    assert status == 2 and re.search(message, err) and "Traceback" not in err, err
    assert _snapshot(tmp_path) == before
    if victim is None:
        return
    Path(fill(victim)).unlink()  # once it is gone, the command writes there, and writes there again
    if argv[0] != "reluize-report":
        assert main([fill(a) for a in argv] + ["--out", str(out)]) == 0
        assert main([fill(a) for a in argv] + ["--out", str(out)]) == 0


def test_a_store_that_cannot_be_written_is_one_line(tmp_path, capsys, monkeypatch):
    """A read-only store (or store directory): sqlite3's OperationalError was a traceback."""
    out = _store_dir(tmp_path, "store")

    def read_only(self, command):
        raise sqlite3.OperationalError("attempt to write a readonly database")
    monkeypatch.setattr(Store, "record_sweep", read_only)
    assert main(["run", "wine-mlp", "--seeds", "1", "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and "attempt to write a readonly database" in err


@pytest.mark.parametrize("command", ["run", "demo", "report", "export", "deploy", "reluize-report", "tasks"])
def test_every_lab_command_prints_its_help(command, capsys):
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: lambda-gelu lab {command}")
