"""LeanDecoder: greedy decoding at batch 1 over a static cache gives transformers' generate()'s tokens, and sampled
decoding its draws from the same seed, on tiny random models of each layout it runs (FAMILIES, each with what it
adds: sliding windows, biases, query/key norms, stacked projections, partial or paired rotary embeddings, layers
without one, norms placed otherwise, scaled embeddings, sublayers and logits, shared caches, per-layer inputs,
experts), sparsified or not, and refuses in one line what it does not run: another layout (GPT-2, attention both
ways, a layer computing otherwise), a batch, a prompt beyond its cache. Its C decoding step gives the torch path's
logits, which are the model's own, and stands aside where a norm is of another kind or a layer holds what it does
not compute."""
import copy

import pytest
import torch

from lambda_gelu.inference.sparse import sparsify_

transformers = pytest.importorskip("transformers")
from lambda_gelu.inference.decoder import LeanDecoder  # noqa: E402

SMALL = dict(hidden_size=32, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=100, max_position_embeddings=128, hidden_act="relu")
GEMMA4 = dict(SMALL, hidden_activation="relu", num_hidden_layers=4, head_dim=8, global_head_dim=16, sliding_window=6,
              layer_types=["sliding_attention", "full_attention"] * 2)
GRANITE = dict(embedding_multiplier=3.0, residual_multiplier=0.5, logits_scaling=4.0, attention_multiplier=0.2,
               pad_token_id=0)
FAMILIES = {
    "llama": lambda: transformers.LlamaConfig(**SMALL),
    "mistral": lambda: transformers.MistralConfig(**SMALL, sliding_window=6),  # decoded past it
    "qwen2": lambda: transformers.Qwen2Config(**SMALL),
    "qwen3": lambda: transformers.Qwen3Config(**SMALL, head_dim=8),
    "phi3": lambda: transformers.Phi3Config(**SMALL, sliding_window=6, pad_token_id=0),  # q, k, v in one layer
    "phi4-mini": lambda: transformers.Phi3Config(**SMALL, partial_rotary_factor=0.5, pad_token_id=0),  # half rotated
    "gemma": lambda: transformers.GemmaConfig(**{**SMALL, "hidden_activation": "relu"}, head_dim=8),
    "gemma2": lambda: transformers.Gemma2Config(**{**SMALL, "hidden_activation": "relu"}, head_dim=8, sliding_window=6,
                                                final_logit_softcapping=10.0),
    "gemma3": lambda: transformers.Gemma3TextConfig(**{**SMALL, "hidden_activation": "relu"}, head_dim=8,
                                                    sliding_window=6, sliding_window_pattern=2),  # local, global
    # VaultGemma: a norm before the FFN named as Gemma 2's, none after the attention
    "vaultgemma": lambda: transformers.VaultGemmaConfig(**{**SMALL, "hidden_activation": "relu"}, head_dim=8),
    # Gemma 4: wider heads on the global layers, each layer's own input per token, a scale of each layer's output
    "gemma4": lambda: transformers.Gemma4TextConfig(**GEMMA4, hidden_size_per_layer_input=8,
                                                    vocab_size_per_layer_input=100, final_logit_softcapping=10.0),
    # its global layers' values the keys' projection, and the last two layers reading earlier layers' keys and values
    "gemma4-shared": lambda: transformers.Gemma4TextConfig(
        **GEMMA4, attention_k_eq_v=True, num_global_key_value_heads=1, num_kv_shared_layers=2,
        hidden_size_per_layer_input=8, vocab_size_per_layer_input=100),
    # a mixture of experts beside each FFN (Gemma 4's 26B-A4B)
    "gemma4-moe": lambda: transformers.Gemma4TextConfig(**GEMMA4, enable_moe_block=True, num_experts=4,
                                                        top_k_experts=2, moe_intermediate_size=24,
                                                        hidden_size_per_layer_input=0),
    # GLM: each head's neighbouring features rotated in pairs, over half of it; GLM-4: with norms after the attention
    # and the FFN of other names; ERNIE 4.5: rotated in pairs over the whole head
    "glm": lambda: transformers.GlmConfig(**SMALL, pad_token_id=0),
    "glm4": lambda: transformers.Glm4Config(**SMALL, pad_token_id=0),
    "ernie4_5": lambda: transformers.Ernie4_5Config(**SMALL, pad_token_id=0),
    # SmolLM3: a layer without rotary embedding; EXAONE 4: norms after the attention and the FFN alone, its global
    # layers without rotary embedding, its local ones sliding
    "smollm3": lambda: transformers.SmolLM3Config(**SMALL, no_rope_layers=[1, 0], pad_token_id=0),
    "exaone4": lambda: transformers.Exaone4Config(**SMALL, sliding_window=6, pad_token_id=0,
                                                  layer_types=["sliding_attention", "full_attention"]),
    # Granite: its embedding, each sublayer's output and the logits scaled; its mixture, block_sparse_moe; HunYuan:
    # each head's query and key normalized after the rotation
    "granite": lambda: transformers.GraniteConfig(**SMALL, **GRANITE),
    "granitemoe": lambda: transformers.GraniteMoeConfig(**SMALL, **GRANITE, num_local_experts=4, num_experts_per_tok=2),
    "hunyuan": lambda: transformers.HunYuanDenseV1Config(**SMALL, head_dim=8, pad_token_id=0),
    # Cohere: the attention and the FFN side by side on one norm's output, each angle twice in a row in its rotary
    # table for neighbouring pairs, LayerNorms, scaled logits
    "cohere": lambda: transformers.CohereConfig(**SMALL, logit_scale=0.25, pad_token_id=0),
    # Cohere 2: its local layers sliding, its global ones without rotary embedding (found by trying: no field says so)
    "cohere2": lambda: transformers.Cohere2Config(**SMALL, logit_scale=0.25, sliding_window=6, pad_token_id=0,
                                                  layer_types=["sliding_attention", "full_attention"]),
    # OLMo: LayerNorms without weights and queries, keys and values clipped; OLMo 2: norms after the attention and the
    # FFN alone, one over every head's query; OLMo 3: with sliding windows; OLMoE: those norms with experts, clipped or
    # not
    "olmo": lambda: transformers.OlmoConfig(**SMALL, clip_qkv=0.5, pad_token_id=0),
    "olmo2": lambda: transformers.Olmo2Config(**SMALL, pad_token_id=0),
    "olmo3": lambda: transformers.Olmo3Config(**SMALL, sliding_window=6, pad_token_id=0,
                                              layer_types=["sliding_attention", "full_attention"]),
    "olmoe": lambda: transformers.OlmoeConfig(**SMALL, num_experts=4, num_experts_per_tok=2, clip_qkv=0.5,
                                              pad_token_id=0),
    "olmoe-unclipped": lambda: transformers.OlmoeConfig(**SMALL, num_experts=4, num_experts_per_tok=2, pad_token_id=0),
}
# what the C step does not compute: their torch path
TORCH_ONLY = {"cohere", "cohere2", "olmo", "olmoe"}


