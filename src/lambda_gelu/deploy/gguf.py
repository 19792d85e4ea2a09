"""A converted checkpoint as a GGUF file that llama.cpp — and what is built on it — computes as the ReLU model
(``lambda-gelu export DIR --gguf FILE``; the ``[gguf]`` extra).

llama.cpp fixes a family's FFN activation by its architecture (the Llama family's ``silu(gate)·up``, Gemma 3's
``gelu(gate)·up``, tanh-approximated) and its own converter never reads ``hidden_act``: a ReLU Llama written as is
runs there silently as SiLU. The limit that makes λ-SiLU and λ-GELU ReLU, read backwards, fixes it without changing
llama.cpp: a gate f(z) = z·s(z) at hardness λ is ReLU within a bound,

    f(λg)/λ = g·s(λg),   |g·s(λg) − relu(g)| ≤ max_t |t·s(t) − relu(t)| / λ
                                              = 0.2785/λ (SiLU, s = σ), 0.1805/λ (llama.cpp's GELU: :data:`GELU_GAP`),

so the file holds the gate's weights ×λ and ``up``'s and ``down``'s ×1/√λ each: llama.cpp's ``down(f(gate)·up)`` is
then ``down(g·s(λg)·u)``, within that bound ·|u| of ``down(relu(g)·u)`` a unit. λ is the largest of :data:`LAMBDAS`
at which no weight of the file type leaves its range: float16 keeps the gate's largest weight ×λ far below its
maximum; Q8_0, Q4_0 and Q4_1 keep their blocks' float16 scales normal as well; float32 and bfloat16 take the
largest.

Written (:data:`ARCHITECTURES`, one row each): the Llama family's layout (``LlamaForCausalLM``,
``MistralForCausalLM``: llama.cpp's ``llama``, the query and key rows in its order of rotated pairs) and Gemma 3's
(``Gemma3ForCausalLM``: ``gemma3``, its norms' weights as 1 + w, its sliding and global layers as llama.cpp fixes
them — every sixth layer global, local layers' rotary base 10000, queries scaled by 1/√head_dim — which a checkpoint
must match), their hyper-parameters, and the tokenizer — the original GGUF's own ``tokenizer.*`` fields where the
conversion read one, else the checkpoint's byte-level BPE tokenizer with its merges, special tokens and chat template.
The Llama family's biases travel too (a ``--gate-zeros`` conversion's gate thresholds: the gate's ×λ, up's ×1/√λ,
down's as it is). Norms and biases stay float32; a matrix whose rows do not fill the type's blocks is float16; in the
4-bit types the embedding and the output layer are Q8_0, as llama.cpp's own quantizer writes them.

A conversion of a 4-bit GGUF is fine-tuned from weights on that file's grids, by less than a step, and llama.cpp's
own 4-bit quantizers find those grids again and round the fine-tuning away. Where most of a checkpoint's blocks sit
on a 4-bit grid (:func:`on_4bit_grids`), both 4-bit types are written on steps of a block's largest magnitude over 7
(:func:`symmetric_blocks`); elsewhere as llama.cpp writes them.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import CheckpointError
from ..families import gguf_architecture, gguf_classes
from ..hf.load import load, model_directory, quiet_transformers
from ..hf.save import REPORT
from ..inference.int4 import FROM_4BIT, SYMMETRIC, on_4bit_grids

__all__ = ["export_gguf", "Exported", "TYPES", "LAMBDAS", "SILU_GAP", "GELU_GAP", "ARCHITECTURES", "gguf_lambda",
           "llama_cpp_model", "symmetric_blocks"]

SILU_GAP = 0.27846454276  # max_t t·σ(−t): how far g·σ(λg) strays from relu(g), times λ
# max_t |t·Φ̃(t) − relu(t)| for the tanh approximation Φ̃ (0.170041), plus what llama.cpp's GELU adds below |t| = 10,
# where it reads a table at t rounded to float16 and returns float16 (its slope ≤ 1.13 times 10·2⁻¹¹, and 10·2⁻¹¹);
# beyond, it returns t or 0 exactly
GELU_GAP = 0.17005 + 1.13 * 10 * 2.0 ** -11 + 10 * 2.0 ** -11
LAMBDAS = (1024.0, 512.0, 256.0, 128.0, 64.0, 32.0, 16.0)  # the hardness tried, largest first
TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1")
_LEVELS = {"q8_0": 127.0, "q4_0": 8.0, "q4_1": 15.0}  # a block's largest magnitude over its float16 scale, at most
_F16_TINY, _F16_MAX = 6.104e-05, 65504.0  # float16's smallest normal and largest value
_IN_RANGE = 0.99  # the share of blocks whose float16 scale must stay normal after scaling
# the Llama family's tensors: GGUF name (per block where it has {}) → the module's weight in the transformers model
_LLAMA = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head",
          "blk.{}.attn_norm": "model.layers.{}.input_layernorm", "blk.{}.attn_q": "model.layers.{}.self_attn.q_proj",
          "blk.{}.attn_k": "model.layers.{}.self_attn.k_proj", "blk.{}.attn_v": "model.layers.{}.self_attn.v_proj",
          "blk.{}.attn_output": "model.layers.{}.self_attn.o_proj",
          "blk.{}.ffn_norm": "model.layers.{}.post_attention_layernorm",
          "blk.{}.ffn_gate": "model.layers.{}.mlp.gate_proj", "blk.{}.ffn_up": "model.layers.{}.mlp.up_proj",
          "blk.{}.ffn_down": "model.layers.{}.mlp.down_proj"}
_GEMMA3 = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head",
           "blk.{}.attn_norm": "model.layers.{}.input_layernorm", "blk.{}.attn_q": "model.layers.{}.self_attn.q_proj",
           "blk.{}.attn_k": "model.layers.{}.self_attn.k_proj", "blk.{}.attn_v": "model.layers.{}.self_attn.v_proj",
           "blk.{}.attn_output": "model.layers.{}.self_attn.o_proj",
           "blk.{}.attn_q_norm": "model.layers.{}.self_attn.q_norm",
           "blk.{}.attn_k_norm": "model.layers.{}.self_attn.k_norm",
           "blk.{}.post_attention_norm": "model.layers.{}.post_attention_layernorm",
           "blk.{}.ffn_norm": "model.layers.{}.pre_feedforward_layernorm",
           "blk.{}.post_ffw_norm": "model.layers.{}.post_feedforward_layernorm",
           "blk.{}.ffn_gate": "model.layers.{}.mlp.gate_proj", "blk.{}.ffn_up": "model.layers.{}.mlp.up_proj",
           "blk.{}.ffn_down": "model.layers.{}.mlp.down_proj"}


@dataclass(frozen=True)
class Architecture:
    """What llama.cpp's graph of an architecture fixes, as export writes for it."""
    tensors: dict[str, str]  # GGUF name (per block where it has {}) → the module's weight in the transformers model
    gap: float               # its gate's max_t |f(t) − relu(t)|: the bound at λ is gap/λ
    pairs: bool              # queries and keys rotated in neighbouring pairs: their rows permuted from transformers'
    norm_shift: float        # added to every norm's weight (Gemma's norms multiply by 1 + w; llama.cpp's by w)
    biases: bool             # it reads the projections' biases (a --gate-zeros conversion's gate thresholds)


