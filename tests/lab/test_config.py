"""Run configurations: typed overrides, validation when built, hashes that ignore what an arm does not use."""
import pytest

from lambda_gelu_lab.config import ConfigError, RunConfig, parse_overrides
from lambda_gelu_lab.tasks import resolve_tasks


def test_overrides_are_typed():
    assert parse_overrides(["lr=0.1", "optimizer=adamw", "epochs=3"]) == {"lr": 0.1, "optimizer": "adamw", "epochs": 3}
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides(["lr"])
    assert [t.name for t in resolve_tasks(["tabular-mlp", "wine-mlp"])] == ["breast-cancer-mlp", "wine-mlp"]


def test_hash_ignores_settings_an_arm_does_not_use():
    gelu = RunConfig(task="wine-mlp", arm="gelu")
    assert gelu.run_hash == gelu.replace(switch_at=0.5, temperature=0.3).run_hash
    harden = RunConfig(task="wine-mlp", arm="lambda-harden")
    assert harden.run_hash != harden.replace(switch_at=0.5).run_hash
    assert harden.base_hash == harden.replace(switch_at=0.5).base_hash == gelu.base_hash
    assert harden.replace(switch_at=0.5).variant == "lambda-harden[switch_at=0.5]"


def test_the_sparse_arm_owns_its_penalty_and_stored_hashes_stay_valid():
    sparse = RunConfig(task="wine-mlp", arm="lambda-harden-sparse")
    assert sparse.run_hash != sparse.replace(sparsity=3.0).run_hash
    assert sparse.replace(sparsity=3.0).variant == "lambda-harden-sparse[sparsity=3]"
    assert sparse.base_hash == RunConfig(task="wine-mlp", arm="gelu").base_hash
    for arm, stored in [("gelu", "af07ed39bb4c"), ("lambda-harden", "d2f179316686")]:  # hashes from before the field
        config = RunConfig(task="wine-mlp", arm=arm)
        assert config.run_hash == config.replace(sparsity=3.0).run_hash == stored


def test_the_posthoc_recalibration_is_a_variant_and_stored_posthoc_hashes_stay_valid():
    for arm, stored in [("reluize-swap", "49da3d827679"), ("reluize-blockwise", "ebc89ab8fb09")]:  # from before it
        assert RunConfig(task="fmnist-resnet", arm=arm).run_hash == stored
    swap = RunConfig(task="fmnist-resnet", arm="reluize-swap", posthoc_recalibrate=50, posthoc_lr=3e-4)
    assert swap.variant == "reluize-swap[posthoc_lr=0.0003,posthoc_recalibrate=50]"
    assert swap.run_hash != RunConfig(task="fmnist-resnet", arm="reluize-swap", posthoc_lr=3e-4).run_hash
    assert swap.base_hash == RunConfig(task="fmnist-resnet", arm="gelu").base_hash


@pytest.mark.parametrize("change, message", [({"arm": "swish"}, "arm='swish'"), ({"epochs": 0}, "epochs=0"),
                                             ({"init_lambda": 0.5}, "init_lambda=0.5"),
                                             ({"lr": float("nan")}, "lr=nan"),
                                             ({"sparsity": -1.0}, "sparsity=-1.0"),
                                             ({"arm": "reluize-swap", "posthoc_recalibrate": -1},
                                              "posthoc_recalibrate=-1"),
                                             ({"arm": "reluize-blockwise", "posthoc_recalibrate": 10},
                                              "reluize-blockwise: recalibrate: used by schedule='swap' or "
                                              "'anneal' only"),
                                             ({"arm": "lambda-harden-sparse", "switch_at": "auto"},
                                              "penalty starts rising at the switch point")])
def test_bad_values_fail_when_built(change, message):
    with pytest.raises(ConfigError, match=message):
        RunConfig(**{"task": "wine-mlp", "arm": "gelu", **change})
