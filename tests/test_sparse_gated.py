"""Gated FFNs (SwiGLU, GeGLU) of tiny random Llama and Gemma 3 configs: reluize keeps the function at λ = 1,
ends in exact ReLU that plain transformers reloads with no GELU or SiLU left, and the sparse block equals the
dense one within a bound from the arithmetic, falling back to dense where the batch's units are too many."""
import copy
import warnings

import pytest
import torch
import torch.nn as nn

import lambda_gelu as lg
from lambda_gelu.reluize import AnnealedGELU
from lambda_gelu.inference.sparse import sparsify_
from lambda_gelu.inference.gated import FUSED_ROWS, PROMPT_ROWS, SparseGatedMLP, sparse_gated_reference, unit_rows

transformers = pytest.importorskip("transformers")
SMALL = dict(hidden_size=32, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
             vocab_size=100, max_position_embeddings=64)
FAMILIES = {
    "llama": lambda **kw: transformers.LlamaConfig(**SMALL, **kw),
    "qwen2": lambda **kw: transformers.Qwen2Config(**SMALL, **kw),
    "gemma3": lambda **kw: transformers.Gemma3TextConfig(**SMALL, head_dim=16, sliding_window=16, **kw),
    "llama-mlp-bias": lambda **kw: transformers.LlamaConfig(**SMALL, mlp_bias=True, **kw),
}


def _model(family, **kw):
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(FAMILIES[family](**kw)).eval()


def _batches(n=4):
    g = torch.Generator().manual_seed(1)
    return [{"input_ids": torch.randint(0, 100, (2, 12), generator=g),
             "attention_mask": torch.ones(2, 12, dtype=torch.long)} for _ in range(n)]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_reluize_keeps_the_function_at_lambda_one_and_ends_in_a_relu_checkpoint(family, tmp_path):
    model, batch = _model(family), _batches(1)[0]
    with torch.no_grad():
        before = model(**batch).logits
        annealed = copy.deepcopy(model)  # what the anneal's first step runs: each gate g as x ↦ g(λx)/λ at λ = 1
        assert len(lg.replace_modules_(annealed, lambda m, fqn: lg.is_reluizable(m), AnnealedGELU)) == 2
        assert torch.equal(annealed(**batch).logits, before)
        hardening = copy.deepcopy(model)  # and the λ layers a training run hardens, at λ = 1
        convert = lg.convert_to_lambda_gelu_ if family == "gemma3" else lg.convert_to_lambda_silu_
        assert len(convert(hardening, init_lambda=1.0)) == 2
        if family == "gemma3":  # GeGLU's tanh GELU against λ-GELU's exact Φ: within 4.7e-4 per activation
            torch.testing.assert_close(hardening(**batch).logits, before, rtol=0, atol=1e-3)
        else:
            assert torch.equal(hardening(**batch).logits, before)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # its config can say ReLU: no warning
        result = lg.reluize(model, _batches(), steps=4, schedule="anneal")
    assert result.loss == "logits-kl" and len(result.replaced) == 2
    assert not any(lg.is_reluizable(m) for m in model.modules())
    model.save_pretrained(tmp_path)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert not any(lg.is_reluizable(m) for m in reloaded.modules())
    assert sum(isinstance(m, nn.ReLU) for m in reloaded.modules()) == 2
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**batch).logits, model(**batch).logits)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_swap_with_the_refit_solves_the_gated_output_projection(family):
    model = _model(family)
    original = copy.deepcopy(model)
    batches = _batches()
    result = lg.reluize(model, batches, steps=1, refit=2, lr=0.0)
    assert result.refit == ["model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"]
    swapped = copy.deepcopy(original)
    lg.to_relu_(swapped, include_gelu=True)
    with torch.no_grad():
        target = original(**batches[0]).logits
        refit_error = (model(**batches[0]).logits - target).pow(2).mean()
        swap_error = (swapped(**batches[0]).logits - target).pow(2).mean()
    assert refit_error < swap_error  # the least squares brings the ReLU network closer than the bare swap


def _relu_llama(family="llama", shift=-0.01):
    model = _model(family, **({"hidden_activation": "relu"} if family == "gemma3" else {"hidden_act": "relu"}))
    with torch.no_grad():
        for layer in model.model.layers:
            mlp = layer.mlp
            mlp.gate_proj.weight.add_(shift)  # most gate outputs negative: a sparse ReLU gate
            for bias in (p.bias for p in (mlp.gate_proj, mlp.up_proj, mlp.down_proj) if p.bias is not None):
                bias.normal_(0.0, 0.1)  # where the layers have biases (mlp_bias), nonzero ones
    return model


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_sparse_block_equals_the_dense_one_within_float_rounding(family):
    model = _relu_llama(family)
    dense = copy.deepcopy(model)
    assert sparsify_(model, min_weights=0) == ["model.layers.0.mlp", "model.layers.1.mlp"]
    for x in (torch.randn(1, 1, 32), torch.randn(3, 5, 32)):
        for sparse_mlp, dense_mlp in ((m.mlp, d.mlp) for m, d in zip(model.model.layers, dense.model.layers)):
            assert isinstance(sparse_mlp, SparseGatedMLP)
            with torch.inference_mode():
                got, want = sparse_mlp(x), dense_mlp(x)
                dense_mlp.double()
                exact = dense_mlp(x.double())
                # each output is a sum of ff products of float32 terms: its rounding is bounded by ff·u·Σ|terms|
                g, u = torch.relu(dense_mlp.gate_proj(x.double())), dense_mlp.up_proj(x.double())
                dense_mlp.float()
            bound = 96 * 2 ** -23 * ((g * u).abs() @ dense_mlp.down_proj.weight.double().abs().t()) + 1e-7
            assert ((got.double() - exact).abs() <= 4 * bound).all()
            assert ((want.double() - exact).abs() <= 4 * bound).all()
            sparse_mlp.sparse = False  # every unit computed: the baseline
            with torch.inference_mode():
                every_unit = sparse_mlp(x)
            sparse_mlp.sparse = True
            assert ((every_unit.double() - exact).abs() <= 4 * bound).all()
    tokens = {"input_ids": torch.randint(0, 100, (1, 6))}
    with torch.inference_mode():
        torch.testing.assert_close(model(**tokens).logits, dense(**tokens).logits, rtol=1e-5, atol=1e-5)
        sparse_ids = model.generate(**tokens, max_new_tokens=5, do_sample=False)
        dense_ids = dense.generate(**tokens, max_new_tokens=5, do_sample=False)
    assert torch.equal(sparse_ids, dense_ids)


