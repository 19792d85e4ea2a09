"""`lambda-gelu export DIR --gguf FILE`: a converted Llama written as GGUF is computed — by transformers' GGUF reader,
which like llama.cpp fixes the Llama FFN's activation as SiLU — as the ReLU model: its logits within the bound the
hardness gives and its greedy tokens, in float32; quantized types within their own rounding. Written plainly (λ = 1),
the same file gives other tokens: the fault the hardness fixes. The same for a converted Gemma 3, whose FFN both
readers fix as tanh-GELU."""
import json
import os

import numpy as np
import pytest
import safetensors.torch
import torch

from lambda_gelu.cli import main
from lambda_gelu.deploy.gguf import GELU_GAP, SILU_GAP, export_gguf, gguf_lambda, llama_cpp_model, symmetric_blocks
from lambda_gelu.inference.int4 import on_4bit_grids

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def relu_llama(tmp_path_factory):
    """A small converted Llama (hidden_act relu) with a byte-level BPE tokenizer, and a prompt's ids."""
    import tiny_gguf
    path = tmp_path_factory.mktemp("export") / "llama-relu"
    tokenizer = tiny_gguf.bpe_tokenizer()
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=len(tiny_gguf.vocabulary()[0]), hidden_size=64, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, hidden_act="relu", max_position_embeddings=128,
        eos_token_id=0, pad_token_id=1, bos_token_id=2)).eval()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    ids = tokenizer("Return the number of items in a container.", return_tensors="pt")["input_ids"]
    return path, model, ids


@pytest.fixture(scope="module")
def relu_gemma3(tmp_path_factory):
    """A small converted Gemma 3 (hidden_activation relu) as llama.cpp's gemma3 graph fixes the layout: every sixth
    layer global, the local ones sliding over 16 positions at rotary base 10000, queries scaled by 1/√head_dim."""
    import tiny_gguf
    path = tmp_path_factory.mktemp("export") / "gemma3-relu"
    tokenizer = tiny_gguf.bpe_tokenizer()
    torch.manual_seed(0)
    model = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
        vocab_size=len(tiny_gguf.vocabulary()[0]), hidden_size=64, intermediate_size=256, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=256, query_pre_attn_scalar=256, sliding_window=16,
        hidden_activation="relu", max_position_embeddings=128, eos_token_id=0, pad_token_id=1, bos_token_id=2)).eval()
    with torch.no_grad():  # norms' weights, 0 at initialisation: 1 + w must be written as llama.cpp reads it
        for name, w in model.named_parameters():
            if "norm" in name:
                w.add_(0.3 * torch.randn(w.shape, generator=torch.Generator().manual_seed(1)))
        model.lm_head.weight.mul_(10)  # tied to the embedding: sharper logits, greedy tokens far from ties
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    ids = tokenizer("Return the number of items in a container.", return_tensors="pt")["input_ids"]
    return path, model, ids


def _read(path):
    gguf_model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).eval()
    return gguf_model


def _greedy(model, ids, n=24):
    with torch.inference_mode():
        return model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)[0].tolist()


def test_float32_export_is_the_relu_model_within_its_bound(relu_llama, capsys):
    directory, model, ids = relu_llama
    out = directory.parent / "m.gguf"
    assert main(["export", str(directory), "--gguf", str(out)]) == 0
    assert "λ = 1024" in capsys.readouterr().err
    back = _read(out)
    assert back.config.hidden_act == "silu"  # the reader computes SiLU gates, as llama.cpp does
    with torch.no_grad():
        want, got = model(ids).logits, back(ids).logits
    # each FFN unit is off by at most SILU_GAP/λ·|up|; through two layers and the head, far below the logits' scale
    assert float((got - want).abs().max()) <= 50 * SILU_GAP / 1024 * float(want.abs().max())
    assert _greedy(back, ids) == _greedy(model, ids)


def test_written_plainly_the_same_file_is_another_model(relu_llama):
    directory, model, ids = relu_llama
    out = directory.parent / "plain.gguf"
    export_gguf(directory, out, "f32", hardness=1)
    with torch.no_grad():
        want = model(ids).logits
        gap = float((_read(out)(ids).logits - want).abs().max())
    assert gap > 100 * SILU_GAP / 1024 * float(want.abs().max())