def _model(config, uneven_norms=True):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # sharper logits than the random initialisation's, so greedy tokens are far from ties
        model.lm_head.weight.mul_(20)
        for layer in model.model.layers:  # Gemma 4's scale of a layer's output, 1 at initialisation: not left out
            if hasattr(layer, "layer_scalar"):
                layer.layer_scalar.fill_(0.7)
        for name, w in model.named_parameters():  # norms' weights, 1 or 0 at initialisation: not alike over a head
            if uneven_norms and "norm" in name and w.dim() == 1:
                w.add_(0.2 * torch.randn(w.shape, generator=torch.Generator().manual_seed(2)))
    return model


def _prompt(n=10):
    return torch.randint(0, 100, (1, n), generator=torch.Generator().manual_seed(1))


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
def test_lean_decoding_gives_generates_tokens_dense_and_sparsified(family):
    model = _model(FAMILIES[family]())
    sparse = copy.deepcopy(model)
    assert sparsify_(sparse, min_weights=0)
    ids = _prompt()
    with torch.inference_mode():
        want = model.generate(ids, max_new_tokens=24, min_new_tokens=24, do_sample=False)
    assert torch.equal(LeanDecoder(model).generate(ids, 24), want)
    assert torch.equal(LeanDecoder(sparse).generate(ids, 24), want)
    assert torch.equal(LeanDecoder(sparse, screen_head=False, fused=False).generate(ids, 24), want)


