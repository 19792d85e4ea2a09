"""4-bit rows (lambda_gelu.inference.int4) and the sparse gated block that reads them (SparseGatedMLP(int4=True)):
the format's rounding, the C kernels against their float64 reference in both builds, decoding in one call, and what
the block refuses."""
import copy

import pytest
import torch

from lambda_gelu import _native
from lambda_gelu.inference import int4 as q4
from lambda_gelu.inference.decoder import LeanDecoder
from lambda_gelu.inference.gated import sparse_gated_int4_reference
from lambda_gelu.inference.sparse import sparsify_

transformers = pytest.importorskip("transformers")
needs_kernels = pytest.mark.skipif(_native.library() is None, reason="no C compiler here")
SIZES = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=100, max_position_embeddings=64)
FAMILIES = {
    "llama": lambda: transformers.LlamaConfig(**SIZES, hidden_act="relu"),
    "llama-mlp-bias": lambda: transformers.LlamaConfig(**SIZES, hidden_act="relu", mlp_bias=True),
    "gemma3": lambda: transformers.Gemma3TextConfig(**SIZES, head_dim=16, sliding_window=6, hidden_activation="relu"),
    # rows of three blocks: the AVX2 loop's pair of blocks, then one alone
    "llama-odd-blocks": lambda: transformers.LlamaConfig(**dict(SIZES, hidden_size=96), hidden_act="relu"),
    # rows of six blocks: four of them summed side by side take three pairs of blocks each
    "llama-six-blocks": lambda: transformers.LlamaConfig(**dict(SIZES, hidden_size=192), hidden_act="relu"),
}


def _model(family="llama", shift=-0.01):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(FAMILIES[family]()).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate_proj.weight.add_(shift)  # most gates negative: a sparse ReLU gate
            for layer_ in (layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj):
                if layer_.bias is not None:
                    layer_.bias.normal_(0.0, 0.1)
    return model


def test_each_weight_is_within_half_its_blocks_step_and_the_codes_are_packed_as_documented():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(40, 96, generator=g) * torch.rand(40, 1, generator=g)  # rows of different scales
    w[3, 32:64] = 0.25  # a constant block
    w[5] = 0.0  # a row of zeros
    w[6, :32], w[8, 40] = -torch.rand(32, generator=g), 0.0  # a block below 0, a lone zero
    q, s = q4.quantize(w)
    assert q.dtype == torch.uint8 and q.shape == (40, q4.row_bytes(96)) == (40, 48 + 6)
    back = q4.dequantize(q, s, 96, torch.float64)
    a, z = q[:, 48:51].double(), q[:, 51:54].double()
    step = (a * s.double()[:, None]).repeat_interleave(q4.BLOCK, 1)
    assert ((back - w.double()).abs() <= step / 2 * (1 + 1e-12)).all()
    assert torch.equal(back[w == 0], torch.zeros_like(back[w == 0]))  # 0 on every block's grid
    assert torch.equal(back[5], torch.zeros(96, dtype=torch.float64))
    assert z.max() <= 15 and z[6, 0] == 15 and z[3, 1] == 0  # all codes below 0; all above it
    # byte i of a block: code i in its low nibble, code i + 16 in its high one
    codes = torch.round(w.double()[7, :32] / (s.double()[7] * a[7, 0])) + z[7, 0]
    assert torch.equal((q[7, :16] & 15).double(), codes[:16]) and torch.equal((q[7, :16] >> 4).double(), codes[16:])