# llama.cpp architecture → what it fixes; which transformers classes are written as which: the families table
ARCHITECTURES = {"llama": Architecture(_LLAMA, SILU_GAP, pairs=True, norm_shift=0.0, biases=True),
                 "gemma3": Architecture(_GEMMA3, GELU_GAP, pairs=False, norm_shift=1.0, biases=False)}


@dataclass
class Exported:
    path: Path
    file_type: str
    hardness: float                # λ the gate is written at (1: the model's own activation, as it is)
    bound: float                   # gap/λ: how far llama.cpp's gate at λ is from relu(g), per unit of |up|
    architecture: str = "llama"    # llama.cpp's
    symmetric: bool = False        # 4-bit blocks on steps of their largest magnitude over 7 (symmetric_blocks)

    def summary(self) -> str:
        gate = "SiLU" if self.architecture == "llama" else "GELU"
        steps = " (its weights sit on 4-bit grids: steps of a block's largest magnitude over 7)" * self.symmetric
        return (f"{self.path}: {self.file_type}{steps}, {self.architecture}, the ReLU gates as llama.cpp's {gate} at "
                f"λ = {self.hardness:g} (each unit within {self.bound:.2g}·|up| of ReLU)")


def export_gguf(directory: str | os.PathLike, path: str | os.PathLike, file_type: str = "f32", *,
                overwrite: bool = False, hardness: float | None = None) -> Exported:
    """Write the converted causal LM in ``directory`` to the GGUF file ``path`` as the module's docstring says.
    ``hardness``: λ itself (default: chosen for ``file_type``); 1 writes the gates as they are, which llama.cpp
    computes as SiLU (for comparison only)."""
    try:
        import gguf
    except ImportError:
        raise CheckpointError("export to GGUF needs the gguf package: pip install 'lambda-gelu[gguf]'") from None
    if file_type not in TYPES:
        raise CheckpointError(f"--type must be one of {', '.join(TYPES)}, got {file_type!r}")
    target = Path(path)
    if target.exists() and (not overwrite or not target.is_file()):
        raise CheckpointError(f"{path} exists: choose another file, or add --overwrite to replace it"
                              if target.is_file() else f"{path} exists and is not a file")
    if not target.absolute().parent.is_dir():
        raise CheckpointError(f"{target.absolute().parent} is not a directory: the GGUF file goes into one")
    quiet_transformers()
    loaded = load(model_directory(str(directory)), str(directory), progress=False)
    model, config = loaded.model.float().eval(), loaded.model.config
    architecture = gguf_architecture(type(model).__name__)
    if architecture not in ARCHITECTURES:
        raise CheckpointError(f"{directory} holds a {type(model).__name__}: export writes "
                              f"{', '.join(gguf_classes())} for now")
    activation = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None)
    if activation != "relu":
        raise CheckpointError(f"{directory}'s gates are {activation}, not ReLU: it is not a converted "
                              "checkpoint; convert it first (lambda-gelu reluize MODEL --out DIR)")
    if not ARCHITECTURES[architecture].biases and (getattr(config, "mlp_bias", False)
                                                   or getattr(config, "attention_bias", False)):
        raise CheckpointError(f"{directory} has biases in its FFN or attention (mlp_bias, attention_bias), which "
                              f"llama.cpp's {architecture} layout does not read: it cannot be exported as this model")
    if architecture == "gemma3" and (problem := _gemma3_problem(config)):
        raise CheckpointError(f"{directory}'s Gemma 3 {problem}, which llama.cpp fixes otherwise: it cannot be "
                              "exported as this model")
    arch = ARCHITECTURES[architecture]
    names = arch.tensors
    state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    if bad := next((k for k, v in state.items() if not np.isfinite(v).all()), None):
        raise CheckpointError(f"{directory}'s {bad} holds a NaN or an infinity: no file type holds it as a weight")
    gates = [state[f"model.layers.{i}.mlp.gate_proj.weight"] for i in range(config.num_hidden_layers)]
    ups = [state[f"model.layers.{i}.mlp.{p}_proj.weight"] for i in range(config.num_hidden_layers)
           for p in ("up", "down")]
    lam = gguf_lambda(gates, ups, file_type) if hardness is None else float(hardness)
    if not (math.isfinite(lam) and lam >= 1):
        raise CheckpointError(f"the hardness λ must be a finite number ≥ 1, got {hardness!r}")

    tensors = [(f"{base.format(i)}.{part}", key, base, part) for base, hf_name in names.items()
               for i in (range(config.num_hidden_layers) if "{}" in base else [None]) for part in ("weight", "bias")
               if (key := f"{hf_name.format(i)}.{part}") in state]  # not lm_head tied to the embedding
    symmetric = file_type in ("q4_0", "q4_1") and on_4bit_grids(
        [state[key] for name, key, _, _ in tensors if _kind(name, state[key], file_type, gguf) in ("Q4_0", "Q4_1")]
    ) >= FROM_4BIT

    tmp = Path(tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.absolute().parent)[1])
    try:
        writer = gguf.GGUFWriter(str(tmp), architecture)
        _hyperparameters(writer, config, architecture, file_type, gguf)
        _tokenizer(writer, loaded, directory, gguf)
        for name, key, base, part in tensors:
            _add(writer, name, _written(state[key], base, part, arch, config, lam), file_type, gguf, symmetric)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return Exported(target, file_type, lam, arch.gap / lam, architecture, symmetric)