def test_the_next_token_reads_few_rows_of_the_output_layer():
    model = _model(FAMILIES["llama"]())
    decoder = LeanDecoder(model)
    read = []
    with torch.inference_mode():
        for i in range(10):  # the screened head's token is the argmax of the logits, from a few rows of the layer
            hidden = decoder._forward(_prompt(10 + i), 0, decoder._cache(20), decoder._cache(20))
            assert int(decoder.head(hidden)) == int(model.lm_head(hidden).argmax())
            read.append(decoder.head.rows_read)
    assert max(read) < model.config.vocab_size // 4, read


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("fused", [True, False])
def test_the_logits_at_each_step_are_the_models_own(family, fused):
    model, ids = _model(FAMILIES[family]()), _prompt()
    decoder = LeanDecoder(model, fused=fused)
    assert decoder.fused == (fused and family not in TORCH_ONLY)  # the C step, Qwen3's per-head norms included
    tokens = decoder.generate(ids, 12)
    keys, values = decoder._cache(tokens.shape[1]), decoder._cache(tokens.shape[1])
    with torch.inference_mode():
        full = model(tokens).logits[0]
        ours = [decoder._forward(ids, 0, keys, values)[0]]
        ours += [decoder._forward(tokens[:, i:i + 1], i, keys, values)[0] for i in range(10, tokens.shape[1] - 1)]
        ours = decoder._logits(torch.stack(ours))  # soft-capped as the model caps them
    assert torch.allclose(ours, full[9:-1], rtol=1e-5, atol=1e-5 * float(full.abs().max()))


def test_the_softmax_exponential_is_within_two_units_in_the_last_place():
    """The C step's exp of softmax scores less their largest (x ≤ 0): within 2 units in the last place of exp(x) down
    to −87 (past it, subnormal, within the smallest one), 0 below −87.3 and for −∞, NaN for NaN, on the vector loop
    (eight at a time) and on expf for the rest."""
    from lambda_gelu import _native
    kernels = _native.library()
    if kernels is None:
        pytest.skip(f"the C kernels did not build: {_native.error()}")
    spread = -87 * torch.rand(10_000, generator=torch.Generator().manual_seed(0))
    x = torch.cat([torch.linspace(-88, 0, 400_003), spread])
    y = x.clone()
    kernels.exp_f32(y.data_ptr(), y.numel())
    exact = torch.exp(x.double())
    normal = x >= -87
    ulp = torch.pow(2.0, torch.floor(torch.log2(exact[normal])) - 23)
    assert ((y[normal].double() - exact[normal]).abs() <= 2 * ulp).all()
    subnormal = ~normal & (x >= -87.3)
    assert ((y[subnormal].double() - exact[subnormal]).abs() <= 2.0 ** -149).all() and (y[x < -87.3] == 0).all()
    special = torch.tensor([float("nan"), float("-inf"), -0.0, 0.0, -87.29, -87.31, -1000.0, -1e-30, float("nan")])
    out = special.clone()
    kernels.exp_f32(out.data_ptr(), out.numel())  # eight in the vector loop, the last by expf
    assert out[0].isnan() and out[8].isnan() and out[1] == 0 and out[5] == 0 and out[6] == 0
    assert out[2] == 1 and out[3] == 1 and out[7] == 1 and 0 < out[4] < 2e-38


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_long_cache_split_over_threads_is_attended_as_the_model_attends(threads):
    """Heads of 96 features (a vector loop of 64 and a rest), two query heads a key head, 80 positions: each thread
    of the C step takes a share of the positions (several tiles of keys each), and their shares' softmaxes merged give
    the model's own logits at every step, on any number of threads."""
    config = transformers.LlamaConfig(**{**SMALL, "hidden_size": 192, "num_attention_heads": 2,
                                         "num_key_value_heads": 1, "max_position_embeddings": 96})
    model, ids, before = _model(config), _prompt(), torch.get_num_threads()
    assert sparsify_(model, min_weights=0)  # so that the whole token is one call
    try:
        torch.set_num_threads(threads)
        decoder = LeanDecoder(model, max_length=96)
        assert decoder.fused and decoder.one_call
        tokens = decoder.generate(ids, 70)
        keys, values = decoder._cache(tokens.shape[1]), decoder._cache(tokens.shape[1])
        with torch.inference_mode():
            full = model(tokens).logits[0, 9:-1]
            ours = [decoder._forward(ids, 0, keys, values)[0]]
            ours += [decoder._forward(tokens[:, i:i + 1], i, keys, values)[0] for i in range(10, tokens.shape[1] - 1)]
    finally:
        torch.set_num_threads(before)
    assert torch.allclose(decoder._logits(torch.stack(ours)), full, rtol=1e-5, atol=1e-5 * float(full.abs().max()))


