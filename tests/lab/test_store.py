"""The results store: one row per run, each pointing to its own weights; foreign files refused untouched."""
import sqlite3

import pytest
import torch
from safetensors.torch import load_file

from lambda_gelu_lab.config import RunConfig
from lambda_gelu_lab.store import DB_NAME, Store, StoreError
from lambda_gelu_lab.train import RunResult


def _result(value: float, acc: float) -> RunResult:
    return RunResult(metrics={"test_acc": acc}, lambdas=[(0, "1", 1.5)],
                     epochs=[{"epoch": 1, "step": 10, "train_loss": 0.5, "val_acc": acc, "val_loss": 0.4}],
                     state_dict={"w": torch.full((3,), value)})


def test_a_row_never_points_to_another_runs_weights(tmp_path):
    """Two processes finish the same run: the second must neither replace the first's weights nor
    leave its own behind. (Both once wrote to the same file name, so the stored row could describe
    one training and point to the other's weights.)"""
    cfg = RunConfig(task="wine-mlp", arm="gelu", seed=0)
    with Store(tmp_path) as first, Store(tmp_path) as second:
        first.add(cfg, _result(1.0, 0.9))
        with pytest.raises(sqlite3.IntegrityError):
            second.add(cfg, _result(2.0, 0.5))
        (run,) = first.runs()
    assert run["test_acc"] == 0.9
    assert torch.equal(load_file(str(tmp_path / run["weights"]))["w"], torch.full((3,), 1.0))
    assert [p.name for p in (tmp_path / "weights").iterdir()] == [run["weights"].split("/")[-1]]


def test_every_table_is_created_and_the_store_closes_as_a_context_manager(tmp_path):
    with Store(tmp_path) as store:
        store.add_deploy("t", "h", 0, "GELU", {"int8": {"acc": 0.5}})
        store.add_deploy("t", "h", 0, "GELU", {"int8": {"acc": 0.1}})  # kept: the first one stays
        assert store.deploy_rows() == [("t", "h", 0, "GELU", "int8", {"acc": 0.5})]
        assert store.deploy_sections("t", "h", 0, "GELU") == {"int8"}
    with pytest.raises(sqlite3.ProgrammingError):
        store.runs()


@pytest.mark.parametrize("content", [b"not a database at all\n" * 10, None])
def test_a_file_that_is_not_a_store_is_refused_untouched(tmp_path, content):
    path = tmp_path / DB_NAME
    if content is None:  # a real SQLite database of some other program
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE invoices (id INTEGER)")
    content = path.read_bytes() if content is None else content
    path.write_bytes(content)
    with pytest.raises(StoreError, match="choose another --out"):
        Store(tmp_path)
    assert path.read_bytes() == content
