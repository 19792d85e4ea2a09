"""A decoder's whole token in one C call: every layer's attention and sparse gated FFN, and the final norm.

:class:`~lambda_gelu.inference.decoder.LeanDecoder`'s C step makes a call per layer for its attention and one for
its FFN, with the torch operations between them: on SmolLM2-135M at batch 1 that is some 120 calls a token, each
opening a parallel region, and their overhead was a third of an int8 token. Where every layer's FFN is a
:class:`~lambda_gelu.inference.gated.SparseGatedMLP` the C step can read as it is (int8, or float32 with its gate's
int8 screen), :class:`TokenStep` describes the layers once, as the C structs of ``_native/token.h``, and a token is
one call (``lg_decode_tokens``): one parallel region whose threads meet at barriers between the steps. It computes
what the per-layer calls compute, the same functions in the same order (its reference is that path,
``LeanDecoder(one_call=False)``). Greedy decoding goes further: after the prompt, each token is one call
(``lg_decode_next``) that also looks up its embedding and takes the next token by the output layer's screen
(:class:`~lambda_gelu.inference.screened_argmax.ScreenedArgmax`), so that no torch operation runs between tokens.
"""
from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from .. import _native
from .._native import pointer
from .gated import SparseGatedMLP
from .screened_argmax import ScreenedArgmax

__all__ = ["TokenStep"]

_P, _D, _I, _I64 = ctypes.c_void_p, ctypes.c_double, ctypes.c_int, ctypes.c_int64


class _Attention(ctypes.Structure):  # struct lg_attention
    _fields_ = [*((n, _P) for n in ("norm_w", "q_norm_w", "k_norm_w", "post_w")),
                *((n, _D) for n in ("eps", "q_eps", "k_eps", "post_eps", "v_eps", "scaling", "softcap")),
                *((n, _I) for n in ("plus_one", "q_plus_one", "k_plus_one", "post_plus_one", "shares", "whole",
                                    "rotated_first")),
                *((n, _P) for n in ("qkv", "qkv_b", "o_w", "o_b", "qkv_s", "o_s", "qkv_q", "o_q")),
                *((n, _I64) for n in ("heads", "kv_heads", "head_dim", "rotary_dim"))]


class _FFN(ctypes.Structure):  # struct lg_ffn
    _fields_ = [("norm_w", _P), ("post_w", _P), *((n, _D) for n in ("eps", "post_eps", "scale")),
                *((n, _I) for n in ("plus_one", "post_plus_one", "int8", "int4")),
                *((n, _P) for n in ("gate_q", "up_q", "down_q", "gate_s", "up_s", "down_s", "gate_r", "gate_n", "gate",
                                    "up", "down_t", "gate_b", "up_b", "down_b")),
                ("ff", _I64), ("out", _I64), ("stride", _I64)]


class _Layer(ctypes.Structure):  # struct lg_layer
    _fields_ = [("attention", _Attention), ("cos", _P), ("sin", _P), ("window", _I64), ("ffn", _FFN)]


class _Head(ctypes.Structure):  # struct lg_head
    _fields_ = [*((n, _P) for n in ("w", "b", "q", "s", "r", "nq")), ("rows", _I64), ("grain", _I64)]


def _layout_matches(kernels) -> bool:
    """Whether these mirrors have the C structs' sizes and offsets (a mismatch would read the wrong fields)."""
    sizes = (ctypes.c_int64 * 6)()
    kernels.token_sizes(sizes)
    return list(sizes) == [ctypes.sizeof(_Attention), ctypes.sizeof(_FFN), ctypes.sizeof(_Layer),
                           _Layer.ffn.offset, _FFN.ff.offset, ctypes.sizeof(_Head)]


def ffn_problem(layer, width: int) -> str | None:
    """Why one C call cannot compute this decoder layer's FFN (None if it can): it is a :class:`SparseGatedMLP` the
    C kernels read (int8, 4-bit, or float32 sparse with its screen), alone (no experts or shared block beside it), of
    the model's width, in a layer without Gemma 4's per-layer inputs or output scale. A block whose weights changed
    since it made its copies makes them again first (the call reads those copies by address)."""
    mlp = getattr(layer, "mlp", None)
    if type(mlp) is not SparseGatedMLP:
        return "an FFN that is not a SparseGatedMLP"
    if getattr(layer, "enable_moe_block", False) or hasattr(layer, "layer_scalar") or hasattr(
            layer, "per_layer_input_gate"):
        return "a layer with more than its FFN after the attention"
    if mlp._made is None or mlp._made.stale(mlp._sources()):
        mlp._derive()
    if mlp._screened is None or not mlp.sparse or not (mlp.int8 or mlp.int4 or mlp.screen):
        return "an FFN the C kernels do not read as it is"
    gate, _, down = mlp._parts()
    if down.out_features != width or gate.weight.dtype is not torch.float32:
        return "an FFN of another width or dtype"
    return None