def test_a_nan_in_the_cache_is_carried_whichever_thread_reads_it():
    """A NaN key at position 0, read by a share of the positions alone (two threads at position 1: one takes
    position 0, the other 1): every logit NaN, as the model's own attention gives, not a softmax over the rest."""
    model, before = _model(FAMILIES["llama"]()), torch.get_num_threads()
    assert sparsify_(model, min_weights=0)
    try:
        torch.set_num_threads(2)
        decoder = LeanDecoder(model, max_length=8)
        keys, values = decoder._cache(8), decoder._cache(8)
        with torch.inference_mode():
            decoder._forward(torch.tensor([[5]]), 0, keys, values)
            keys[0][0, 0, 0, 0] = float("nan")  # layer 0, key head 0, position 0
            logits = decoder._logits(decoder._forward(torch.tensor([[7]]), 1, keys, values))
    finally:
        torch.set_num_threads(before)
    assert logits.isnan().all()


@pytest.mark.parametrize("family", ["mistral", "phi3", "gemma2", "gemma3", "gemma4-shared", "olmo3", "exaone4"])
@pytest.mark.parametrize("fused", [True, False])
def test_sliding_windows_and_soft_caps_are_the_models_own(family, fused):
    model, ids = _model(FAMILIES[family](), uneven_norms=False), _prompt()  # its sharp attention would magnify them
    with torch.no_grad():  # sharp attention, so a window left out or a soft cap not applied shows in the logits
        for a in (layer.self_attn for layer in model.model.layers):  # the query's rows (Phi-3's: of qkv_proj's)
            (a.q_proj.weight if hasattr(a, "q_proj") else a.qkv_proj.weight[:model.config.hidden_size]).mul_(50)
            if family == "olmo3":  # whose norm over every query would undo that: its weight instead
                a.q_norm.weight.mul_(50)
    if family == "gemma2":
        model.config.attn_logit_softcapping = 0.5
        for layer in model.model.layers:
            layer.self_attn.attn_logit_softcapping = 0.5
    tokens = LeanDecoder(model).generate(ids, 20)  # past the window of 6
    with torch.inference_mode():
        full = model(tokens).logits[0, 9:-1]

    def gap(decoder):
        keys, values = decoder._cache(tokens.shape[1]), decoder._cache(tokens.shape[1])
        with torch.inference_mode():
            ours = [decoder._forward(ids, 0, keys, values)[0]]
            ours += [decoder._forward(tokens[:, i:i + 1], i, keys, values)[0] for i in range(10, tokens.shape[1] - 1)]
            return float((decoder._logits(torch.stack(ours)) - full).abs().max() / full.abs().max())

    decoder = LeanDecoder(model, fused=fused)
    assert decoder.fused == (fused and family not in TORCH_ONLY) and gap(decoder) < 1e-5
    decoder.windows = [None] * len(decoder.windows)  # every position attended
    assert gap(decoder) > 1e-3
    if family == "gemma2":
        decoder = LeanDecoder(model, fused=fused)
        decoder.softcaps = [None] * len(decoder.softcaps)
        assert gap(decoder) > 1e-3
        decoder = LeanDecoder(model, fused=fused)
        decoder.final_softcap = None
        assert gap(decoder) > 1e-3


def test_a_norm_of_another_kind_decodes_by_the_torch_path():
    model = _model(FAMILIES["llama"]())
    layer = model.model.layers[1]
    layer.post_attention_layernorm = torch.nn.LayerNorm(32)  # has a weight and an eps, and subtracts the mean
    decoder, ids = LeanDecoder(model), _prompt()
    assert not decoder.fused
    with torch.inference_mode():
        assert torch.equal(decoder.generate(ids, 12), model.generate(ids, max_new_tokens=12, min_new_tokens=12,
                                                                     do_sample=False))


def test_weights_changed_after_construction_are_decoded_as_they_are_now():
    model, ids = _model(FAMILIES["llama"]()), _prompt()
    sparsify_(model, min_weights=0)
    decoder = LeanDecoder(model)
    decoder.generate(ids, 4)
    with torch.no_grad():  # copied by the decoder (stacked q/k/v, the output layer's screen) or read by address
        model.lm_head.weight.neg_()
        model.model.layers[0].self_attn.k_proj.weight.mul_(3)
        model.model.layers[1].mlp.gate_proj.weight.neg_()
        model.model.layers[1].post_attention_layernorm.weight = torch.nn.Parameter(torch.full((32,), 2.0))
    with torch.inference_mode():
        want = model.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False)
    assert torch.equal(decoder.generate(ids, 12), want)