def test_a_fine_tuning_of_weights_on_a_min_to_max_grid_is_kept():
    """Weights quantized once from each block's smallest to its largest (llama.cpp's Q4_1, as a converted model's
    source GGUF holds them), then moved by a tenth of a step: on a grid through 0 most of that move survives the
    4-bit rows (a grid re-found from the block's extremes rounds nearly all of it away)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(256, 576, generator=g, dtype=torch.float64) * 0.1
    blocks = w.reshape(256, -1, 32)
    lo, span = blocks.amin(2, keepdim=True), (blocks.amax(2, keepdim=True) - blocks.amin(2, keepdim=True)) / 15
    source = (lo + torch.round((blocks - lo) / span) * span).reshape(w.shape)
    move = torch.randn(w.shape, generator=g, dtype=torch.float64) * span.repeat_interleave(32, 2).reshape(w.shape) / 10
    back = q4.dequantize(*q4.quantize(source + move), 576, torch.float64)
    assert float(((back - source) * move).sum() / (move * move).sum()) > 0.6


def test_what_4_bit_rows_cannot_hold_is_refused():
    with pytest.raises(ValueError, match="whole blocks of 32"):
        q4.quantize(torch.randn(4, 40))
    with pytest.raises(ValueError, match="NaN or an infinity"):
        q4.quantize(torch.tensor([[float("nan")] + [0.0] * 31]))
    model = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(
        **dict(SIZES, hidden_size=48, head_dim=12), hidden_act="relu")).eval()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match="not both multiples"):
        sparsify_(model, min_weights=0, int4=True)
    assert all(type(layer.mlp).__name__ == "LlamaMLP" for layer in model.model.layers)  # nothing half-replaced
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match="not both"):
        sparsify_(model, int8=True, int4=True)


def _bound(x, q, parts):
    """Float rounding of the 4-bit block over its dequantized weights and x rounded to int8 (as the kernels take it):
    the gate and up values are exact integer sums rounded once, the outputs sums of ff float32 products; a gate near 0
    may land on either side of it. So (d + ff)·u times the sums of the terms' magnitudes, as for the int8 block."""
    w = {n: q4.dequantize(q[f"{n}_q"], q[f"{n}_s"], d, torch.float64)
         for n, d in (("gate", x.shape[-1]), ("up", x.shape[-1]), ("down", parts[2].out_features))}
    b = {n: 0.0 if layer.bias is None else layer.bias.detach().double().abs()
         for n, layer in zip(("gate", "up", "down"), parts)}
    xq, t = q4.int8_rows(x)
    ax = (t * xq).abs()
    d, ff = x.shape[-1], w["gate"].shape[0]
    gate, up = ax @ w["gate"].abs().t() + b["gate"], ax @ w["up"].abs().t() + b["up"]
    return 4 * (d + ff) * 2 ** -23 * ((gate * up) @ w["down"].abs() + b["down"]) + 1e-7


def _reference(mlp, dense, x, round_inputs=True):
    exact = {k: v.double() if v.is_floating_point() else v for k, v in mlp._buffers.items()}
    parts = [copy.deepcopy(layer).double() for layer in (dense.gate_proj, dense.up_proj, dense.down_proj)]
    return sparse_gated_int4_reference(x.double(), exact, *parts, round_inputs)


