"""Activations by name, class or None, as timm's get_act_layer / create_act."""
import pytest
import torch.nn as nn

from lambda_gelu import LambdaGELU, create_act, get_act_layer


def test_names_classes_and_none_resolve():
    assert get_act_layer("Lambda-GELU") is LambdaGELU
    assert get_act_layer("lambda_gelu") is LambdaGELU
    assert get_act_layer(None) is None
    assert get_act_layer(nn.Tanh) is nn.Tanh
    relu = create_act("relu")
    assert type(relu) is nn.ReLU
    assert create_act("lambda_gelu", init_lambda=2.0).lam.item() == pytest.approx(2.0)


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown activation 'gleu'; known: .*gelu"):
        get_act_layer("gleu")
