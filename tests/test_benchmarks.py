"""The benchmark scripts refuse a count below 1 and a model directory that is not one in a line of their own, before
they load a model or time anything (a zero once ended a run minutes in, in a traceback from the medians)."""
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCHMARKS / script), *args], capture_output=True, text=True,
                          timeout=120)


def one_line_error(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{Path(done.args[1]).name}: error: argument"), done.stderr
    return last


@pytest.mark.parametrize("script, args", [
    ("bench_llamacpp.py", ["--prompt-tokens", "0"]),
    ("bench_llamacpp.py", ["--rounds", "-3"]),
    ("bench_decode.py", ["--new-tokens", "many"]),
    ("bench_op.py", ["--reps", "0"]),
])
def test_a_count_below_one_is_refused(script, args, tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "reluize_report.json").write_text("{}")
    model = ["--model", str(tmp_path)] if script != "bench_op.py" else []
    assert "a whole number ≥ 1" in one_line_error(run(script, *model, *args))


def test_a_model_that_is_not_a_conversion_is_refused(tmp_path):
    assert "not a model directory" in one_line_error(run("bench_decode.py", "--model", str(tmp_path / "none")))
    (tmp_path / "config.json").write_text("{}")  # a checkpoint, but not one reluize wrote: no original to compare
    assert "reluize_report.json" in one_line_error(run("bench_llamacpp.py", "--model", str(tmp_path)))
