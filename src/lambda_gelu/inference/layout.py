"""What a decoder layer holds and where, for :class:`~lambda_gelu.inference.decoder.LeanDecoder`: read from its modules'
names (the families table's norm layouts, the projections, the cache a layer reads) or found by trying them on a probe
input (a norm's kind, whether a layer turns its queries and keys and how, by halves or in neighbouring pairs), and which
layers hold what the decoder's C step does not compute. The decoder computes; this module says what.
"""
from __future__ import annotations

import sys

import torch
import torch.nn as nn
from torch import Tensor

from ..families import norm_layouts

__all__ = ["layout_problem", "norms", "rms_norm", "cache_owners", "window", "interleaved", "halves_order",
           "paired_table", "rotates", "torch_only", "whole_width"]

_PARTS = ("self_attn", "mlp")
_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")  # or Phi-3's qkv_proj and o_proj


def layout_problem(model) -> str | None:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if getattr(model, "lm_head", None) is None or layers is None or not len(layers):
        return "has no model.layers and lm_head"
    missing = ["model.norm / embed_tokens / rotary_emb"] if not all(
        hasattr(inner, n) for n in ("norm", "embed_tokens", "rotary_emb")) else []
    layer = layers[0]
    missing += [p for p in _PARTS if not hasattr(layer, p) and not (p == "mlp" and hasattr(layer, "block_sparse_moe"))]
    if norms(layer) is None:  # what the most common layout, Llama's, names and it lacks
        missing += [n for n in ("input_layernorm", "post_attention_layernorm") if not hasattr(layer, n)]
    attention = getattr(layer, "self_attn", None)
    if attention is not None:
        stacked = hasattr(attention, "qkv_proj")  # Phi-3's query, key and value projections in one layer
        missing += [p for p in (("qkv_proj", "o_proj") if stacked else _PROJECTIONS) + ("head_dim", "scaling")
                    if not hasattr(attention, p)]
        if not missing and not getattr(attention, "is_causal", True):
            return "attends both ways (not a causal decoder)"
    return f"lacks {', '.join(missing)}" if missing else None


def interleaved(attention) -> bool:
    """Whether the attention's module rotates each head's neighbouring features in pairs (GLM, ERNIE 4.5, Helium:
    GPT-J's way) rather than its two halves (Llama's): its own ``apply_rotary_pos_emb`` tried on a probe input.
    Such a layer's queries and keys, each head's rotated features reordered evens first then odds
    (:func:`halves_order`), are rotated by halves as they would be in pairs: the same scores."""
    apply = getattr(sys.modules.get(type(attention).__module__), "apply_rotary_pos_emb", None)
    if apply is None or hasattr(attention, "q_norm"):  # a per-head norm's weight would need reordering too
        return False
    generator = torch.Generator().manual_seed(0)
    x, angles = torch.randn(1, 1, 2, 8, generator=generator), torch.randn(1, 2, 4, generator=generator)
    even, odd, c, s = x[..., 0::2], x[..., 1::2], angles.cos()[:, None], angles.sin()[:, None]
    pairs = torch.stack((even * c - odd * s, odd * c + even * s), -1).flatten(-2)
    for tabulate in (lambda t: torch.cat([t] * 2, -1), lambda t: t.repeat_interleave(2, -1)):  # ERNIE's, Cohere's
        try:
            theirs = apply(x, x, tabulate(angles.cos()), tabulate(angles.sin()))[0]
        except Exception:  # noqa: BLE001 - another signature: the probe prompt decides
            return False
        if isinstance(theirs, Tensor) and theirs.shape == x.shape and torch.allclose(theirs, pairs, atol=1e-6):
            return True
    return False