class _Recorder:
    """A streamer as transformers' generate feeds one: what put received, and how often end was called."""

    def __init__(self):
        self.parts, self.ends = [], 0

    def put(self, value):
        assert self.ends == 0, "put after end"
        self.parts.append(value.reshape(-1).tolist())

    def end(self):
        self.ends += 1


@pytest.mark.parametrize("path", ["one call", "per layer", "torch", "sampled"])
def test_a_streamer_gets_the_prompt_then_each_token_then_end(path):
    """As transformers' generate feeds a streamer (TextStreamer): the prompt, each new token alone as it is decided,
    end() once; on every path a token can take (the one C call per token, the per-layer C step, the torch path,
    sampling), and at the end token where decoding stops there."""
    model, ids = _model(FAMILIES["llama"]()), _prompt()
    sparsify_(model, min_weights=0)
    decoder = LeanDecoder(model, one_call=path == "one call", fused=path != "torch")
    assert decoder.one_call == (path == "one call") and decoder.fused == (path != "torch")
    sampled = dict(do_sample=True) if path == "sampled" else {}
    streamer = _Recorder()
    torch.manual_seed(0)
    out = decoder.generate(ids, 12, streamer=streamer, **sampled)
    assert streamer.parts[0] == ids[0].tolist() and streamer.ends == 1
    assert all(len(part) == 1 for part in streamer.parts[1:]) and sum(streamer.parts, []) == out[0].tolist()
    eos, streamer = int(out[0, ids.shape[1] + 4]), _Recorder()
    torch.manual_seed(0)
    out = decoder.generate(ids, 12, eos, streamer=streamer, **sampled)
    assert sum(streamer.parts, []) == out[0].tolist() and out[0, -1] == eos and streamer.ends == 1


@pytest.mark.parametrize("fused", [True, False])
def test_sampled_decoding_draws_generates_tokens(fused):
    model = _model(FAMILIES["llama"]())
    model.generation_config.eos_token_id = None  # every draw counts: no stop and no end token held back
    sparse = copy.deepcopy(model)
    sparsify_(sparse, min_weights=0)
    ids, decoder = _prompt(), LeanDecoder(sparse, fused=fused)
    greedy = decoder.generate(ids, 24)
    # flat distributions, with transformers' default top_k of 50 where none is given, and top-p alone
    for settings in ({"temperature": 8.0}, {"temperature": 8.0, "top_k": 30, "top_p": 0.95},
                     {"top_k": 0, "top_p": 0.6}):
        torch.manual_seed(3)
        with torch.inference_mode():
            want = model.generate(ids, max_new_tokens=24, do_sample=True, **settings)
        torch.manual_seed(3)
        assert torch.equal(decoder.generate(ids, 24, do_sample=True, **settings), want)
    assert not torch.equal(want, greedy)  # the flatter draws leave the greedy path
    torch.manual_seed(3)
    assert torch.equal(decoder.generate(ids, 24, do_sample=True, top_k=1), greedy)
    for bad, message in (({"temperature": 0}, r"temperature is a number > 0 \(do_sample=False for greedy "
                                                r"decoding\), got 0"),
                         ({"top_k": -1}, r"top_k is a number of tokens ≥ 0 \(0 or None: no top-k\), got -1"),
                         ({"top_p": 1.5}, r"top_p is a probability in \(0, 1\] \(1 or None: no top-p\), got 1.5")):
        with pytest.raises(ValueError, match=f"^{message}$"):
            decoder.generate(ids, 4, do_sample=True, **bad)


def test_decoding_stops_after_the_end_token():
    model, ids = _model(FAMILIES["llama"]()), _prompt()
    tokens = LeanDecoder(model).generate(ids, 12)
    eos = int(tokens[0, 13])
    stopped = LeanDecoder(model).generate(ids, 12, eos_token_id=eos)
    first = int((tokens[0, 10:] == eos).nonzero()[0]) + 11
    assert torch.equal(stopped, tokens[:, :first])