def llama_cpp_model(path: str | os.PathLike, n_ctx: int = 512, threads: int | None = None, **options):
    """The GGUF file at ``path`` loaded in llama.cpp (``llama_cpp.Llama``, given ``options`` too; the ``[llamacpp]``
    extra) with its extra weight buffers off: llama.cpp's AMX buffers stop some Intel CPUs with an illegal instruction,
    and ``Llama`` takes no option for them (it ignores keywords it does not know), so its default model parameters
    are set so for the call; the plain CPU kernels run everywhere."""
    import llama_cpp
    import llama_cpp.llama_cpp as low
    defaults = low.llama_model_default_params

    def without_extra_buffers():
        params = defaults()
        if hasattr(params, "use_extra_bufts"):
            params.use_extra_bufts = False
        return params
    low.llama_model_default_params = without_extra_buffers
    try:
        return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, n_threads=threads,
                               n_threads_batch=threads, verbose=False, **options)
    finally:
        low.llama_model_default_params = defaults


def _rope_theta(config, kind: str | None = None) -> float:
    """The rotary base of the config's layers (of ``kind``: Gemma 3's "full_attention" or "sliding_attention"), the
    kind's own where the config keeps one (transformers 5's ``rope_parameters[kind]``, or Gemma 3's older
    ``rope_local_base_freq``) before the config's one base."""
    parameters = getattr(config, "rope_parameters", None) or {}
    own = parameters.get(kind) if kind is not None else None
    if isinstance(own, dict) and own.get("rope_theta") is not None:
        return float(own["rope_theta"])
    if kind == "sliding_attention" and getattr(config, "rope_local_base_freq", None) is not None:
        return float(config.rope_local_base_freq)
    return float(getattr(config, "rope_theta", None) or parameters.get("rope_theta", 10000.0))