# Q4_1's step is a block's range over 15 where Q8_0's is its largest magnitude over 127: some 8 times coarser
@pytest.mark.parametrize("file_type, tolerance", [("f16", 0.01), ("q8_0", 0.03), ("q4_0", 0.25), ("q4_1", 0.25)])
def test_quantized_exports_stay_within_their_own_rounding(relu_llama, file_type, tolerance):
    directory, model, ids = relu_llama
    exported = export_gguf(directory, directory.parent / f"m-{file_type}.gguf", file_type)
    with torch.no_grad():
        want, got = model(ids).logits, _read(exported.path)(ids).logits
    assert float((got - want).abs().max()) <= tolerance * float(want.abs().max()) + exported.bound
    assert not exported.symmetric  # random weights, on no 4-bit grid: Q4_0 as llama.cpp quantizes it
    if file_type == "q4_1":  # the embedding (here also the output layer) as llama.cpp's quantizer keeps it
        from gguf import GGUFReader
        types = {t.name: t.tensor_type.name for t in GGUFReader(str(exported.path)).tensors}
        assert types["token_embd.weight"] == "Q8_0" and types["blk.0.ffn_gate.weight"] == "Q4_1"


def test_symmetric_blocks_clip_nothing_and_keep_a_fine_tuning_of_a_4bit_source():
    """Every weight within half its block's step, where llama.cpp's Q4_0 clips the largest weight of the other sign
    at 7 of its 8 steps, and the same values in Q4_1; a model quantized by llama.cpp's Q4_0 or Q4_1 then moved by a
    tenth of a step, as a conversion from such a GGUF fine-tunes it, keeps most of that move (llama.cpp's own
    quantizer finds the source's steps again and keeps little of it); on_4bit_grids finds such weights on their
    grids, and random ones off them."""
    gguf = pytest.importorskip("gguf")
    types = gguf.GGMLQuantizationType
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.1, (256, 576)).astype(np.float32)
    w[0, :32], w[1, :2] = 0, (1.0, -1.0)  # a block of zeros; one with two extremes of opposite signs
    blocks = symmetric_blocks(w, "Q4_0")
    assert blocks.shape == gguf.quants.quantize(w, types.Q4_0).shape
    ours = gguf.quants.dequantize(blocks, types.Q4_0)
    assert np.array_equal(gguf.quants.dequantize(symmetric_blocks(w, "Q4_1"), types.Q4_1), ours)
    theirs = gguf.quants.dequantize(gguf.quants.quantize(w, types.Q4_0), types.Q4_0)
    step = blocks.reshape(-1, 18)[:, :2].copy().view(np.float16)[:, 0].astype(np.float64)
    assert (np.abs(ours - w).reshape(-1, 32).max(1) <= step * 0.501).all() and (ours[0, :32] == 0).all()
    assert abs(ours[1, 1] + 1) < 1e-3 and abs(theirs[1, 1] + 1) > 0.1  # -1 clipped at -7/8 by llama.cpp's rule

    for kind in (types.Q4_0, types.Q4_1):
        source = gguf.quants.dequantize(gguf.quants.quantize(w, kind), kind)
        blocks = source.reshape(-1, 32)
        steps = np.where(kind == types.Q4_0, np.abs(blocks).max(1) / 8, np.ptp(blocks, 1) / 15)
        move = (rng.standard_normal(w.shape) * steps.repeat(32).reshape(w.shape) / 10).astype(np.float32)

        def kept(quantize):
            back = gguf.quants.dequantize(quantize(source + move), kind)
            return float(((back - source) * move).sum() / (move * move).sum())

        assert kept(lambda v: symmetric_blocks(v, kind.name)) > 0.6
        assert kept(lambda v: gguf.quants.quantize(v, kind)) < 0.2
        assert on_4bit_grids([source + move]) > 0.9
    assert on_4bit_grids([w]) < 0.01 and on_4bit_grids([np.zeros_like(w), w]) < 0.01  # zeros tell nothing


