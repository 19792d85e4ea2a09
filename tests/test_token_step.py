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

pytestmark = pytest.mark.skipif(_native.library() is None, reason=f"the C kernels did not build: {_native.error()}")
# layers with more than their FFN after the attention (Gemma 4's per-layer inputs and scale, experts): per layer
PER_LAYER = {"gemma4", "gemma4-shared", "gemma4-moe", "granitemoe", "olmoe-unclipped"}
ONE_CALL = [f for f in FAMILIES if f not in PER_LAYER | TORCH_ONLY]


def test_the_structs_are_the_c_ones():
    assert _layout_matches(_native.library())


def _next_logits(decoder, ids):
    """The logits after ids, each token fed alone: the C step's alone, in whichever decoder (a prompt may take the
    torch path in one and the one call's rows in the other, which differ by more than the float rounding of one
    step)."""
    keys, values = decoder._cache(ids.shape[1] + 2), decoder._cache(ids.shape[1] + 2)
    for i in range(ids.shape[1] - 1):
        decoder._forward(ids[:, i:i + 1], i, keys, values)
    return decoder._logits(decoder._forward(ids[:, -1:], ids.shape[1] - 1, keys, values))[0]


@pytest.mark.parametrize("int8", [False, True], ids=["float32", "int8"])
@pytest.mark.parametrize("family", [pytest.param(f, marks=() if f in ("llama", "gemma3") else pytest.mark.slow)
                                    for f in ONE_CALL])
def test_one_call_decodes_as_the_per_layer_path(family, int8):
    """Sparsified (int8: the FFNs' and the attention's rows int8), the one call gives the per-layer path's greedy
    tokens, past Mistral's and Gemma 3's windows, and on one thread its logits bit for bit. (On more, the per-layer
    path sums a layer this small on fewer threads, so its FFN's units in another order: float rounding, which an int8
    rounding of the next input may carry up to a step of its grid.)"""
    model = _model(FAMILIES[family]())
    assert sparsify_(model, min_weights=0, int8=int8)
    one, per_layer = LeanDecoder(model, int8_attention=int8), LeanDecoder(model, int8_attention=int8, one_call=False)
    assert one.one_call and per_layer.fused and not per_layer.one_call
    ids, threads = _prompt(), torch.get_num_threads()
    with torch.inference_mode():
        assert torch.equal(one.generate(ids, 16), per_layer.generate(ids, 16))
        long = per_layer.generate(ids, 8)
        try:
            torch.set_num_threads(1)
            ours, theirs = _next_logits(one, long), _next_logits(per_layer, long)
        finally:
            torch.set_num_threads(threads)
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("family", [pytest.param(f, marks=() if f in ("llama", "gemma3") else pytest.mark.slow)
                                    for f in ONE_CALL])
def test_a_prompt_a_row_at_a_time_is_its_tokens_one_call_each(family, kind):
    """A short prompt goes through the C step a row at a time, layer by layer: its final state and every key and
    value it writes are those of its tokens fed one call each, bit for bit (the same functions in the same order for
    each row), past Mistral's and Gemma 3's windows of 6; a prompt longer than PROMPT_ROWS_IN_C takes the torch path."""
    model = _model(FAMILIES[family]())
    assert sparsify_(model, min_weights=0, **{kind: True})
    decoder, ids = LeanDecoder(model, int8_attention=True), _prompt(12)
    assert decoder._prompt_rows_in_c() >= ids.shape[1] and decoder._token.ffn_rows == kind
    calls = decoder._token.kernels = _Counting(decoder._token.kernels)
    with torch.inference_mode():
        keys, values = decoder._cache(12), decoder._cache(12)
        rows = decoder._forward(ids, 0, keys, values)
        assert calls.rows == [12]
        one_keys, one_values = decoder._cache(12), decoder._cache(12)
        for i in range(12):
            ones = decoder._forward(ids[:, i:i + 1], i, one_keys, one_values)
        assert calls.rows == [12] + [1] * 12
        assert torch.equal(rows, ones)
        assert all(torch.equal(a, b) for a, b in zip(keys + values, one_keys + one_values))
        calls.rows.clear()
        longer = _prompt(decoder._prompt_rows_in_c() + 1)
        decoder._forward(longer, 0, decoder._cache(longer.shape[1]), decoder._cache(longer.shape[1]))
        assert calls.rows == []