def _gemma3_problem(config) -> str | None:
    """What of a Gemma 3 config llama.cpp's ``gemma3`` graph does not compute as transformers does (None: nothing)."""
    head_dim = config.head_dim
    pattern = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(config.num_hidden_layers)]
    full = (getattr(config, "rope_parameters", None) or {}).get("full_attention") or {}
    if config.query_pre_attn_scalar != head_dim:
        return f"scales its queries by 1/√{config.query_pre_attn_scalar:g}, not 1/√head_dim"
    if list(config.layer_types) != pattern:
        return "has global layers other than every sixth"
    if _rope_theta(config, "sliding_attention") != 10000.0:
        return "turns its local layers at a rotary base other than 10000"
    if full.get("rope_type", "default") != "default":
        return f"scales its rotary embedding ({full.get('rope_type')})"
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "attn_logit_softcapping", None):
        return "soft-caps its logits"
    return None


def _written(w: np.ndarray, name: str, part: str, arch: "Architecture", config, lam: float) -> np.ndarray:
    """A weight or bias as the file holds it: norms shifted as the architecture reads them, queries' and keys' rows
    in its rotation's order, the gate's ×λ and up's ×1/√λ (weight and bias), down's weight ×1/√λ (its bias, added
    after, as it is)."""
    if "norm" in name:
        return w + arch.norm_shift
    if name.endswith(("attn_q", "attn_k")) and arch.pairs:
        return _permute(w, config.num_attention_heads if name.endswith("attn_q") else config.num_key_value_heads)
    if name.endswith("ffn_gate"):
        return w * lam
    if name.endswith("ffn_up") or name.endswith("ffn_down") and part == "weight":
        return w / math.sqrt(lam)
    return w


