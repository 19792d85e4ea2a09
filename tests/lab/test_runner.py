"""The protocol end to end: tasks train, arms produce rows, sweeps resume after SIGKILL, bad
configs fail with one clear error, and the report renders."""
import os
import signal
import subprocess
import sys
import time

import pytest

from lambda_gelu_lab.cli import main
from lambda_gelu_lab.config import RunConfig
from lambda_gelu_lab.store import Store
from lambda_gelu_lab.tasks import TASKS
from lambda_gelu_lab.train import train_run
from live_store import stored_runs

# accuracy floors after one short run on the real data, ReLU-ized (chance: 10%, 10%, 63%, 40%)
FLOORS = {"fmnist-mlp": (1, 0.80), "mnist1d-mlp": (5, 0.30), "breast-cancer-mlp": (5, 0.85), "wine-mlp": (20, 0.80)}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FLOORS))  # the CNN/ViT/GPT tasks: test_tasks.py
def test_each_task_trains_and_relu_izes_above_a_floor(name):
    epochs, floor = FLOORS[name]
    task = TASKS[name]
    cfg = RunConfig(task=name, arm="lambda-harden", **{**task.defaults, "epochs": epochs})
    r = train_run(task, task.load(None), cfg)
    m = r.metrics
    assert m["sub_test_acc"] > floor, m
    assert set(m["lambda_switch"]) == set(m["lambda_end"]) and len(m["lambda_end"]) >= 2
    assert all(abs(v - 159.577) < 1e-3 for v in m["lambda_end"].values())  # hardened to λ_target
    assert r.lambdas[0][0] == 0 and r.lambdas[-1][0] == m["steps"]






@pytest.mark.slow
def test_arms_produce_rows_and_same_init_across_arms(tmp_path):
    out = str(tmp_path / "r")
    assert main(["run", "wine-mlp", "--seeds", "2", "--epochs", "3", "--out", out, "--quiet"]) == 0
    rows = stored_runs(out)
    assert sorted((r[1], r[2]) for r in rows) == sorted((a, s) for a in ("gelu", "lambda", "lambda-harden", "relu") for s in (0, 1))
    store = Store(out)
    runs = store.runs()
    assert all(r["weights"] and (tmp_path / "r" / r["weights"]).is_file() for r in runs)
    relu = [r for r in runs if r["arm"] == "relu"]
    assert all(r["sub_test_acc"] is None for r in relu)
    lam = [r for r in runs if r["arm"] == "lambda"]
    assert all(r["metrics"]["lambda_switch"] is None and r["metrics"]["lambda_end"] for r in lam)
    # the GELU and ReLU arms ignore λ settings, so they share one hash across λ variants
    assert RunConfig(task="t", arm="gelu", switch_at=0.1).run_hash == RunConfig(task="t", arm="gelu").run_hash
    assert RunConfig(task="t", arm="lambda-harden", switch_at=0.1).run_hash != RunConfig(task="t", arm="lambda-harden").run_hash
    # rerunning is a no-op
    assert main(["run", "wine-mlp", "--seeds", "2", "--epochs", "3", "--out", out, "--quiet"]) == 0
    assert stored_runs(out) == rows
    store.close()


def test_same_initial_weights_for_every_arm():
    from lambda_gelu_lab.train import build_model
    task = TASKS["wine-mlp"]
    splits = task.load(None)
    linear = {arm: [p for n, p in build_model(task, splits, RunConfig(task="wine-mlp", arm=arm, seed=3)).named_parameters()
                    if not n.endswith(".s")] for arm in ("gelu", "lambda", "lambda-harden", "relu")}
    for arm in linear:
        assert all((a == b).all() for a, b in zip(linear[arm], linear["gelu"]))


@pytest.mark.slow
def test_sweep_killed_with_sigkill_resumes_without_loss_or_duplicates(tmp_path):
    out = str(tmp_path / "k")
    cmd = [sys.executable, "-m", "lambda_gelu_lab", "run", "breast-cancer-mlp", "--seeds", "4", "--epochs", "15",
           "--arms", "gelu", "lambda-harden", "--out", out, "--quiet", "--no-report"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    db = os.path.join(out, "results.sqlite")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:  # wait for the first stored run
        if os.path.exists(db) and stored_runs(out):
            break
        time.sleep(0.05)
    assert proc.poll() is None, f"the sweep ended before the kill: {proc.stderr.read().decode()[-2000:]}"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    before = stored_runs(out)
    assert 1 <= len(before) < 8, "the kill must land mid-sweep for this test to mean anything"
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = stored_runs(out)
    assert after[:len(before)] == before  # what was stored is untouched
    keys = [r[:4] for r in after]
    assert len(keys) == 8 and len(set(keys)) == 8
    assert len([f for f in os.listdir(os.path.join(out, "weights")) if f.endswith(".safetensors")]) == 8


@pytest.mark.slow
def test_two_processes_sharing_a_store_neither_crash_nor_duplicate_nor_mix_weights(tmp_path):
    out = str(tmp_path / "shared")
    cmd = [sys.executable, "-m", "lambda_gelu_lab", "run", "wine-mlp", "--seeds", "3", "--epochs", "10",
           "--arms", "gelu", "relu", "--out", out, "--quiet", "--no-report"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()
    keys = [r[:4] for r in stored_runs(out)]
    assert len(keys) == 6 and len(set(keys)) == 6
    # both processes trained every run: each row must point to weights that reproduce its own metrics
    from lambda_gelu_lab.deploy_eval import load_model
    from lambda_gelu_lab.train import evaluate
    task = TASKS["wine-mlp"]
    splits = task.load(None)
    with Store(out) as store:
        runs = store.runs()
        for run in runs:
            assert evaluate(load_model(store, run, task, splits), splits.x_test, splits.y_test)[0] == run["test_acc"]
    assert sorted(os.listdir(os.path.join(out, "weights"))) == sorted(r["weights"].split("/")[-1] for r in runs)