def test_a_prompt_over_float32_rows_takes_the_torch_path():
    model = _model(FAMILIES["llama"]())
    sparsify_(model, min_weights=0)
    assert LeanDecoder(model).one_call and LeanDecoder(model)._prompt_rows_in_c() == 0


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


class _Counting:
    """The kernels, counting the one-call greedy steps and noting the rows of each call for whole tokens."""

    def __init__(self, kernels):
        self.kernels, self.calls, self.rows = kernels, 0, []

    def __getattr__(self, name):
        return getattr(self.kernels, name)

    def decode_next(self, *args):
        self.calls += 1
        return self.kernels.decode_next(*args)

    def decode_tokens(self, h, rows, *args):
        self.rows.append(rows)
        return self.kernels.decode_tokens(h, rows, *args)


@pytest.mark.parametrize("family", ["llama", "gemma3"])  # an nn.Embedding the C call looks up; a scaled one
def test_greedy_tokens_after_the_prompt_are_one_call_each_and_stop_at_eos(family):
    """After the prompt, each greedy token is one C call (lg_decode_next: the embedding, the step and the output
    layer's screen), with the tokens of the step and the screen called apart (a head that is not a ScreenedArgmax
    takes that path), and stops after eos_token_id."""
    model = _model(FAMILIES[family]())
    sparsify_(model, min_weights=0, int8=True)
    decoder, ids = LeanDecoder(model, int8_attention=True), _prompt()
    screen = decoder.head
    counting = decoder._token.kernels = _Counting(decoder._token.kernels)
    with torch.inference_mode():
        ours = decoder.generate(ids, 12)
        decoder.head = lambda hidden: screen(hidden)
        apart = decoder.generate(ids, 12)
        decoder.head = screen
        eos = int(apart[0, ids.shape[1] + 4])
        stopped = decoder.generate(ids, 12, eos_token_id=eos)
    first = int((apart[0, ids.shape[1]:] == eos).nonzero()[0])  # the new tokens up to eos's first: one call each
    assert torch.equal(ours, apart) and torch.equal(stopped, apart[:, :ids.shape[1] + first + 1])
    assert counting.calls == 11 + first


def test_a_final_state_the_screen_cannot_bound_takes_every_logit():
    """A final hidden state with an infinity: the screen cannot decide, and the token is the logits' argmax, as
    without the screen."""
    model = _model(FAMILIES["llama"]())
    sparsify_(model, min_weights=0)
    decoder, unscreened, ids = LeanDecoder(model), LeanDecoder(model, screen_head=False), _prompt()
    with torch.no_grad():
        model.model.norm.weight[3] = float("inf")
    with torch.inference_mode():
        ours, unscreened = decoder.generate(ids, 6), unscreened.generate(ids, 6)
    assert torch.equal(ours, unscreened) and decoder.head.rows_read == model.lm_head.out_features


def test_a_head_with_more_rows_than_the_embedding_has_its_tokens_looked_up_apart():
    """The C call looks a token up in the embedding only where every token the output layer can give has a row
    there; otherwise the decoder's own embedding does (an index it does not have fails there, as in the model)."""
    model = _model(FAMILIES["llama"]())
    sparsify_(model, min_weights=0)
    torch.manual_seed(0)
    model.lm_head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size + 3, bias=False)
    decoder = LeanDecoder(model)
    assert decoder._token._embedding is None and decoder._token.head is decoder.head
    plain = _model(FAMILIES["llama"]())
    sparsify_(plain, min_weights=0)
    assert LeanDecoder(plain)._token._embedding is not None
