""":class:`~lambda_gelu.inference.decoder.LeanDecoder`'s forward in torch operations: a prompt's (but a short one over
int8 rows, which the one-call C step takes a row at a time: ``PROMPT_ROWS_IN_C``), and the reference of its C step
(``fused=False``).

It runs the model's own modules and weights as the decoder holds them: the query, key and value projections stacked,
the rotary embedding tabulated per layer, the static cache written in place, ``scaled_dot_product_attention`` with
grouped-query heads (a sliding window and Gemma 2's soft-capped scores as that model's attention applies them), and
each layer's ``mlp`` called as it is (with Gemma 4's experts and per-layer inputs beside it; a sparse FFN runs its own
C loop). Where the C step applies, a prompt's int8 projections are its integer sums; with ``fused=False`` every
operation is torch's. The C step calls :func:`ffn` and :func:`per_layer_input` for what it does not compute itself.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from . import layout
from .int8 import linear_i8

__all__ = ["forward", "ffn", "per_layer_inputs", "per_layer_input"]


def forward(decoder, ids: Tensor, start: int, keys: list[Tensor], values: list[Tensor]) -> Tensor:
    """The last position's final hidden state (1, d) for the tokens ``ids`` (1, T) at positions start..start+T−1,
    writing their keys and values into the cache: a prompt (start 0) or one token. With the decoder's int8 attention,
    the projections are the C step's own sums over its int8 rows (:func:`~lambda_gelu.inference.int8.linear_i8`)
    where the C step applies, else ``F.linear`` over those rows dequantized (the C step's reference)."""
    n, end = ids.shape[1], start + ids.shape[1]
    inner = decoder.model.model
    h = decoder._embed(ids)
    per_layer = per_layer_inputs(inner, ids, h)
    for i, (layer, (weight, bias, split), (cos, sin), window, softcap, k_cache, v_cache, head_dim) in enumerate(
            zip(inner.layers, decoder.qkv, decoder.rotary, decoder.windows, decoder.softcaps, keys, values,
                decoder.head_dims)):
        a, whole = layer.self_attn, layout.whole_width(layer.self_attn, head_dim)
        before, after, ffn_before, ffn_after = layout.norms(layer)
        x = before(h) if before is not None else h  # OLMo 2 and 3: none
        int8 = decoder.int8[i] if decoder.int8_attention and decoder._steps is not None else None
        if int8 is not None:  # the int8 rows, summed as the C step sums them
            q, *kv = linear_i8(x, int8[0], int8[1], bias).split(split, -1)
        else:  # float32, or the int8 rows' weights as the C step reads them (but x's rounding)
            q, *kv = F.linear(x, decoder.dequantized[i][0] if decoder.int8_attention else weight, bias).split(split, -1)
        if whole:  # OLMo 2 and 3, OLMoE: one norm over every head's query at once, and one over the keys
            q, kv = a.q_norm(q), [a.k_norm(kv[0]), kv[1]] if kv else kv
        if decoder.clip is not None:  # OLMo's and OLMoE's clip_qkv, after those norms
            q, kv = q.clamp(-decoder.clip, decoder.clip), [t.clamp(-decoder.clip, decoder.clip) for t in kv]
        q = q.view(1, n, -1, head_dim)
        if hasattr(a, "q_norm") and not whole:  # Qwen3, Gemma 3 and 4: a norm over each head's query (and key)
            q = a.q_norm(q)
        cos, sin = cos[start:end], sin[start:end]
        q = _rotated(q.transpose(1, 2), cos, sin)
        if hasattr(a, "query_layernorm"):  # HunYuan's: each head's query normalized after the rotation
            q = a.query_layernorm(q)
        if kv:  # the layer's own keys and values, not an earlier layer's (Gemma 4's shared layers)
            k, v = (t.view(1, n, -1, head_dim) for t in kv)
            k = a.k_norm(k) if hasattr(a, "k_norm") and not whole else k
            v = a.v_norm(v) if hasattr(a, "v_norm") else v  # Gemma 4's, without a weight
            k = _rotated(k.transpose(1, 2), cos, sin)
            k_cache[:, :, start:end] = a.key_layernorm(k) if hasattr(a, "key_layernorm") else k
            v_cache[:, :, start:end] = v.transpose(1, 2)
        o = _attend(q, k_cache[:, :, :end], v_cache[:, :, :end], a.scaling, start, window, softcap)
        o = o.transpose(1, 2).reshape(1, n, -1)
        if int8 is not None:
            o = linear_i8(o, int8[2], int8[3], a.o_proj.bias)
        else:
            o = F.linear(o, decoder.dequantized[i][1], a.o_proj.bias) if decoder.int8_attention else a.o_proj(o)
        scale = getattr(layer, "residual_multiplier", 1.0)  # Granite's scale of each sublayer's output
        if ffn_before is before is not None:  # Cohere's: the FFN reads the layer's input beside the attention
            h = h + o + ffn(layer, x, h)
            continue
        h = h + (after(o) if after is not None else o) * scale  # Gemma 2-4, GLM-4, OLMo 2 and 3: normalized
        out = ffn(layer, ffn_before(h) if ffn_before is not None else h, h)
        h = h + (ffn_after(out) if ffn_after is not None else out) * scale
        if per_layer is not None:
            h = h + per_layer_input(layer, h, per_layer[:, :, i])
        if hasattr(layer, "layer_scalar"):  # Gemma 4's scale of the layer's output
            h = h * layer.layer_scalar
    return inner.norm(h[:, -1])


def ffn(layer, x: Tensor, residual: Tensor) -> Tensor:
    """The layer's FFN on its normalized input x: its ``mlp`` (Granite's mixtures: ``block_sparse_moe``, with the
    dense ``shared_mlp`` beside it if it has one), and beside it, where the layer has one (Gemma 4's
    ``enable_moe_block``), its experts routed from the residual stream, each output normalized, the two summed."""
    if not hasattr(layer, "mlp"):
        shared = getattr(layer, "shared_mlp", None)
        out = layer.block_sparse_moe(x)
        return out if shared is None else out + shared(x)
    out = layer.mlp(x)
    if not getattr(layer, "enable_moe_block", False):
        return out
    flat = residual.reshape(-1, residual.shape[-1])
    _, weights, index = layer.router(flat)
    experts = layer.experts(layer.pre_feedforward_layernorm_2(flat), index, weights).reshape(residual.shape)
    return layer.post_feedforward_layernorm_1(out) + layer.post_feedforward_layernorm_2(experts)


def per_layer_inputs(inner, ids: Tensor, h: Tensor) -> Tensor | None:
    """Gemma 4's inputs of each layer for each token (1, T, layers, width), from the tokens and their embeddings
    ``h``, as its model (``inner``, the ``model.model``) makes them; None for a model without."""
    if not getattr(inner, "hidden_size_per_layer_input", None):
        return None
    return inner.project_per_layer_inputs(h, inner.get_per_layer_inputs(ids, h))


def per_layer_input(layer, h: Tensor, inputs: Tensor) -> Tensor:
    """What a Gemma 4 layer adds to its hidden state ``h`` from its own ``inputs`` for each token: gated by the
    hidden state, projected back to its width and normalized."""
    gated = layer.act_fn(layer.per_layer_input_gate(h)) * inputs
    return layer.post_per_layer_input_norm(layer.per_layer_projection(gated))


def _rotated(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x·cos + rotate_half(x)·sin over the first cos.shape[-1] features of each head (all but in a partial rotary
    embedding, Phi-4-mini's), the rest as they are."""
    width = cos.shape[-1]
    x, rest = x[..., :width], x[..., width:]
    half = width // 2
    return torch.cat((x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin, rest), -1)


def _attend(q: Tensor, keys: Tensor, values: Tensor, scaling: float, start: int, window: int | None,
            softcap: float | None) -> Tensor:
    """Causal attention of the queries at positions start.. over the keys and values at 0..: each query over the
    last ``window`` positions up to its own if a window is given, the scores soft-capped as
    softcap·tanh(score / softcap) if a softcap is (Gemma 2's)."""
    n, end, gqa = q.shape[2], keys.shape[2], keys.shape[1] != q.shape[1]
    if window is None and softcap is None:
        return F.scaled_dot_product_attention(q, keys, values, is_causal=n > 1, scale=scaling, enable_gqa=gqa)
    at, to = torch.arange(start, start + n, device=q.device)[:, None], torch.arange(end, device=q.device)
    allowed = (to <= at) & (to > at - window) if window is not None else to <= at
    if softcap is None:
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed, scale=scaling, enable_gqa=gqa)
    group = q.shape[1] // keys.shape[1]
    scores = q @ keys.repeat_interleave(group, 1).transpose(-1, -2) * scaling
    scores = (torch.tanh(scores / softcap) * softcap).masked_fill(~allowed, float("-inf"))
    return F.softmax(scores, -1, dtype=torch.float32).to(q.dtype) @ values.repeat_interleave(group, 1)