@pytest.mark.parametrize("file_type", ["q4_0", "q4_1"])
def test_a_checkpoint_on_4bit_grids_is_written_on_steps_over_7(relu_llama, tmp_path, file_type):
    """A checkpoint whose weights sit on Q4_0's grids, a little moved (a conversion of a Q4_0 file), exports with
    :func:`symmetric_blocks`, within 4 bits' rounding of the model; the random model of the other tests, on no grid,
    as llama.cpp's own quantizer writes it."""
    gguf = pytest.importorskip("gguf")
    from gguf import GGUFReader
    kind = gguf.GGMLQuantizationType[file_type.upper()]
    directory, model, ids = relu_llama
    plain = export_gguf(directory, tmp_path / "plain.gguf", file_type)
    written = {t.name: t for t in GGUFReader(str(plain.path)).tensors}["blk.0.attn_v.weight"]
    want = gguf.quants.quantize(model.model.layers[0].self_attn.v_proj.weight.detach().numpy(), kind)
    assert not plain.symmetric and np.array_equal(np.asarray(written.data).reshape(want.shape), want)

    gridded = transformers.LlamaForCausalLM.from_pretrained(directory).eval()
    rng = np.random.default_rng(1)
    with torch.no_grad():
        for name, p in gridded.named_parameters():
            if p.ndim == 2 and "embed" not in name and "lm_head" not in name:
                w = p.numpy()
                grid = gguf.quants.dequantize(gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_0),
                                              gguf.GGMLQuantizationType.Q4_0)
                step = np.abs(w).reshape(-1, 32).max(1).repeat(32).reshape(w.shape) / 8
                p.copy_(torch.from_numpy(grid + (rng.standard_normal(w.shape) * step / 10).astype(np.float32)))
    gridded.save_pretrained(tmp_path / "gridded")
    for f in directory.iterdir():
        if f.name.startswith("tokenizer") or f.name.endswith(".jinja"):
            (tmp_path / "gridded" / f.name).write_bytes(f.read_bytes())
    exported = export_gguf(tmp_path / "gridded", tmp_path / "g.gguf", file_type)
    assert exported.symmetric and "over 7" in exported.summary()
    written = {t.name: t for t in GGUFReader(str(exported.path)).tensors}["blk.0.attn_v.weight"]
    want = symmetric_blocks(gridded.model.layers[0].self_attn.v_proj.weight.detach().numpy(), kind.name)
    assert np.array_equal(np.asarray(written.data).reshape(want.shape), want)
    with torch.no_grad():
        want_logits, got = gridded(ids).logits, _read(exported.path)(ids).logits
    assert float((got - want_logits).abs().max()) <= 0.25 * float(want_logits.abs().max()) + exported.bound


def test_the_hardness_keeps_every_type_in_range():
    rng = np.random.default_rng(0)
    gates, scaled = [rng.normal(0, 0.05, (256, 64))], [rng.normal(0, 0.05, (64, 256))]
    assert gguf_lambda(gates, scaled, "f32") == 1024
    assert gguf_lambda([g * 100 for g in gates], scaled, "f16") < 1024  # a gate of ±20 ×1024 would overflow f16
    q8 = gguf_lambda(gates, [w * 1e-3 for w in scaled], "q8_0")
    blocks = np.abs(scaled[0] * 1e-3).reshape(-1, 32).max(1) / 127
    assert np.quantile(blocks, 0.01) / np.sqrt(q8) >= 6.1e-5 or q8 == 16