class TokenStep:
    """One token through every layer and the final norm in one C call, for a :class:`LeanDecoder` whose C step
    applies (its ``_steps``) and whose layers' FFNs all pass :func:`ffn_problem`. Build it with :meth:`build` (None
    where it does not apply); it points into the decoder's and the model's tensors, so it is built again whenever
    they are (the decoder's ``refresh``)."""

    def __init__(self, kernels, layers: list[_Layer], held: list, final: tuple, width: int, int8_attention: bool,
                 head=None, embedding: tuple | None = None, ffn_rows: str | None = None):
        self.kernels, self.width, self.final, self.int8_attention = kernels, width, final, int8_attention
        self.layers = (_Layer * len(layers))(*layers)
        self._held = held  # every tensor the structs point into
        self._caches = None
        self.head = head  # the ScreenedArgmax that greedy() decides the next token as
        self._head = None if head is None else _Head(
            head.layer.weight.data_ptr(), pointer(head.layer.bias), *(t.data_ptr() for t in head.screen),
            head.layer.out_features, _native.GRAIN)
        self._embedding = embedding  # (the table's weight, its scale) where the C call can look a token up
        self.ffn_rows = ffn_rows  # the FFNs' rows: "int8", "int4", or None (float32, or mixed)

    @classmethod
    def build(cls, decoder) -> "TokenStep | None":
        kernels, steps = _native.library(), decoder._steps
        inner = decoder.model.model
        width = decoder.model.config.hidden_size
        if kernels is None or steps is None or not _layout_matches(kernels) or any(
                ffn_problem(layer, width) for layer in inner.layers):
            return None
        layers, held = [], []
        for layer, step, (cos, sin), window, softcap, head_dim, kv_heads in zip(
                inner.layers, steps, decoder.rotary, decoder.windows, decoder.softcaps, decoder.head_dims,
                decoder.kv_heads):
            norm, norms, qkv, qkv_b, o_w, o_b, ffn_norm, ffn_post, int8 = step
            q_w, q_eps, q_plus_one, k_w, k_eps, k_plus_one, post_w, post_eps, post_plus_one, v_eps, shares, whole, \
                late = norms
            q8, q8_s, o8, o8_s = int8 if decoder.int8_attention else (None,) * 4
            cos, sin = cos.contiguous(), sin.contiguous()
            attention = _Attention(
                pointer(norm[0]), pointer(q_w), pointer(k_w), pointer(post_w), norm[1], q_eps, k_eps, post_eps, v_eps,
                float(layer.self_attn.scaling), float(softcap or 0.0), norm[2], q_plus_one, k_plus_one, post_plus_one,
                shares, whole, late, qkv.data_ptr(), pointer(qkv_b), o_w.data_ptr(), pointer(o_b), pointer(q8_s),
                pointer(o8_s), pointer(q8), pointer(o8), decoder.heads, kv_heads, head_dim, cos.shape[-1])
            mlp, b = layer.mlp, layer.mlp._buffers
            gate, up, down = mlp._parts()
            post = ffn_post if ffn_post is not None else (None, 0.0, 0)
            ffn = _FFN(pointer(ffn_norm[0]), pointer(post[0]), ffn_norm[1], post[1],
                       float(getattr(layer, "residual_multiplier", 1.0)), ffn_norm[2], post[2], int(mlp.int8),
                       (1 if mlp.round_inputs else 2) if mlp.int4 else 0,
                       pointer(b["gate_q"]), pointer(b.get("up_q")), pointer(b.get("down_q")), pointer(b["gate_s"]),
                       pointer(b.get("up_s")), pointer(b.get("down_s")), pointer(b.get("gate_r")),
                       pointer(b.get("gate_n")), pointer(b.get("gate_rows")), pointer(b.get("up_rows")),
                       pointer(b.get("down_t")), pointer(gate.bias), pointer(up.bias), pointer(down.bias),
                       gate.out_features, down.out_features, b["up_q" if mlp.int8 or mlp.int4 else "up_rows"].stride(0))
            layers.append(_Layer(attention, cos.data_ptr(), sin.data_ptr(), window or 0, ffn))
            held += [step, cos, sin, *b.values()]
        head, embed = decoder.head, inner.embed_tokens
        if not (isinstance(head, ScreenedArgmax) and head.screen is not None and head.layer.weight.is_contiguous()
                and _native.biases_fit(head.layer)):
            head = None  # greedy() needs the output layer's screen as the C kernel reads it
        plain = (type(embed) is torch.nn.Embedding and embed.weight.dtype is torch.float32 and head is not None
                 and embed.weight.is_contiguous() and isinstance(decoder.embedding_multiplier, (int, float))
                 and embed.num_embeddings >= head.layer.out_features)  # every token the head gives has its row
        formats = {"int4" if layer.mlp.int4 else "int8" if layer.mlp.int8 else None for layer in inner.layers}
        return cls(kernels, layers, held, steps[-1], width, decoder.int8_attention, head,
                   (embed.weight, float(decoder.embedding_multiplier)) if plain else None,
                   formats.pop() if len(formats) == 1 else None)

    def _point_at(self, keys: list[Tensor], values: list[Tensor]) -> None:
        if self._caches is None or self._caches[0] is not keys or self._caches[1] is not values:
            self._caches = keys, values, *((ctypes.c_void_p * len(c))(*(t.data_ptr() for t in c))
                                           for c in (keys, values))

    def __call__(self, h: Tensor, start: int, keys: list[Tensor], values: list[Tensor]) -> Tensor:
        """The last token's final hidden state (1, d) of the tokens whose embeddings are the rows of ``h`` (T, d,
        contiguous float32, changed in place) at positions ``start``..``start`` + T − 1, writing their keys and values
        into the caches: one token, or a prompt's tokens layer by layer (each layer's weights read from the cache
        for every row after the first)."""
        self._point_at(keys, values)
        out = torch.empty(1, self.width, dtype=h.dtype)
        weight, eps, plus_one = self.final
        if self.kernels.decode_tokens(h.data_ptr(), h.shape[0], self.layers, len(self.layers), self._caches[2],
                                      self._caches[3], keys[0].shape[2], start, self.width, weight.data_ptr(), eps,
                                      plus_one, out.data_ptr(), torch.get_num_threads()) < 0:
            raise MemoryError("LeanDecoder: the decoding step could not allocate its buffers")
        return out

    def greedy(self, token: int, start: int, count: int, keys: list[Tensor], values: list[Tensor], embed,
               logits, eos_token_id: int | None = None, put=None) -> list[int]:
        """Up to ``count`` greedy tokens after ``token`` at position ``start``, stopping after ``eos_token_id``: each
        one C call (``lg_decode_next``: the token's embedding, the step, the next token by :attr:`head`'s screen), as
        :meth:`__call__` then ``head`` give it. ``embed`` makes a token's embedding (1, 1, d) where the call cannot
        look it up; ``logits`` gives the logits of a final hidden state whose next token the screen cannot decide (a
        NaN or an infinity), as the decoder computes them without the screen; ``put``, if given, takes each token
        (a tensor of one) as soon as it is decided (a streamer's). Needs :attr:`head`."""
        self._point_at(keys, values)
        out, h, read = torch.empty(1, self.width), torch.empty(self.width), torch.zeros(1, dtype=torch.int64)
        (weight, eps, plus_one), threads, tokens = self.final, torch.get_num_threads(), []
        table, scale = self._embedding if self._embedding is not None else (None, 1.0)
        step = self.kernels.decode_next  # nothing between two calls but this loop: see lg_decode_next
        table, head, length, screened = pointer(table), ctypes.byref(self._head), keys[0].shape[2], True
        for pos in range(start, start + count):
            if not table:
                h.copy_(embed(torch.tensor([[token]])).reshape(-1))
            token = step(token, table, scale, h.data_ptr(), self.layers, len(self.layers), self._caches[2],
                         self._caches[3], length, pos, self.width, weight.data_ptr(), eps, plus_one, out.data_ptr(),
                         threads, head, read.data_ptr())
            if token == -1:
                raise MemoryError("LeanDecoder: the decoding step could not allocate its buffers")
            screened, token = token >= 0, token if token >= 0 else int(logits(out).argmax(-1))
            tokens.append(token)
            if put:
                put(torch.tensor([token]))
            if token == eos_token_id:
                break
        self.head.rows_read = int(read) if screened else self.head.layer.out_features  # the last token's
        return tokens