def paired_table(cos: Tensor) -> bool:
    """Whether a rotary table repeats each angle twice in a row (Cohere's) rather than in two halves (the others')."""
    return cos.shape[-1] > 2 and torch.equal(cos[..., 0::2], cos[..., 1::2]) and not torch.equal(
        cos[..., :cos.shape[-1] // 2], cos[..., cos.shape[-1] // 2:])


def halves_order(split: list[int], head_dim: int, width: int) -> Tensor:
    """The rows of a stacked query/key/value weight with each query and key head's first ``width`` features
    reordered evens first, then odds (a rotation of neighbouring pairs becomes one of halves); the values' as they
    are."""
    within = torch.cat([torch.arange(0, width, 2), torch.arange(1, width, 2), torch.arange(width, head_dim)])
    rotated = split[0] + (split[1] if len(split) > 1 else 0)  # the queries' rows, then the keys'
    heads = torch.arange(0, rotated, head_dim)[:, None] + within
    return torch.cat([heads.reshape(-1), torch.arange(rotated, sum(split))])


def cache_owners(layers) -> list[int | None]:
    """Each layer's cache: its own index, or for a layer that reads an earlier layer's keys and values (Gemma 4's
    shared layers) the last earlier layer of its type with keys of its own, which stores them (None if none)."""
    owners, last = [], {}
    for i, layer in enumerate(layers):
        kind = getattr(layer.self_attn, "layer_type", None)
        if getattr(layer.self_attn, "is_kv_shared_layer", False):
            owners.append(last.get(kind))
        else:
            owners.append(i)
            last[kind] = i
    return owners


def torch_only(layer) -> bool:
    """Whether the layer holds what the C step does not compute: Cohere's attention and FFN side by side; a scale of
    each sublayer's output (Granite's) after a norm (the C step folds it into the attention's output projection, and
    scales the FFN's output)."""
    before, after, ffn_before, ffn_after = norms(layer)
    return (ffn_before is before is not None
            or getattr(layer, "residual_multiplier", 1.0) != 1.0 and (after is not None or ffn_after is not None))


def whole_width(attention, head_dim: int) -> bool:
    """Whether the attention's query norm spans every head at once (OLMo 2 and 3, OLMoE), not each head alone."""
    weight = getattr(getattr(attention, "q_norm", None), "weight", None)
    return isinstance(weight, Tensor) and weight.numel() != head_dim


def norms(layer) -> tuple[nn.Module | None, ...] | None:
    """The layer's norms before its attention, after it, before its FFN and after it (None: none there), as the
    first of the families table's norm layouts (:func:`lambda_gelu.families.norm_layouts`) it has places them; None if
    it has none of them."""
    for names in norm_layouts():
        if all(n is None or hasattr(layer, n) for n in names) and (names[0] or not hasattr(layer, "input_layernorm")):
            return tuple(None if n is None else getattr(layer, n) for n in names)
    return None


def rotates(attention, cos: Tensor, sin: Tensor) -> bool:
    """Whether the layer turns its queries and keys by the rotary embedding (``cos``, ``sin``: the model's table),
    tried: its own forward on a probe input gives other outputs with that table than with one that turns by 0. Not
    SmolLM3's layers without it, EXAONE 4's global layers, which keep a sliding window they do not use, nor Cohere
    2's, of which nothing in the module says it; a forward of another signature (Gemma 4's layers reading an earlier
    layer's keys) is taken to turn them, and the probe prompt decides."""
    x = torch.randn(1, 4, attention.o_proj.out_features, generator=torch.Generator().manual_seed(0)).to(cos)
    turned = cos[None, 1:5], sin[None, 1:5]  # positions 1-4: every angle but a few turns
    unturned = torch.ones_like(turned[0]), torch.zeros_like(turned[1])
    try:
        outputs = [attention(x, position_embeddings=table, attention_mask=None)[0] for table in (turned, unturned)]
    except Exception:  # noqa: BLE001 - another signature: the probe prompt decides
        return True
    return not torch.equal(*outputs)


def window(attention, config) -> int | None:
    """The layer's sliding window: its attention's own where it has one (Qwen2, Gemma 2 and 3: None on the global
    layers; EXAONE 4's global layers, which keep the config's, attend to every position), else the config's
    (Mistral's, every layer), None for none."""
    if getattr(attention, "is_sliding", None) is False:
        return None
    if hasattr(attention, "sliding_window"):
        return attention.sliding_window
    return getattr(config, "sliding_window", None) if getattr(config, "use_sliding_window", True) else None


def rms_norm(norm: nn.Module, width: int | None = None) -> tuple[Tensor | None, float, int] | None:
    """(its weight, eps, plus_one) if ``norm`` computes x/√(mean(x²) + eps) times its float32 weight, or
    times 1 + weight with plus_one (Gemma's), on a probe input; given the ``width`` of a norm without weight (Gemma
    4's of the values), (None, eps, 0) if it computes that alone; None otherwise."""
    w = getattr(norm, "weight", None)
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    if not (isinstance(eps, float | int) and (w is None and width or isinstance(w, Tensor) and w.dim() == 1 and
                                              w.dtype is torch.float32 and w.is_cpu and w.is_contiguous())):
        return None
    x = torch.randn(4, width or w.numel(), generator=torch.Generator().manual_seed(0))
    got, base = norm(x), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    for plus_one in (0, 1) if w is not None else (0,):
        if torch.allclose(got, base * (1 + w if plus_one else w) if w is not None else base, rtol=1e-5, atol=1e-6):
            return w, float(eps), plus_one
    return None