def gguf_lambda(gates: list[np.ndarray], scaled: list[np.ndarray], file_type: str) -> float:
    """The largest of :data:`LAMBDAS` at which the gate weights ×λ and the ``scaled`` (``up``, ``down``) ×1/√λ stay
    in ``file_type``'s range (see the module's docstring)."""
    if file_type in ("f32", "bf16"):
        return LAMBDAS[0]
    gate_max = max(float(np.abs(g).max()) for g in gates)
    smallest = 1.0  # float16 itself: only the gate's largest weight can leave its range (a subnormal is exact enough)
    if file_type in _LEVELS:  # a block's scale, its largest magnitude over the type's top level, is float16
        level = _LEVELS[file_type]
        blocks = np.concatenate([np.abs(w).reshape(-1, 32).max(1) for w in scaled if w.shape[-1] % 32 == 0]
                                or [np.ones(1)])
        smallest = float(np.quantile(blocks[blocks > 0], 1 - _IN_RANGE)) / level if (blocks > 0).any() else 1.0
    for lam in LAMBDAS:
        if gate_max * lam <= _F16_MAX / 16 and smallest / math.sqrt(lam) >= _F16_TINY:
            return lam
    return LAMBDAS[-1]


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """A query's or key's rows in llama.cpp's order (each head's two rotary halves interleaved), as its converter."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _kind(name: str, w: np.ndarray, file_type: str, gguf) -> str:
    """The GGML type a tensor is written in: ``file_type``'s, but for what llama.cpp's quantizer keeps otherwise."""
    kind = file_type.upper()
    if w.ndim == 1:
        return "F32"  # norms and biases, as llama.cpp keeps them
    if kind in ("Q4_0", "Q4_1") and name in ("token_embd.weight", "output.weight"):
        return "Q8_0"  # the embedding and the output layer, as llama.cpp's quantizer keeps them in its 4-bit types
    if kind in ("Q8_0", "Q4_0", "Q4_1") and w.shape[-1] % gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]][0]:
        return "F16"  # rows that do not fill the type's blocks
    return kind


def _add(writer, name: str, w: np.ndarray, file_type: str, gguf, symmetric: bool = False) -> None:
    kind = gguf.GGMLQuantizationType[_kind(name, w, file_type, gguf)]
    data = np.ascontiguousarray(w, dtype=np.float32)
    if kind == gguf.GGMLQuantizationType.F32:
        writer.add_tensor(name, data)
    elif kind == gguf.GGMLQuantizationType.F16:
        writer.add_tensor(name, data.astype(np.float16))
    elif kind in (gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q4_1) and symmetric:
        writer.add_tensor(name, symmetric_blocks(data, kind.name), raw_dtype=kind)
    else:
        writer.add_tensor(name, gguf.quants.quantize(data, kind), raw_dtype=kind)


def symmetric_blocks(w: np.ndarray, kind: str = "Q4_0") -> np.ndarray:
    """``w`` (rows, d; d a multiple of 32) as GGUF blocks of ``kind`` Q4_0 (rows, d / 32 · 18 bytes: a float16 step
    d, then 32 4-bit codes q, the value d·(q − 8)) or Q4_1 (20 bytes: a float16 step d and offset m, then the codes,
    the value m + q·d; here m = −8·d, the same values): the step each block's largest magnitude over 7, so that codes
    −7..7 cover it on either side, none clipped, each weight rounded to its nearest code.

    llama.cpp's Q4_0 takes the step as the largest magnitude over 8 (that weight at −8 steps, the other sign clipped
    at +7), its Q4_1 spans a block from its smallest weight to its largest in 15 steps. From weights on a Q4_0 or Q4_1
    GGUF's grids fine-tuned by less than a step, as a conversion of such a file is, both find the source's steps
    again and round the fine-tuning away: SmolLM2 converted from Q4_1, 256 held-out sentences in llama.cpp, ×1.24
    its perplexity in their Q4_0 and ×1.36 in their Q4_1, ×1.12 on these steps (either type); converted from Q4_0,
    ×1.50 in their Q4_0, ×1.18 so. On weights off any grid theirs are the better (that conversion moved off its grids
    by noise: their Q4_0 ×1.29, Q4_1 ×1.14; these ×1.36), which is why export takes these only where
    :func:`on_4bit_grids` finds the checkpoint's weights on 4-bit grids."""
    blocks = np.ascontiguousarray(w, dtype=np.float64).reshape(-1, 32)
    step = (np.abs(blocks).max(1) / SYMMETRIC).astype(np.float16)  # GGUF's zero code is 8: the same grid
    exact = step.astype(np.float64)
    codes = np.clip(np.rint(blocks / np.where(exact > 0, exact, 1.0)[:, None]) + 8, 0, 15).astype(np.uint8)
    scales = step[:, None] if kind == "Q4_0" else np.stack([step, -8 * step], 1)  # 8·d: exact in float16
    return np.concatenate([scales.view(np.uint8), codes[:, :16] | (codes[:, 16:] << 4)], 1).reshape(w.shape[0], -1)