def test_llama4s_ffn_and_shared_expert_are_replaced_and_decode_the_dense_models_tokens():
    """Llama 4 names its gate's activation ``activation_fn``: its dense layers' FFN and each mixture's shared expert
    are gated blocks of their own layout (its routed experts, one batched product over every expert, stay dense)."""
    torch.manual_seed(0)
    config = transformers.Llama4TextConfig(**SMALL, intermediate_size_mlp=96, head_dim=16, hidden_act="relu",
                                           num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2,
                                           pad_token_id=0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    dense = copy.deepcopy(model)
    replaced = sparsify_(model, min_weights=0)
    assert replaced == ["model.layers.0.feed_forward", "model.layers.1.feed_forward.shared_expert"]
    tokens = {"input_ids": torch.randint(0, 100, (1, 6))}
    with torch.inference_mode():
        torch.testing.assert_close(model(**tokens).logits, dense(**tokens).logits, rtol=1e-5, atol=1e-5)
        sparse_ids = model.generate(**tokens, max_new_tokens=5, do_sample=False)
        assert torch.equal(sparse_ids, dense.generate(**tokens, max_new_tokens=5, do_sample=False))


@pytest.mark.parametrize("config, auto", [("ModernBertConfig", "AutoModel"),
                                          ("ModernBertDecoderConfig", "AutoModelForCausalLM")])
def test_modernberts_bundled_ffn_is_replaced_and_gives_the_dense_models_outputs(config, auto):
    """ModernBERT's FFN (``Wo(act(input) * gate)``, ``input`` and ``gate`` the halves of ``Wi``'s output), as GeGLU
    encoders and their decoder keep it, once its activation is ReLU: a bundled gated block, biases included."""
    torch.manual_seed(0)
    config = getattr(transformers, config)(hidden_size=32, intermediate_size=96, num_hidden_layers=2,
                                           num_attention_heads=2, vocab_size=100, hidden_activation="relu",
                                           mlp_bias=True, pad_token_id=0)
    model = getattr(transformers, auto).from_config(config).eval()
    with torch.no_grad():
        for m in model.modules():
            if hasattr(m, "Wi"):
                m.Wi.bias[:96].sub_(0.5)  # most units of the gate's half inactive
    dense = copy.deepcopy(model)
    assert len(sparsify_(model, min_weights=0)) == 2
    assert all(isinstance(m.mlp, SparseGatedMLP) for m in (model.model if auto != "AutoModel" else model).layers)
    for n in (1, 6, 12):
        tokens = {"input_ids": torch.randint(1, 100, (1, n))}
        with torch.inference_mode():
            torch.testing.assert_close(model(**tokens)[0], dense(**tokens)[0], rtol=1e-5, atol=1e-5)


def test_t5s_gated_ffn_is_a_layout_of_its_own_and_its_sparse_block_equals_the_dense_one():
    """Flan-T5's, mT5's and UMT5's gated FFN (``wo(act(wi_0(x)) * wi_1(x))``) once its gate is ReLU: every block of
    both stacks replaced, the state dict the dense model's, the logits and the greedy tokens the dense model's."""
    torch.manual_seed(0)
    config = transformers.T5Config(d_model=32, d_ff=96, num_layers=2, num_heads=2, d_kv=16, vocab_size=100,
                                   feed_forward_proj="gated-relu", decoder_start_token_id=0)
    model = transformers.T5ForConditionalGeneration(config).eval()
    dense = copy.deepcopy(model)
    assert sparsify_(model, min_weights=0) == [f"{stack}.block.{i}.layer.{j}.DenseReluDense"
                                               for stack, j in (("encoder", 1), ("decoder", 2)) for i in range(2)]
    assert all(isinstance(block.layer[-1].DenseReluDense, SparseGatedMLP)
               for block in (*model.encoder.block, *model.decoder.block))
    assert model.state_dict().keys() == dense.state_dict().keys()
    g = torch.Generator().manual_seed(2)
    tokens = {"input_ids": torch.randint(0, 100, (1, 6), generator=g),
              "decoder_input_ids": torch.randint(0, 100, (1, 4), generator=g)}
    with torch.inference_mode():
        torch.testing.assert_close(model(**tokens).logits, dense(**tokens).logits, rtol=1e-5, atol=1e-5)
        ids = tokens["input_ids"]
        assert torch.equal(model.generate(input_ids=ids, max_new_tokens=5, do_sample=False),
                           dense.generate(input_ids=ids, max_new_tokens=5, do_sample=False))


@pytest.mark.parametrize("family", ["phi3", "glm4"])
def test_a_bundled_gate_up_layer_is_read_in_its_two_halves_and_the_sparse_block_equals_the_dense_one(family):
    """Phi-3's, Phi-4-mini's and GLM's gated FFN holds gate and up in one layer, ``gate_up_proj``, whose output its
    forward splits in two halves: the sparse block reads each half's rows where they are (the state dict the dense
    model's, a weight loaded into it followed), float32 and int8 each within their bound of their float64
    reference at decoding's single row and in a batch, the logits and greedy tokens the dense model's."""
    from lambda_gelu.inference.gated import gated_parts, sparse_gated_int8_reference
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(family, **SMALL, head_dim=16, hidden_act="relu", pad_token_id=0,
                                               bos_token_id=1, eos_token_id=2)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate_up_proj.weight[:96].add_(-0.01)  # the gate's half: most gate outputs negative
    dense, quantized = copy.deepcopy(model), copy.deepcopy(model)
    assert sparsify_(model, min_weights=0) == ["model.layers.0.mlp", "model.layers.1.mlp"]
    assert sparsify_(quantized, min_weights=0, int8=True) == ["model.layers.0.mlp", "model.layers.1.mlp"]
    assert model.state_dict().keys() == dense.state_dict().keys()
    for x in (torch.randn(1, 1, 32), torch.randn(3, 5, 32)):
        for sparse, int8, d in zip(model.model.layers, quantized.model.layers, copy.deepcopy(dense).model.layers):
            sparse, int8, d = sparse.mlp, int8.mlp, d.mlp.double()
            assert isinstance(sparse, SparseGatedMLP) and sparse.gate_up_proj is sparse._parts()[0].layer
            with torch.inference_mode():
                got, got_int8, exact = sparse(x), int8(x), d(x.double())
                gate, up = d.gate_up_proj(x.double()).chunk(2, dim=-1)
                exact_int8 = sparse_gated_int8_reference(
                    x.double(), {k: v.double() if v.is_floating_point() else v for k, v in int8._buffers.items()},
                    *gated_parts(d, int8.layout))
            bound = 96 * 2 ** -23 * ((torch.relu(gate) * up).abs() @ d.down_proj.weight.abs().t()) + 1e-7
            assert ((got.double() - exact).abs() <= 4 * bound).all()
            assert ((got_int8.double() - exact_int8).abs() <= _int8_bound(x, int8._buffers, int8._parts())).all()
    tokens = {"input_ids": torch.randint(0, 100, (1, 6))}
    with torch.inference_mode():
        torch.testing.assert_close(model(**tokens).logits, dense(**tokens).logits, rtol=1e-5, atol=1e-5)
        assert torch.equal(model.generate(**tokens, max_new_tokens=5, do_sample=False),
                           dense.generate(**tokens, max_new_tokens=5, do_sample=False))
        mlp, x = model.model.layers[0].mlp, torch.randn(1, 32)
        state = copy.deepcopy(mlp.state_dict())
        state["gate_up_proj.weight"][:96] *= -1  # a new gate half: the screen and the rows read are the new ones
        mlp.load_state_dict(state)
        gate, up = mlp.gate_up_proj(x).chunk(2, dim=-1)
        torch.testing.assert_close(mlp(x), mlp.down_proj(torch.relu(gate) * up), rtol=1e-5, atol=1e-6)


def test_a_dense_batch_runs_the_dense_block_and_the_reference_agrees():
    model = _relu_llama(shift=+0.05)  # most gate outputs positive
    mlp = model.model.layers[0].mlp
    dense = copy.deepcopy(mlp)
    sparsify_(model, min_weights=0)
    sparse = model.model.layers[0].mlp
    x = torch.randn(PROMPT_ROWS + 1, 32)  # more than a short prompt: over max_density, the dense block, bit for bit
    with torch.inference_mode():
        assert torch.equal(sparse(x), dense(x))
        for few in (x[:FUSED_ROWS], x[:PROMPT_ROWS]):  # decoding's and a short prompt's never fall back: the C loop
            torch.testing.assert_close(sparse(few), dense(few), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(sparse_gated_reference(x, dense.gate_proj, dense.up_proj, dense.down_proj),
                                   dense(x), rtol=1e-5, atol=1e-6)


def test_what_is_not_the_formula_or_not_a_relu_gate_is_left_dense():
    model = _relu_llama()
    model.model.layers[1].mlp.register_forward_hook(lambda *a: None)  # a hook the replacement would drop
    assert sparsify_(model, min_weights=0) == ["model.layers.0.mlp"]
    silu = _model("llama")
    with pytest.raises(ValueError, match="gated FFNs .* whose gate is an nn.ReLU"):
        sparsify_(silu, min_weights=0)
    with pytest.raises(RuntimeError, match="for inference"):
        model.model.layers[0].mlp(torch.randn(1, 32, requires_grad=True))


@pytest.fixture
def kernels():
    from lambda_gelu import _native
    library = _native.library()
    if library is None:
        pytest.skip(f"the C kernels could not be built here: {_native.error()}")
    torch.manual_seed(0)
    return library


@pytest.mark.parametrize("n", [3, 11])
def test_the_kernel_splits_the_units_over_threads_and_adds_their_partial_sums_exactly_enough(kernels, n):
    """grain 1 makes every call multi-threaded: each thread sums a share of the active units into a partial. At 11
    rows a unit's active rows are gathered four at a time from rows far apart (a short prompt's), the rest alone."""
    d, ff, out = 40, 200, 24
    x, up, down_t = torch.randn(n, d), torch.randn(ff, d), torch.randn(ff, out)
    g = torch.relu(torch.randn(n, ff) - 1.0)
    g[:, :4] = 1.0  # units active in every row, and units active in none
    g[:, 4:8] = 0.0
    y = torch.empty(n, out)
    up, down_t = unit_rows(up, down_t)  # as SparseGatedMLP holds them: a unit's rows side by side
    got = kernels.sparse_gated_f32(x.data_ptr(), g.data_ptr(), up.data_ptr(), None, down_t.data_ptr(), None,
                                   y.data_ptr(), n, d, ff, out, up.stride(0), ff, 2, 1)
    assert got == int((g != 0).any(0).sum())
    exact = (g.double() * (x.double() @ up.double().t())) @ down_t.double()
    bound = ff * d * 2 ** -23 * ((g.double() * (x.double().abs() @ up.double().abs().t())) @ down_t.double().abs())
    assert ((y.double() - exact).abs() <= 2 * bound + 1e-6).all()


def test_the_kernel_that_computes_the_gate_too_splits_its_units_over_threads_exactly_enough(kernels):
    n, d, ff, out = 2, 40, 200, 24
    x, gate = torch.randn(n, d), torch.randn(ff, d) - 0.1  # the gate read whole, as one matrix
    up, down_t = unit_rows(torch.randn(ff, d), torch.randn(ff, out))
    g, y = torch.empty(n, ff), torch.empty(n, out)
    got = kernels.sparse_gated_fused_f32(x.data_ptr(), gate.data_ptr(), None, up.data_ptr(), None, down_t.data_ptr(),
                                         None, g.data_ptr(), y.data_ptr(), n, d, ff, out, up.stride(0), ff, 0, 2, 1)
    exact_g = torch.relu(x.double() @ gate.double().t())
    assert ((g.double() - exact_g).abs() <= d * 2 ** -23 * (x.double().abs() @ gate.double().abs().t())).all()
    assert got == int((g != 0).any(0).sum())
    exact = (exact_g * (x.double() @ up.double().t())) @ down_t.double()
    gate_sum, up_sum = x.double().abs() @ gate.double().abs().t(), x.double().abs() @ up.double().abs().t()
    bound = (ff + d) * 2 ** -23 * ((gate_sum * up_sum) @ down_t.double().abs())
    assert ((y.double() - exact).abs() <= 2 * bound + 1e-6).all()


def _screened(kernels, x, gate, gate_b, up, down_t, max_threads=2, grain=1):
    from lambda_gelu.inference.gated import screen_rows
    (n, d), (ff, out) = x.shape, down_t.shape
    q, s, r, radius = screen_rows(gate)
    gate, up, down_t = unit_rows(gate, up, down_t)
    g, y = torch.empty(n, ff), torch.empty(n, out)
    got = kernels.sparse_gated_screened_f32(x.data_ptr(), gate.data_ptr(), gate_b.data_ptr(), q.data_ptr(),
                                            s.data_ptr(), r.data_ptr(), radius.data_ptr(), up.data_ptr(), None,
                                            down_t.data_ptr(), None, g.data_ptr(), y.data_ptr(), n, d, ff, out,
                                            gate.stride(0), max_threads, grain)
    return got, g, y


def test_the_screen_never_rules_out_a_positive_gate_even_within_its_margin(kernels):
    """Rows whose int8 rounding is as large as it can be and lies along x (its Cauchy–Schwarz bound met within a few
    percent), biases that put every gate within 1.5 times that rounding of 0: the screen must decide each one. Every
    gate it zeroes must be ≤ 0 exactly (within float32's own rounding of it), every other as float32 computes it."""
    from lambda_gelu.inference.gated import screen_rows
    n, d, ff, out = 2, 64, 602, 24  # units in blocks of four, and two more
    x = torch.randint(0, 2, (n, d)).float() * 2 - 1
    x[:, 0] = 0.0
    x[1] = x[0] * torch.where(torch.rand(d) < 0.9, 1.0, -1.0)  # a second row mostly along the first
    q = torch.randint(-126, 127, (ff, d)).float()
    q[:, 0] = 127.0  # each row's largest: its scale s exactly, where x is 0
    sign = torch.where(torch.rand(ff, 1) < 0.5, 1.0, -1.0)
    gate = (0.01 * (q + 0.45 * sign * x[0])).float()  # 0.45 of a step off, along x
    qs, s, *_ = screen_rows(gate)
    assert torch.equal(qs.float(), q)
    int8_error = ((gate.double() - s.double()[:, None] * q.double()) @ x[0].double()).abs()
    assert (int8_error >= 0.4 * 0.01 * 63).all()  # ≈ ‖rounding‖·‖x‖: the bound nearly met
    up, down_t = torch.randn(ff, d), torch.randn(ff, out)
    gate_b = (-(x[0].double() @ gate.double().t()) + 1.5 * int8_error * (2 * torch.rand(ff).double() - 1)).float()
    got, g, y = _screened(kernels, x, gate, gate_b, up, down_t)
    exact_v = x.double() @ gate.double().t() + gate_b.double()
    rounding = (d + 1) * 2 ** -23 * (x.double().abs() @ gate.double().abs().t() + gate_b.double().abs())
    decide = (exact_v[0] > rounding[0]) & (exact_v[0] < int8_error)  # positive, but int8 alone would say not
    assert decide.sum() > 50
    assert ((g.double() - exact_v.clamp(min=0)).abs() <= rounding).all()
    assert got == int((g != 0).any(0).sum())
    exact = exact_v.clamp(min=0) * (x.double() @ up.double().t()) @ down_t.double()
    bound = (ff + d) * 2 ** -23 * (((exact_v.abs() + rounding) * (x.double().abs() @ up.double().abs().t()))
                                   @ down_t.double().abs())
    assert ((y.double() - exact).abs() <= 2 * bound + 1e-6).all()


def test_the_screen_never_rules_out_a_positive_gate_within_what_rounding_x_to_int16_costs(kernels):
    """The kernel sums int8 rows times x rounded to int16 (x ≈ t·x̃, t = max|x| / 32767 here). Rows held exactly by
    int8 (no weight rounding at all) and lying along x − t·x̃, biases that put every gate within 1.5 times what that
    rounding moves it: the screen must still keep every positive gate."""
    from lambda_gelu.inference.gated import screen_rows
    n, d, ff, out = 1, 64, 402, 24
    x = torch.randn(n, d)
    t = x.double().abs().max() / 32767
    e = x.double() - t * torch.round(x.double() / t)  # what x loses as int16, as the kernel rounds it
    sign = torch.where(torch.rand(ff, 1) < 0.5, 1.0, -1.0).double()
    q = (torch.round(100 * e[0] / e.abs().max()) * sign + torch.randint(-20, 21, (ff, d))).clamp(-126, 126)
    q[:, 0] = 127.0
    gate = (q * 2.0 ** -7).float()  # exactly s·q with s = 2⁻⁷
    qs, s, r, _ = screen_rows(gate)
    assert torch.equal(qs.double(), q) and (s == 2.0 ** -7).all() and (r == 0).all()
    int16_error = ((gate.double() * e).sum(1)).abs()
    assert (int16_error >= 0.5 * gate.double().norm(dim=1) * e.norm()).all()  # the bound half met, or more
    up, down_t = torch.randn(ff, d), torch.randn(ff, out)
    gate_b = (-(x[0].double() @ gate.double().t()) + 1.5 * int16_error * (2 * torch.rand(ff).double() - 1)).float()
    got, g, y = _screened(kernels, x, gate, gate_b, up, down_t)
    exact_v = x.double() @ gate.double().t() + gate_b.double()
    rounding = (d + 1) * 2 ** -23 * (x.double().abs() @ gate.double().abs().t() + gate_b.double().abs())
    decide = (exact_v[0] > rounding[0]) & (exact_v[0] < int16_error)  # positive, but int16 x alone would say not
    assert decide.sum() > 50
    assert ((g.double() - exact_v.clamp(min=0)).abs() <= rounding).all()
    assert got == int((g != 0).any(0).sum())


def test_a_unit_the_screen_rules_out_is_never_read_and_a_non_finite_input_rules_out_none(kernels):
    from lambda_gelu.inference.gated import screen_rows
    n, d, ff, out = 1, 64, 300, 24
    x, gate, up, down_t = torch.randn(n, d), torch.randn(ff, d), torch.randn(ff, d), torch.randn(ff, out)
    gate_b = -(x.abs() @ gate.abs().t()).squeeze(0) * torch.rand(ff)  # gates of every sign, most far from 0
    got, g, y = _screened(kernels, x, gate, gate_b, up, down_t)
    exact_v = (x.double() @ gate.double().t() + gate_b.double()).squeeze(0)
    ruled_out = exact_v < -0.1 * x.norm() * gate.norm(dim=1)  # ten times the int8 rows' error, and more
    assert ruled_out.sum() > ff // 4
    q, s, r, radius = screen_rows(gate)
    poisoned, up_rows, down_rows = (w.clone() for w in (gate, up, down_t))
    for w in (poisoned, up_rows, down_rows):  # float32 rows a screened-out unit must not read (its screen is gate's)
        w[ruled_out] = float("nan")
    poisoned, up_rows, down_rows = unit_rows(poisoned, up_rows, down_rows)
    g2, y2 = torch.empty(n, ff), torch.empty(n, out)
    got2 = kernels.sparse_gated_screened_f32(x.data_ptr(), poisoned.data_ptr(), gate_b.data_ptr(), q.data_ptr(),
                                             s.data_ptr(), r.data_ptr(), radius.data_ptr(), up_rows.data_ptr(), None,
                                             down_rows.data_ptr(), None, g2.data_ptr(), y2.data_ptr(), n, d, ff, out,
                                             poisoned.stride(0), 2, 1)
    assert got2 == got and torch.equal(g2, g) and torch.equal(y2, y)
    for bad in (float("nan"), float("inf")):  # a norm or a margin that is not finite certifies nothing
        xb = x.clone()
        xb[0, 0] = bad
        _, screened, _ = _screened(kernels, xb, gate, gate_b, up, down_t)
        unscreened, y_unscreened = torch.empty(n, ff), torch.empty(n, out)
        rows = unit_rows(up, down_t)
        kernels.sparse_gated_fused_f32(xb.data_ptr(), gate.data_ptr(), gate_b.data_ptr(), rows[0].data_ptr(), None,
                                       rows[1].data_ptr(), None, unscreened.data_ptr(), y_unscreened.data_ptr(),
                                       n, d, ff, out, rows[0].stride(0), ff, 0, 2, 1)
        torch.testing.assert_close(screened, unscreened, rtol=0, atol=0, equal_nan=True)


def test_when_nothing_can_be_replaced_the_error_says_why_and_the_model_is_untouched():
    model = _relu_llama()
    with pytest.raises(ValueError, match=r"gated FFN\(s\) with a ReLU gate, but can replace none: "
                                         r"'model.layers.0.mlp' is smaller than min_weights"):
        sparsify_(model)  # the tiny blocks are under MIN_WEIGHTS
    assert not any(isinstance(m, SparseGatedMLP) for m in model.modules())


def test_a_projection_the_sparse_block_would_not_reproduce_keeps_its_block_dense():
    from torch.nn.utils import parametrize

    class Doubled(nn.Module):
        def forward(self, w):
            return 2 * w
    model = _relu_llama()
    parametrize.register_parametrization(model.model.layers[0].mlp.up_proj, "weight", Doubled())
    model.model.layers[1].mlp.down_proj.weight.data[0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"'model.layers.0.mlp' \(up_proj\) has a parametrization "
                                         r"\(torch.nn.utils.parametrize\), which SparseGatedMLP would not keep"):
        sparsify_(model, min_weights=0)


def _int8_bound(x, q, parts):
    """Float rounding of the int8 block, over its dequantized weights: each gate, up and output is a sum of d or ff
    float32 products (and the layer's bias; ``parts`` the gate, up and down layers), a gate near 0 may land on
    either side of it, so the bound is (d + ff)·u times the sums of the terms' magnitudes."""
    w = {n: q[f"{n}_q"].double() * q[f"{n}_s"].double()[:, None] for n in ("gate", "up")}
    w["down"] = q["down_q"].double() * q["down_s"].double()[None, :]  # downᵀ's rows, one scale an output
    b = {n: 0.0 if layer.bias is None else layer.bias.detach().double().abs()
         for n, layer in zip(("gate", "up", "down"), parts)}
    ax = x.double().abs()
    d, ff = x.shape[-1], w["gate"].shape[0]
    gate, up = ax @ w["gate"].abs().t() + b["gate"], ax @ w["up"].abs().t() + b["up"]
    return 4 * (d + ff) * 2 ** -23 * ((gate * up) @ w["down"].abs() + b["down"]) + 1e-7


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_int8_block_is_its_dequantized_reference_within_rounding_and_near_the_float_one(family, monkeypatch):
    from lambda_gelu import _native
    from lambda_gelu.inference.gated import sparse_gated_int8_reference
    model = _relu_llama(family)
    dense = copy.deepcopy(model)
    assert sparsify_(model, min_weights=0, int8=True) == ["model.layers.0.mlp", "model.layers.1.mlp"]
    monkeypatch.setattr(_native, "GRAIN", 1)  # every call on both threads: the partial sums are added too
    for x in (torch.randn(1, 1, 32), torch.randn(3, 5, 32)):
        for sparse_mlp, dense_mlp in ((m.mlp, d.mlp) for m, d in zip(model.model.layers, dense.model.layers)):
            assert sparse_mlp.int8 and sparse_mlp.up_q.dtype == torch.int8
            q = sparse_mlp._buffers
            with torch.inference_mode():
                got, want = sparse_mlp(x), dense_mlp(x)
                exact = sparse_gated_int8_reference(x.double(), {k: v.double() if v.is_floating_point() else v
                                                                 for k, v in q.items()},
                                                    *(m.double() for m in (dense_mlp.gate_proj, dense_mlp.up_proj,
                                                                           dense_mlp.down_proj)))
                dense_mlp.float()
                sparse_mlp.sparse = False
                every_unit = sparse_mlp(x)
                sparse_mlp.sparse = True
            bound = _int8_bound(x, q, (dense_mlp.gate_proj, dense_mlp.up_proj, dense_mlp.down_proj))
            assert ((got.double() - exact).abs() <= bound).all()
            assert ((every_unit.double() - exact).abs() <= bound).all()
            # the weights' rounding: at most half a step of 1/127 of each row's largest weight, far less on average
            assert (got - want).norm() <= 0.03 * want.norm()


def test_the_int8_blocks_up_and_down_rows_lie_side_by_side_and_the_kernels_read_them_by_their_stride():
    """Unit k's up row then its downᵀ row, one run of bytes; the kernels take the rows' stride, so two separate
    matrices with one stride give the very same sums, and rows with two strides go to the reference."""
    from lambda_gelu.inference.gated import sparse_gated_int8_reference, unit_stride
    model = _relu_llama()
    dense = copy.deepcopy(model.model.layers[0].mlp)
    sparsify_(model, min_weights=0, int8=True)
    mlp, x = model.model.layers[0].mlp, torch.randn(3, 32)
    up_q, down_q = mlp.up_q, mlp.down_q
    assert down_q.data_ptr() == up_q.data_ptr() + up_q.shape[1]
    assert unit_stride(up_q, down_q) == up_q.shape[1] + down_q.shape[1]
    with torch.inference_mode():
        side_by_side = [mlp(x[:1]), mlp(x)]  # decoding's one-pass call, and the batch's
        mlp._buffers["up_q"], mlp._buffers["down_q"] = up_q.clone(), down_q.clone()
        mlp._screened = mlp._int8_call()
        assert unit_stride(mlp.up_q, mlp.down_q) == 32 and mlp._screened is not None
        apart = [mlp(x[:1]), mlp(x)]
        mlp._buffers["down_q"] = down_q[:, :16]  # 16 wide, 32 apart: no stride both share
        assert unit_stride(mlp.up_q, mlp.down_q) is None and mlp._int8_call() is None
    for a, b in zip(side_by_side, apart):
        assert torch.equal(a, b)
    q = dict(mlp._buffers, down_q=down_q)
    reference = sparse_gated_int8_reference(x, q, dense.gate_proj, dense.up_proj, dense.down_proj)
    torch.testing.assert_close(side_by_side[1], reference, rtol=1e-4, atol=1e-5)


def test_the_float32_blocks_gate_up_and_down_rows_lie_side_by_side_and_the_kernels_read_them_by_their_stride():
    """Unit k's gate, up and downᵀ rows, one run of bytes (the screen leaves gate rows to read scattered too; a
    short prompt's call reads every gate row, from the layer's own weight); the kernels take the rows' stride, so
    three separate matrices with one stride give the very same sums — decoding's screened call, a short prompt's
    fused one, a longer batch's — and rows with two strides go to torch."""
    from lambda_gelu.inference.gated import unit_stride
    model = _relu_llama()
    dense = copy.deepcopy(model.model.layers[0].mlp)
    sparsify_(model, min_weights=0)
    mlp, x = model.model.layers[0].mlp, torch.randn(2 * PROMPT_ROWS, 32)
    rows = [mlp._buffers[n] for n in ("gate_rows", "up_rows", "down_t")]
    assert [r.data_ptr() for r in rows[1:]] == [rows[0].data_ptr() + 4 * 32, rows[0].data_ptr() + 4 * 2 * 32]
    assert unit_stride(*rows) == 3 * 32 and mlp._screened is not None

    def outputs():
        return [mlp(x[:1]), mlp(x[:PROMPT_ROWS]), mlp(x)]  # screened, fused, torch's gate
    with torch.inference_mode():
        side_by_side = outputs()
        for name, r in zip(("gate_rows", "up_rows", "down_t"), rows):
            mlp._buffers[name] = r.clone()
        mlp._screened = mlp._screened_call()
        assert unit_stride(mlp.gate_rows, mlp.up_rows, mlp.down_t) == 32 and mlp._screened is not None
        apart = outputs()
        mlp._buffers["down_t"] = torch.cat([rows[2], rows[2]], 1)  # 64 apart, the others 32: no stride all share
        assert mlp._screened_call() is None and not mlp._kernels_read_weights()
        mlp._buffers["down_t"] = rows[2].clone()
        reference = dense(x)
    for a, b in zip(side_by_side, apart):
        assert torch.equal(a, b)
    torch.testing.assert_close(side_by_side[2], reference, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "llama-mlp-bias"])
def test_the_int8_blocks_weights_are_each_layers_rows_quantized_downs_by_output(family):
    """What the int8 block computes with is quantize_rows of each layer's own weight — down's rows are its outputs,
    one scale each, held transposed for the kernels — so that a model with its weights so rounded (the benchmarks')
    has the int8 path's quality. Scaling each unit's downᵀ row instead cost SmolLM2 ×1.029 in held-out perplexity
    against ×0.999 this way."""
    from lambda_gelu.inference.int8 import quantize_rows
    model = _relu_llama(family)
    sparsify_(model, min_weights=0, int8=True)
    mlp = model.model.layers[0].mlp
    for name, layer in (("gate", mlp.gate_proj), ("up", mlp.up_proj), ("down", mlp.down_proj)):
        q, s = quantize_rows(layer.weight)
        held = getattr(mlp, f"{name}_q")
        assert torch.equal(held.t() if name == "down" else held, q) and torch.equal(getattr(mlp, f"{name}_s"), s)


def test_the_int8_block_carries_a_nan_or_an_infinity_in_x_as_the_dense_block_does():
    """Its integer sums take x rounded to 16 bits, which nothing non-finite rounds to: such a call sums in float."""
    from lambda_gelu.inference.gated import sparse_gated_int8_reference
    model = _relu_llama()
    dense = copy.deepcopy(model.model.layers[0].mlp)
    sparsify_(model, min_weights=0, int8=True)
    mlp = model.model.layers[0].mlp
    for bad in (float("nan"), float("inf")):
        x = torch.randn(2, 32)
        x[1, 3] = bad
        with torch.inference_mode():
            got, want = mlp(x), dense(x)
            reference = sparse_gated_int8_reference(x, mlp._buffers, dense.gate_proj, dense.up_proj, dense.down_proj)
        assert torch.equal(got.isfinite(), want.isfinite()) and not got[1].isfinite().all()
        torch.testing.assert_close(got, reference, rtol=1e-4, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("int8", [False, True])
def test_the_derived_weights_follow_load_state_dict_and_the_state_dict_is_the_dense_blocks(int8):
    model = _relu_llama()
    state = copy.deepcopy(model.state_dict())
    sparsify_(model, min_weights=0, int8=int8)
    assert model.state_dict().keys() == state.keys()
    mlp = model.model.layers[0].mlp
    x = torch.randn(2, 32)
    with torch.inference_mode():
        before = mlp(x)
        state["model.layers.0.mlp.down_proj.weight"] *= 2
        model.load_state_dict(state)
        torch.testing.assert_close(mlp(x), 2 * before, rtol=1e-5, atol=1e-6)
        mlp.load_state_dict(copy.deepcopy(mlp.state_dict()) | {"down_proj.weight": -mlp.down_proj.weight})
        torch.testing.assert_close(mlp(x), -2 * before, rtol=1e-5, atol=1e-6)
        if not int8:  # a new gate gets a new screen: the units it rules out are the new gate's
            mlp.load_state_dict(copy.deepcopy(mlp.state_dict()) | {"gate_proj.weight": -mlp.gate_proj.weight})
            want = mlp.down_proj(torch.relu(mlp.gate_proj(x)) * mlp.up_proj(x))
            torch.testing.assert_close(mlp(x), want, rtol=1e-5, atol=1e-6)
    assert ("int8=True" in repr(mlp)) == int8


def test_a_sparsified_model_copies_and_pickles_and_each_copy_reads_its_own_weights():
    import io
    model = _relu_llama()
    sparsify_(model, min_weights=0)
    x = torch.randint(0, 100, (1, 1))
    with torch.no_grad():
        before = model(x).logits
        twin = copy.deepcopy(model)
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
        for layer in model.model.layers:  # the original changes; its copies keep what they were made from
            layer.mlp.up_proj.weight.mul_(3)
        assert not torch.allclose(model(x).logits, before)
        torch.testing.assert_close(twin(x).logits, before, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(loaded(x).logits, before, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("int8", [False, True])
def test_the_derived_weights_follow_a_weight_changed_in_place_or_replaced(int8):
    model = _relu_llama("llama-mlp-bias")
    sparsify_(model, min_weights=0, int8=int8)
    mlp, x = model.model.layers[0].mlp, torch.randn(2, 32)
    tolerance = dict(rtol=2e-2, atol=2e-2) if int8 else dict(rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        mlp.gate_proj.weight.neg_()  # an optimizer's step, or a user's edit: a new gate, whose screen must be new
        mlp.down_proj.weight = nn.Parameter(2 * mlp.down_proj.weight)
        got, want = mlp(x), mlp.down_proj(torch.relu(mlp.gate_proj(x)) * mlp.up_proj(x))
        torch.testing.assert_close(got, want, **tolerance)
        for layer in (mlp.gate_proj, mlp.up_proj, mlp.down_proj):  # a bias alone replaced: the decoding call reads
            layer.bias = nn.Parameter(layer.bias + 1)                # the new one, not the address of the old
            got, want = mlp(x), mlp.down_proj(torch.relu(mlp.gate_proj(x)) * mlp.up_proj(x))
            torch.testing.assert_close(got, want, **tolerance)


def test_what_the_screen_rules_out_is_an_exact_zero_and_the_kernel_reads_only_what_it_leaves():
    """screened_in, the screen's reference: every unit it rules out has a gate ≤ 0 (in float64), and it rules some
    out; the C block computed from the units it leaves equals the block from all of them."""
    from lambda_gelu.inference.gated import screened_in
    model = _relu_llama()
    assert sparsify_(model, min_weights=0)
    mlp = model.model.layers[0].mlp
    x = torch.randn(6, 32, generator=torch.Generator().manual_seed(3))
    left = screened_in(mlp, x)
    gate = x.double() @ mlp.gate_proj.weight.double().t()
    if mlp.gate_proj.bias is not None:
        gate = gate + mlp.gate_proj.bias.double()
    assert (gate[~left] <= 0).all() and (~left).any() and left[gate > 0].all()


@pytest.mark.parametrize("n", [1, 6, 15])
def test_a_prompts_int8_projection_is_the_exact_integer_sum_scaled_once(kernels, n):
    """linear_i8, the prompt's attention over int8 rows: each output is s·t·(q·x̃) in double rounded once to float32,
    plus the bias, as the decoding step's projections give it (x̃: x rounded to 16 bits, int16_rows); a row of x that
    holds a NaN is summed in float and carries it; the torch reference differs by x's rounding alone."""
    from lambda_gelu.inference.int8 import int16_rows, linear_i8, quantize_rows
    g = torch.Generator().manual_seed(5)
    w, b = torch.randn(37, 64, generator=g), torch.randn(37, generator=g)
    q, s = quantize_rows(w)
    x = torch.randn(1, n, 64, generator=g) * 3
    xq, t = int16_rows(x[0])
    exact = ((s.double()[None, :] * t) * (xq @ q.double().t())).float() + b
    assert torch.equal(linear_i8(x, q, s, b)[0], exact)
    reference = torch.nn.functional.linear(x, q.float() * s[:, None], b)
    rounding = (x[0].double() - t * xq).abs() @ (q.double() * s.double()[:, None]).abs().t()  # |x − t·x̃|·|w|
    assert ((linear_i8(x, q, s, b) - reference)[0].abs().double() <= rounding + 64 * 2 ** -23 * (
        x[0].double().abs() @ (q.double() * s.double()[:, None]).abs().t()) + 1e-6).all()
    x[0, -1, 3] = float("nan")
    y = linear_i8(x, q, s, b)
    assert y[0, -1].isnan().all() and (n == 1 or not y[0, :-1].isnan().any())