def test_what_cannot_be_exported_is_one_line_and_writes_nothing(relu_llama, tmp_path, capsys):
    directory, model, ids = relu_llama
    mine = tmp_path / "mine.gguf"
    mine.write_text("my file")
    assert main(["export", str(directory), "--gguf", str(mine)]) == 2
    assert "exists" in capsys.readouterr().err and mine.read_text() == "my file"
    silu = tmp_path / "silu"
    config = json.loads((directory / "config.json").read_text())
    silu.mkdir()
    for f in directory.iterdir():
        (silu / f.name).write_bytes(f.read_bytes())
    (silu / "config.json").write_text(json.dumps(config | {"hidden_act": "silu"}))
    assert main(["export", str(silu), "--gguf", str(tmp_path / "x.gguf")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and "not a converted checkpoint" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.gguf", "silu"]  # nothing half-written left
    (silu / "config.json").write_text(json.dumps(config))
    weights = safetensors.torch.load_file(silu / "model.safetensors")
    weights["model.layers.0.self_attn.o_proj.weight"][3, 5] = float("nan")
    safetensors.torch.save_file(weights, silu / "model.safetensors", metadata={"format": "pt"})
    assert main(["export", str(silu), "--gguf", str(tmp_path / "x.gguf"), "--type", "q4_1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and "o_proj.weight holds a NaN or an infinity" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.gguf", "silu"]


def test_llama_cpp_decodes_the_export_with_the_relu_models_tokens(relu_llama, tmp_path):
    """llama.cpp itself (llama-cpp-python, the [llamacpp] extra), greedy: the float32 export gives the ReLU model's
    tokens; the plain file does not."""
    directory, model, ids = relu_llama
    want = _greedy(model, ids)[ids.shape[1]:]
    assert _llama_cpp_greedy(export_gguf(directory, tmp_path / "relu.gguf", "f32").path, ids, len(want)) == want
    plain = export_gguf(directory, tmp_path / "plain.gguf", "f32", hardness=1).path
    assert _llama_cpp_greedy(plain, ids, len(want)) != want


def test_llama_cpp_decodes_an_export_with_gate_thresholds_as_the_relu_model(relu_llama, tmp_path):
    """A --gate-zeros conversion's gates have biases (lowered thresholds): llama.cpp's llama layout reads them, the
    gate's ×λ and up's ×1/√λ with their weights, down's as it is, and gives the ReLU model's greedy tokens."""
    directory, _, ids = relu_llama
    biased = tmp_path / "biased"
    config = json.loads((directory / "config.json").read_text()) | {"mlp_bias": True}
    torch.manual_seed(1)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{
        k: v for k, v in config.items() if k not in ("architectures", "transformers_version")})).eval()
    with torch.no_grad():
        for layer in model.model.layers:  # a threshold well below 0 (most units zero), and biases on up and down
            layer.mlp.gate_proj.bias.fill_(-0.05)
            layer.mlp.up_proj.bias.normal_(0, 0.05)
            layer.mlp.down_proj.bias.normal_(0, 0.05)
    model.save_pretrained(biased)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (biased / f).write_bytes((directory / f).read_bytes())
    want = _greedy(model, ids)[ids.shape[1]:]
    assert _llama_cpp_greedy(export_gguf(biased, tmp_path / "relu.gguf", "f32").path, ids, len(want)) == want


def _llama_cpp_greedy(path, ids, n):
    """llama.cpp's greedy tokens after the prompt ``ids`` from the GGUF file at ``path`` (skips without it)."""
    pytest.importorskip("llama_cpp")
    llm = llama_cpp_model(path, 128, 2)
    out = []
    for token in llm.generate(ids[0].tolist(), top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0):
        out.append(token)
        if len(out) == n:
            break
    return out


def test_gemma3_float32_export_is_the_relu_model_within_its_bound(relu_gemma3):
    """transformers' reader computes Gemma 3's gates as tanh-GELU, as llama.cpp does: the export at λ gives the ReLU
    model's logits within GELU_GAP/λ a unit, and its greedy tokens past the 16-position window."""
    directory, model, ids = relu_gemma3
    exported = export_gguf(directory, directory.parent / "gemma3.gguf", "f32")
    assert exported.architecture == "gemma3" and exported.hardness == 1024
    back = _read(exported.path)
    assert back.config.hidden_activation == "gelu_pytorch_tanh"
    with torch.no_grad():
        want, got = model(ids).logits, back(ids).logits
    assert float((got - want).abs().max()) <= 50 * GELU_GAP / 1024 * float(want.abs().max())
    assert _greedy(back, ids) == _greedy(model, ids)


def test_a_gemma3_llama_cpp_computes_otherwise_is_refused_in_one_line(relu_gemma3, tmp_path, capsys):
    directory, _, _ = relu_gemma3
    other = tmp_path / "other"
    other.mkdir()
    for f in directory.iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    config = json.loads((directory / "config.json").read_text())
    (other / "config.json").write_text(json.dumps(config | {"query_pre_attn_scalar": 128}))
    assert main(["export", str(other), "--gguf", str(tmp_path / "x.gguf")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and "1/√128" in err
    assert not (tmp_path / "x.gguf").exists()


def test_llama_cpp_decodes_the_gemma3_export_with_the_relu_models_tokens(relu_gemma3, tmp_path):
    """llama.cpp's gemma3 graph (its GELU, its windows, its 1 + w norms) on the float32 export: the ReLU model's
    greedy tokens, past the window; the plain file's are others."""
    directory, model, ids = relu_gemma3
    want = _greedy(model, ids)[ids.shape[1]:]
    assert _llama_cpp_greedy(export_gguf(directory, tmp_path / "relu.gguf", "f32").path, ids, len(want)) == want
    plain = export_gguf(directory, tmp_path / "plain.gguf", "f32", hardness=1).path
    assert _llama_cpp_greedy(plain, ids, len(want)) != want
