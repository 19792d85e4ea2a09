"""A whole token in one C call (lambda_gelu.inference.token_step) against its reference, the decoder's per-layer C
path: the same functions in the same order, so the same tokens and logits within float rounding."""
import copy

import pytest
import torch

from lambda_gelu import _native
from lambda_gelu.inference.decoder import LeanDecoder
from lambda_gelu.inference.sparse import sparsify_
from lambda_gelu.inference.token_step import _layout_matches
from test_hf_decode import FAMILIES, TORCH_ONLY, _model, _prompt

pytestmark = pytest.mark.skipif(_native.library() is None, reason="no C compiler here")
# layers with more than their FFN after the attention (Gemma 4's per-layer inputs and scale, experts): per layer
PER_LAYER = {"gemma4", "gemma4-shared", "gemma4-moe", "granitemoe", "olmoe-unclipped"}
ONE_CALL = [f for f in FAMILIES if f not in PER_LAYER | TORCH_ONLY]


def test_the_structs_are_the_c_ones():
    assert _layout_matches(_native.library())


def _next_logits(decoder, ids):
    keys, values = decoder._cache(ids.shape[1] + 2), decoder._cache(ids.shape[1] + 2)
    decoder._forward(ids[:, :-1], 0, keys, values)
    return decoder._logits(decoder._forward(ids[:, -1:], ids.shape[1] - 1, keys, values))[0]


@pytest.mark.parametrize("int8", [False, True], ids=["float32", "int8"])
@pytest.mark.parametrize("family", [pytest.param(f, marks=() if f in ("llama", "gemma3") else pytest.mark.slow)
                                    for f in ONE_CALL])
def test_one_call_decodes_as_the_per_layer_path(family, int8):
    """Sparsified (int8: the FFNs' and the attention's rows int8), the one call gives the per-layer path's greedy
    tokens, past Mistral's and Gemma 3's windows, and its logits within float rounding."""
    model = _model(FAMILIES[family]())
    assert sparsify_(model, min_weights=0, int8=int8)
    one, per_layer = LeanDecoder(model, int8_attention=int8), LeanDecoder(model, int8_attention=int8, one_call=False)
    assert one.one_call and per_layer.fused and not per_layer.one_call
    ids = _prompt()
    with torch.inference_mode():
        assert torch.equal(one.generate(ids, 16), per_layer.generate(ids, 16))
        long = per_layer.generate(ids, 8)
        ours, theirs = _next_logits(one, long), _next_logits(per_layer, long)
    assert (ours - theirs).abs().max() <= 1e-5 * theirs.abs().max()


@pytest.mark.parametrize("family", ["gemma4", "granitemoe", "cohere"])
def test_layers_it_does_not_compute_decode_layer_by_layer(family):
    model = _model(FAMILIES[family]())
    sparsify_(model, min_weights=0)
    assert not LeanDecoder(model).one_call


def test_a_dense_ffn_decodes_layer_by_layer():
    model = _model(FAMILIES["llama"]())
    decoder = LeanDecoder(model)
    assert decoder.fused and not decoder.one_call
    sparse = copy.deepcopy(model)
    sparsify_(sparse, min_weights=0)
    assert LeanDecoder(sparse).one_call and not LeanDecoder(sparse, one_call=False).one_call
