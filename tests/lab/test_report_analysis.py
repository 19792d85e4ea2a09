import math

import pytest

from lambda_gelu_lab.report.analysis import drift, layer_order, matched_spearman, pairwise_spearman


def test_layer_order_is_numeric():
    assert layer_order(["10", "2", "blocks.10.mlp.1", "blocks.2.mlp.1"]) == ["2", "10", "blocks.2.mlp.1", "blocks.10.mlp.1"]


def test_pairwise_spearman_by_hand():
    a = {"1": 1.0, "2": 2.0, "3": 3.0}
    same_order = {"1": 10.0, "2": 20.0, "3": 300.0}   # ranks equal: ρ = 1
    reversed_ = {"1": 3.0, "2": 2.0, "3": 1.0}        # ρ = −1
    swapped = {"1": 2.0, "2": 1.0, "3": 3.0}          # d² = 1+1+0 → ρ = 1 − 6·2/(3·8) = 0.5
    r = pairwise_spearman([a, same_order, reversed_])
    assert r["pairs"] == 3 and r["min"] == pytest.approx(-1.0) and r["mean"] == pytest.approx((1 - 1 - 1) / 3)
    assert pairwise_spearman([a, swapped])["mean"] == pytest.approx(0.5)
    flat = {"1": 1.0, "2": 1.0, "3": 1.0}
    r = pairwise_spearman([a, flat])
    assert r["pairs"] == 0 and r["undefined"] == 1 and math.isnan(r["mean"])


def test_matched_spearman_pairs_seeds():
    a = {0: {"1": 1, "2": 2, "3": 3}, 1: {"1": 1, "2": 2, "3": 3}, 5: {"1": 3, "2": 2, "3": 1}}
    b = {0: {"1": 5, "2": 6, "3": 7}, 1: {"1": 7, "2": 6, "3": 5}}
    r = matched_spearman(a, b)
    assert r["pairs"] == 2 and r["mean"] == pytest.approx(0.0) and r["min"] == pytest.approx(-1.0)


def test_drift_by_hand():
    assert drift(1.5, {"a": 2.5, "b": 1.0}) == pytest.approx((1.0 - 0.5) / 2)