def _hyperparameters(writer, config, architecture: str, file_type: str, gguf) -> None:
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    if architecture == "gemma3":  # heads wider than hidden_size / heads; the local layers' window
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
        writer.add_sliding_window(config.sliding_window)
    writer.add_name(getattr(config, "_name_or_path", "") or "lambda-gelu ReLU model")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(_rope_theta(config, "full_attention" if architecture == "gemma3" else None))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                          "bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
                          "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0, "q4_1": gguf.LlamaFileType.MOSTLY_Q4_1}[file_type])
    if file_type in _LEVELS:
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def _tokenizer(writer, loaded, directory, gguf) -> None:
    """The original GGUF's tokenizer fields as they are, where the conversion read a GGUF file; else the
    checkpoint's byte-level BPE tokenizer."""
    source = _source(Path(directory))
    if source is not None and source.suffix.lower() == ".gguf" and source.is_file():
        reader = gguf.GGUFReader(str(source))
        for key, field in reader.fields.items():
            if key.startswith("tokenizer."):
                types = field.types
                writer.add_key_value(key, field.contents(), types[0], sub_type=types[1] if len(types) > 1 else None)
        return
    tokenizer = loaded.tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None)
    spec = json.loads(backend.to_str()) if backend is not None else {}
    if spec.get("model", {}).get("type") != "BPE" or "ByteLevel" not in json.dumps(spec.get("pre_tokenizer")):
        raise CheckpointError(f"{directory}'s tokenizer is not a byte-level BPE, the one kind export writes from a "
                              "checkpoint directory for now (a conversion of a GGUF file carries its own)")
    vocab = tokenizer.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda item: item[1])]
    special = set(tokenizer.all_special_tokens) | {t.content for t in getattr(tokenizer, "added_tokens_decoder",
                                                                               {}).values() if t.special}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in special else 1 for t in tokens])  # 3: control, 1: normal
    gguf.SpecialVocab(str(model_directory(str(directory))), load_merges=True, n_vocab=len(tokens)).add_to_gguf(writer)


def _source(directory: Path) -> Path | None:
    """The model the conversion in ``directory`` read, as its report keeps it."""
    try:
        report = json.loads((directory / REPORT).read_text(encoding="utf-8"))
        return Path(report["source"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
