"""Tiny GGUF files: a transformers model written as llama.cpp names and lays out its tensors, the inverse of what
transformers' GGUF reader undoes, its config's fields as the metadata that reader maps back, and a byte-level BPE
vocabulary learnt from the standard library's docstrings (llama.cpp's ``gpt2`` tokenizer model)."""
import functools
import json
import re

import numpy as np

# general.architecture of each model type transformers reads from GGUF, where the two differ
ARCHITECTURES = {"qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe", "gemma3_text": "gemma3", "gemma4_text": "gemma4",
                 "gpt_oss": "gpt-oss", "minimax_m2": "minimax-m2", "mistral": "llama", "umt5": "t5"}
SPECIAL = ("<|endoftext|>", "<pad>", "<s>")  # eos, pad, bos: ids 0, 1, 2


@functools.lru_cache(maxsize=1)
def vocabulary(size: int = 500) -> tuple[list[str], list[str]]:
    """(tokens, merges) of a byte-level BPE learnt on the standard library's docstrings."""
    from tokenizers import ByteLevelBPETokenizer

    from lambda_gelu.hf.text import stdlib_sentences
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(stdlib_sentences()[0][:3000], vocab_size=size, special_tokens=list(SPECIAL))
    model = json.loads(bpe.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    return tokens, [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]


def bpe_tokenizer():
    """:func:`vocabulary`'s byte-level BPE as a transformers tokenizer (eos 0, pad 1, bos 2), for a checkpoint
    directory a GGUF file is written from."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    tokens, merges = vocabulary()
    bpe = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, [tuple(m.split(" ")) for m in merges]))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=SPECIAL[0], pad_token=SPECIAL[1],
                                                bos_token=SPECIAL[2])


def _permute(w, heads):  # llama.cpp's order of a query's or key's rows, which transformers' reader undoes
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _laid_out(arch: str, name: str, w: np.ndarray, config) -> np.ndarray:
    """``w`` as llama.cpp writes the tensor ``name`` (a GGUF name): what transformers' reader undoes."""
    if arch == "llama" and ".attn_q." in name:
        return _permute(w, config.num_attention_heads)
    if arch == "llama" and ".attn_k." in name:
        return _permute(w, config.num_key_value_heads)
    if arch in ("gemma2", "gemma3", "nemotron") and "norm.weight" in name:
        return w + 1
    if arch == "gpt2" and re.search(r"(attn_qkv|ffn_down|ffn_up|attn_output)\.weight$", name):
        return w.T
    if arch == "mamba" and "ssm_conv1d.weight" in name:
        return w[:, 0]
    if arch == "mamba" and "ssm_a" in name:
        return -np.exp(w)
    if arch == "bloom" and "attn_qkv" in name:
        heads, width = config.n_head, config.hidden_size
        qkv = w.reshape(heads, 3, width // heads, *w.shape[1:])
        return np.concatenate([qkv[:, i].reshape(width, *w.shape[1:]) for i in range(3)])
    if arch in ("qwen2moe", "qwen3moe") and "ffn_gate_exps" in name:
        return w[:, :w.shape[1] // 2]
    if arch in ("qwen2moe", "qwen3moe") and "ffn_up_exps" in name:
        return w[:, w.shape[1] // 2:]
    if arch in ("qwen2moe", "qwen3moe") and "ffn_gate_inp_shexp" in name:
        return w[0]
    return w


def write(model, path, name: str | None = None, extra: dict | None = None, claims: dict | None = None) -> None:
    """``model`` (a transformers model of a type transformers reads from GGUF) written to the GGUF file ``path`` in
    float32, with :func:`vocabulary`'s tokenizer (its config's vocabulary must be that size), and the tensors
    ``extra`` (GGUF name → array) beside its own; ``claims`` (config field → value) in the metadata instead of the
    config's values, as a file that lies about its sizes would have them."""
    import gguf
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    config = model.config
    arch = ARCHITECTURES.get(config.model_type, config.model_type)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(name or f"tiny-{config.model_type}")
    for key, field in GGUF_CONFIG_MAPPING[config.model_type.removesuffix("_text")].items():
        value = (claims or {}).get(field, getattr(config, field, None)) if field else None
        if value is None:
            continue
        key = f"{arch}.{key}"
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
    tokens, merges = vocabulary()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_merges(merges)
    writer.add_token_types([3 if t in SPECIAL else 1 for t in tokens])
    writer.add_eos_token_id(0)
    writer.add_pad_token_id(1)
    writer.add_bos_token_id(2)
    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=config.to_dict())
    names = {}
    for g, hf in get_gguf_hf_weights_map(model, processor, model_type=arch if arch == 'llama' else None).items():
        names.setdefault(hf, []).append(g)
    state = model.state_dict()
    written = set()
    for hf, tensor in state.items():
        for g in names.get(hf, []):
            g = g if g.endswith((".weight", ".bias")) or not g.endswith("_exps") else g + ".weight"  # as llama.cpp
            if g not in written:
                writer.add_tensor(g, np.ascontiguousarray(_laid_out(arch, g, tensor.detach().float().numpy(), config)))
                written.add(g)
    for gname, w in (extra or {}).items():
        writer.add_tensor(gname, np.ascontiguousarray(w, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