def test_what_it_does_not_run_is_refused_in_one_line():
    gemma = _model(transformers.Gemma3TextConfig(**{**SMALL, "hidden_activation": "relu"}, head_dim=8,
                                                 use_bidirectional_attention=True))
    with pytest.raises(ValueError, match=r"^LeanDecoder does not run Gemma3ForCausalLM, which attends both "
                                         r"ways \(not a causal decoder\): use its generate\(\) instead$"):
        LeanDecoder(gemma)
    llama = _model(FAMILIES["llama"]())
    layer = llama.model.layers[1]
    layer.forward = lambda *args, forward=layer.forward, **kwargs: forward(*args, **kwargs) + 1.0
    with pytest.raises(ValueError, match=r"^LeanDecoder does not run LlamaForCausalLM, which gives other "
                                         r"logits on a probe prompt than this decoder \(by .* of their scale\): use "
                                         r"its generate\(\) instead$"):
        LeanDecoder(llama)
    with pytest.raises(ValueError, match=r"^LeanDecoder does not run GPT2LMHeadModel, which has no "
                                         r"model.layers and lm_head: use its generate\(\) instead$"):
        LeanDecoder(transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2)))
    with pytest.raises(ValueError, match=r"^LeanDecoder does not run CohereForCausalLM, which scales its logits by a "
                                         r"number ≤ 0: use its generate\(\) instead$"):  # argmax: not the model's
        LeanDecoder(_model(transformers.CohereConfig(**SMALL, logit_scale=-0.25, pad_token_id=0)))
    decoder = LeanDecoder(_model(FAMILIES["llama"]()), max_length=16)
    with pytest.raises(ValueError, match=r"^LeanDecoder decodes one sequence: input_ids of shape \(1, T ≥ 1\), got "
                                         r"\(2, 10\)$"):
        decoder.generate(torch.zeros(2, 10, dtype=torch.long), 4)
    with pytest.raises(ValueError, match=r"^the prompt's 10 tokens and 8 new ones exceed the decoder's max_length "
                                         r"16: build it with a larger max_length$"):
        decoder.generate(_prompt(), 8)
    with pytest.raises(ValueError, match=r"^max_new_tokens is a number of tokens ≥ 0, got -1$"):
        decoder.generate(_prompt(), -1)
    with pytest.raises(ValueError, match=r"^max_length is a number of tokens ≥ 2, got 1$"):
        LeanDecoder(_model(FAMILIES["llama"]()), max_length=1)


INT8_FAMILIES = ("llama", "qwen3", "phi3", "gemma2", "glm", "granite")  # stacked q/k/v, norms after, pairs, scales


@pytest.mark.parametrize("family", INT8_FAMILIES)
def test_int8_attention_in_c_is_its_torch_path_and_costs_what_its_rounding_costs(family):
    """The C step over the attention's int8 rows gives the torch path's logits over the same rows dequantized (they
    differ by the inputs' rounding to 16 bits: far below the probe's tolerance) and its greedy tokens; against the
    float32 model the int8 rows change the logits by a quantization's amount, measured: the logits stay close."""
    model = _model(FAMILIES[family]())
    sparse = copy.deepcopy(model)
    assert sparsify_(sparse, min_weights=0)
    ids = _prompt()
    fused, torch_path = LeanDecoder(sparse, int8_attention=True), LeanDecoder(sparse, int8_attention=True, fused=False)
    assert fused.fused and fused.int8
    def next_logits(decoder):  # the prompt by the torch path, then one step by the decoder's own
        keys, values = decoder._cache(12), decoder._cache(12)
        decoder._forward(ids, 0, keys, values)
        return decoder._logits(decoder._forward(ids[:, -1:], 10, keys, values))[0]

    with torch.inference_mode():
        assert torch.equal(fused.generate(ids, 16), torch_path.generate(ids, 16))
        ours, theirs = next_logits(fused), next_logits(torch_path)
        assert (ours - theirs).abs().max() <= 1e-4 * theirs.abs().max()
        float_logits = next_logits(LeanDecoder(sparse, fused=False))
    assert torch.nn.functional.cosine_similarity(float_logits, ours, dim=0) > 0.99


def test_int8_attention_is_read_in_float_where_its_input_is_not_finite():
    """A NaN in the hidden state cannot be rounded to 16 bits: the C step reads the float32 rows, which carry it."""
    model = _model(FAMILIES["llama"]())
    decoder = LeanDecoder(model, int8_attention=True)
    with torch.no_grad():
        model.model.embed_tokens.weight[3, 0] = float("nan")
    decoder.refresh()
    keys, values = decoder._cache(4), decoder._cache(4)
    with torch.inference_mode():
        decoder._forward(torch.tensor([[1, 2]]), 0, keys, values)
        hidden = decoder._forward(torch.tensor([[3]]), 2, keys, values)
    assert torch.isnan(hidden).all()
