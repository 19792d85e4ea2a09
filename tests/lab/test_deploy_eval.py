"""`lambda-gelu deploy` on stored runs: rebuilt models match the stored metrics, and every section lands."""
import json
import sqlite3

import pytest

pytest.importorskip("onnxruntime")
from lambda_gelu_lab.cli import main  # noqa: E402
from lambda_gelu_lab.deploy_eval import load_model  # noqa: E402
from lambda_gelu_lab.store import Store  # noqa: E402
from lambda_gelu_lab.tasks import TASKS  # noqa: E402
from lambda_gelu_lab.train import evaluate  # noqa: E402


@pytest.mark.slow
def test_deploy_on_stored_runs(tmp_path):
    out = str(tmp_path / "d")
    assert main(["run", "wine-mlp", "--seeds", "1", "--epochs", "20", "--out", out, "--quiet", "--no-report"]) == 0
    store = Store(out)
    task = TASKS["wine-mlp"]
    splits = task.load(None)
    for run in store.runs():  # the stored weights reproduce the stored accuracy exactly
        assert evaluate(load_model(store, run, task, splits), splits.x_test, splits.y_test)[0] == run["test_acc"]
    store.close()

    assert main(["deploy", "--out", out, "--task", "wine-mlp", "--seeds", "1", "--points", "5"]) == 0
    with sqlite3.connect(f"{out}/results.sqlite") as db:
        rows = db.execute("SELECT model, section, data FROM deploy").fetchall()
    sections = {(m, s): json.loads(d) for m, s, d in rows}
    assert sections[("GELU", "int8")]["float_ops"].get("Erf") == 2
    for m in ("direct swap", "annealed→ReLU", "ReLU scratch"):
        assert sections[(m, "int8")]["float_ops"] == {}
        v = sections[(m, "verify")]["0.01"]
        assert v["verified"] + v["falsified"] + v["timeout"] == v["correct"] <= 5
        assert 0 <= sections[(m, "sparsity")]["zero_fraction"] <= 1
    assert sections[("*", "latency")]
    report = (tmp_path / "d" / "report.md").read_text()
    assert "# Deployment" in report and "none (fully integer)" in report and "exact: verified" in report
