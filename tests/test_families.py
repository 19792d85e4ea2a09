"""Adding a gated-FFN family is one row of lambda_gelu.families: with it, a model whose FFNs have names the library
has never seen is converted, thresholded, sparsified and decoded; without it, none of those finds them."""
import copy

import pytest
import torch
import torch.nn as nn

import lambda_gelu as lg
from lambda_gelu import families
from lambda_gelu.inference.gated import SparseGatedMLP
from lambda_gelu.inference.sparse import sparsify_
from lambda_gelu.reluize.threshold import gate_zeros_problem, gated_ffns

transformers = pytest.importorskip("transformers")
from lambda_gelu.inference.decoder import LeanDecoder  # noqa: E402

OWN = families.Family("a family of the test's own", ffn=families.Gated("w1", "w3", "w2", "activation"))


class OwnNamesMLP(nn.Module):
    """A Llama FFN under other names (Mixtral's experts of old): w2(activation(w1(x)) * w3(x))."""

    def __init__(self, mlp: nn.Module):
        super().__init__()
        self.w1, self.w3, self.w2 = mlp.gate_proj, mlp.up_proj, mlp.down_proj
        self.activation = nn.SiLU()

    def forward(self, x):
        return self.w2(self.activation(self.w1(x)) * self.w3(x))


@pytest.fixture
def own_row():
    families.add(OWN)
    yield
    families.FAMILIES.remove(OWN)


def _relu_model():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=100, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20)  # greedy tokens far from ties
    for layer in model.model.layers:
        layer.mlp = OwnNamesMLP(layer.mlp)
    lg.convert_to_lambda_silu_(model)  # the conversion: SiLU → λ-SiLU → exact ReLU, whatever the FFN's names
    with pytest.warns(UserWarning, match="builds no module there"):  # hidden_act names no module of this FFN
        lg.to_relu_(model)
    assert all(type(layer.mlp.activation) is nn.ReLU for layer in model.model.layers)
    return model


def test_without_the_row_the_ffns_are_not_found():
    model = _relu_model()
    assert not gated_ffns(model)
    assert "no gated FFN" in gate_zeros_problem(model)
    with pytest.raises(ValueError, match="found no linear layer fed directly by an nn.ReLU"):
        sparsify_(model, min_weights=0)


def test_one_row_makes_them_thresholded_sparsified_and_decoded(own_row):
    model = _relu_model()
    assert [name for name, _, _ in gated_ffns(model)] == ["model.layers.0.mlp", "model.layers.1.mlp"]
    sparse = copy.deepcopy(model)
    assert sparsify_(sparse, min_weights=0)
    assert sum(isinstance(m, SparseGatedMLP) for m in sparse.modules()) == 2
    ids = torch.randint(0, 100, (1, 8), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        want = model.generate(ids, max_new_tokens=16, min_new_tokens=16, do_sample=False)
    assert torch.equal(LeanDecoder(sparse).generate(ids, 16), want)


def test_a_row_is_a_family():
    with pytest.raises(TypeError, match="a families row is a Family"):
        families.add(("w1", "w3", "w2", "act"))


def test_norm_layouts_are_tried_most_names_first():
    layouts = families.norm_layouts()
    counts = [len({n for n in names if n}) for names in layouts]
    assert counts == sorted(counts, reverse=True)
    assert layouts.index(("input_layernorm", None, "post_attention_layernorm", None)) < layouts.index(
        ("input_layernorm", None, "input_layernorm", None))  # Llama's before Cohere's, whose one norm is Llama's first
