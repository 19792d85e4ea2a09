"""The tasks (the MLPs train in test_runner.py): load the real data, train one short epoch on a
slice of it, ReLU-ize, and land in the store."""
import dataclasses

import pytest
import torch

import lambda_gelu as lg
from lambda_gelu_lab.config import RunConfig
from lambda_gelu_lab.tasks import TASKS
from lambda_gelu_lab.train import build_model, train_run

pytest.importorskip("transformers")


def _slice(splits, n_train=512, n_eval=256):
    return dataclasses.replace(splits, x_train=splits.x_train[:n_train], y_train=splits.y_train[:n_train],
                               x_val=splits.x_val[:n_eval], y_val=splits.y_val[:n_eval],
                               x_test=splits.x_test[:n_eval], y_test=splits.y_test[:n_eval])


@pytest.fixture(scope="module")
def fmnist():
    return TASKS["fmnist-mlp"].load(None)


@pytest.mark.slow
@pytest.mark.parametrize("name, layers", [("fmnist-resnet", 7), ("fmnist-vit", 4), ("stdlib-gpt", 3)])
def test_new_task_one_short_epoch(name, layers, fmnist):
    task = TASKS[name]
    splits = _slice(fmnist if name.startswith("fmnist") else task.load(None))
    cfg = RunConfig(task=name, arm="lambda-harden", **{**task.defaults, "epochs": 1})
    m = train_run(task, splits, cfg).metrics
    assert len(m["lambda_end"]) == layers and all(abs(v - lg.lambda_target()) < 1e-3 for v in m["lambda_end"].values())
    assert 0 <= m["sub_test_acc"] <= 1 and m["test_loss"] < 10
    chance = 1 / splits.num_classes
    assert m["test_acc"] > chance  # it learned something in one short epoch


def test_stdlib_corpus_split_by_file():
    s = TASKS["stdlib-gpt"].load(None)
    assert s.x_train.shape[1] == 64 and torch.equal(s.x_train[:, 1:], s.y_train[:, :-1])
    assert s.x_train.max() < 256 and s.num_classes == 256
    # train and validation come from different files: no validation window occurs in train
    train_rows = {bytes(r.to(torch.uint8).tolist()) for r in s.x_train}
    assert sum(bytes(r.to(torch.uint8).tolist()) in train_rows for r in s.x_val) < 0.01 * len(s.x_val)


def test_gpt_gelu_arm_keeps_gelu_new_and_lambda_arm_converts_it():
    task = TASKS["stdlib-gpt"]
    splits = _slice(task.load(None), 8, 8)
    gelu = build_model(task, splits, RunConfig(task="stdlib-gpt", arm="gelu"))
    lam = build_model(task, splits, RunConfig(task="stdlib-gpt", arm="lambda"))
    assert sum(type(m).__name__ == "NewGELUActivation" for m in gelu.modules()) == 3
    assert len(list(lg.lambda_modules(lam))) == 3
    lam_weights = [p for n, p in lam.named_parameters() if not n.endswith(".s")]
    assert len(lam_weights) == len(list(gelu.parameters()))
    assert all(torch.equal(p, q) for p, q in zip(gelu.parameters(), lam_weights))  # same init across arms