@needs_kernels
def test_symmetric_rows_clip_nothing_on_either_side_and_sparsify_takes_them_off_4_bit_grids():
    """Steps of a block's largest magnitude over 7: every weight within half a step, the zero code 8, a block whose
    extremes are equal and opposite held exactly. sparsify_ takes them for a model whose FFN weights sit on no 4-bit
    grid and grids through 0 for one whose weights were quantized to 4 bits and fine-tuned a little since."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(40, 96, generator=g) * torch.rand(40, 1, generator=g)
    w[2, :2], w[5] = torch.tensor([1.5, -1.5]), 0.0
    q, s = q4.quantize(w, symmetric=True)
    back = q4.dequantize(q, s, 96, torch.float64)
    a, z = q[:, 48:51].double(), q[:, 51:54].double()
    step = (a * s.double()[:, None]).repeat_interleave(q4.BLOCK, 1)
    assert ((back - w.double()).abs() <= step / 2 * (1 + 1e-12)).all() and (z == 8).all()
    assert abs(float(back[2, 0]) - 1.5) < 1e-3 and abs(float(back[2, 1]) + 1.5) < 1e-3
    assert torch.equal(back[5], torch.zeros(96, dtype=torch.float64))
    assert all(m.mlp.symmetric for m in _sparse4(_model()).model.layers)
    assert not any(m.mlp.symmetric for m in _sparse4(_on_4bit_grids(_model())).model.layers)


def _on_4bit_grids(model):
    """The FFNs' weights quantized from each block's smallest weight to its largest in 15 steps (a Q4_1 GGUF's), then
    moved by a tenth of a step."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for layer in model.model.layers:
            for linear in (layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj):
                blocks = linear.weight.reshape(-1, q4.BLOCK)
                lo, hi = blocks.amin(1, keepdim=True), blocks.amax(1, keepdim=True)
                span = (hi - lo) / 15
                grid = lo + torch.round((blocks - lo) / span) * span
                moved = grid + torch.randn(blocks.shape, generator=g) * span / 10
                linear.weight.copy_(moved.reshape(linear.weight.shape))
    return model


def _sparse4(model):
    assert sparsify_(model, min_weights=0, int4=True)
    return model


@pytest.mark.parametrize("isa", _native.ISAS)
@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("gridded", [False, True], ids=["symmetric", "through-0"])
def test_the_4_bit_block_is_its_float64_reference_within_rounding_in_both_builds(family, isa, gridded, monkeypatch):
    """The AVX2 loops (native) and the plain ones (the baseline build) against the same float64 reference: their
    integer sums are the same, the rest within float rounding; one row (decoding) and a batch, on two threads; rows
    on steps over 7 (random weights) and on grids through 0 (weights on 4-bit grids)."""
    model = _on_4bit_grids(_model(family)) if gridded else _model(family)
    dense = copy.deepcopy(model)
    kernels = _native.Kernels(isa)
    monkeypatch.setattr(_native, "library", lambda: kernels)
    monkeypatch.setattr(_native, "GRAIN", 1)  # both threads, their partial sums added
    assert sparsify_(model, min_weights=0, int4=True) == ["model.layers.0.mlp", "model.layers.1.mlp"]
    g, d = torch.Generator().manual_seed(2), model.config.hidden_size
    for x in (torch.randn(1, 1, d, generator=g), torch.randn(3, 5, d, generator=g)):
        for mlp, ref in ((m.mlp, d.mlp) for m, d in zip(model.model.layers, dense.model.layers)):
            assert mlp.int4 and mlp._screened is not None and mlp.up_q.dtype == torch.uint8
            assert mlp.symmetric != gridded
            with torch.inference_mode():
                got, want = mlp(x), ref(x)
            exact = _reference(mlp, ref, x)
            assert ((got.double() - exact).abs() <= _bound(x, mlp._buffers, (ref.gate_proj, ref.up_proj,
                                                                              ref.down_proj))).all()
            # the weights' rounding to 4 bits: each weight within half a step of 1/15 of its block's range, for
            # these random rows about 9% of their rms (the gate's and up's errors compound in the output: ~14%)
            assert (got - want).norm() <= 0.3 * want.norm()


@needs_kernels
def test_the_4_bit_block_carries_a_nan_or_an_infinity_and_sums_unrounded_inputs_when_told():
    model = _model()
    dense = copy.deepcopy(model.model.layers[0].mlp)
    sparsify_(model, min_weights=0, int4=True)
    mlp = model.model.layers[0].mlp
    x = torch.randn(2, 64)
    x[1, 3] = float("inf")
    with torch.inference_mode():
        got, want = mlp(x), dense(x)
    assert torch.equal(got.isfinite(), want.isfinite()) and got[0].isfinite().all() and not got[1].isfinite().all()
    torch.testing.assert_close(got, _reference(mlp, dense, x).float(), rtol=1e-4, atol=1e-5, equal_nan=True)
    # its inputs rounded to int8, a change of an ulp can move an input across a rounding boundary, a jump; unrounded
    # (a decoder's probe), the block is a continuous function of x and is its reference without the rounding
    x = torch.randn(4, 64)
    mlp.round_inputs = False
    with torch.inference_mode():
        smooth = mlp(x)
    torch.testing.assert_close(smooth.double(), _reference(mlp, dense, x, round_inputs=False), rtol=1e-4, atol=1e-5)
    mlp.round_inputs = True
    with torch.inference_mode():
        rounded = mlp(x)
    assert not torch.equal(smooth, rounded)


@needs_kernels
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_one_call_decodes_4_bit_ffns_as_the_per_layer_path(family):
    """The whole token in one C call reads the 4-bit rows as the per-layer path does: the same greedy tokens, and
    with the FFNs' inputs unrounded (rounded to 8 bits, an input an ulp away crosses a boundary and jumps a step:
    the decoder's probe compares them so too) logits within the rounding of the prompt's attention inputs to 16 bits
    (the one call's prompt rows go through the C step's int8 rows, the per-layer decoder's through torch's products,
    as in test_hf_decode's int8 attention); the decoder's probe leaves every block rounding its inputs again."""
    model = _model(family)
    sparsify_(model, min_weights=0, int4=True)
    one, per_layer = (LeanDecoder(model, int8_attention=True, one_call=c) for c in (True, False))
    assert one.one_call and not per_layer.one_call
    assert all(layer.mlp.round_inputs for layer in model.model.layers)
    ids = torch.randint(0, 100, (1, 7), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        assert torch.equal(one.generate(ids, 12), per_layer.generate(ids, 12))
        for layer in model.model.layers:
            layer.mlp.round_inputs = False
        one.refresh(), per_layer.refresh()
        keys, values = one._cache(9), one._cache(9)
        pkeys, pvalues = per_layer._cache(9), per_layer._cache(9)
        one._forward(ids, 0, keys, values)
        per_layer._forward(ids, 0, pkeys, pvalues)
        nxt = ids[:, -1:]
        ours = one._logits(one._forward(nxt, 7, keys, values))[0]
        theirs = per_layer._logits(per_layer._forward(nxt, 7, pkeys, pvalues))[0]
    assert (ours - theirs).abs().max() <= 1e-4 * theirs.abs().max()
