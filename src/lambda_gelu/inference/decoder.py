"""Decoding at batch 1, greedy or sampled, with fewer Python calls per token than transformers' ``generate``.

At batch 1 a small language model spends a sizeable share of each token in Python: ``generate`` runs its logits
processors, stopping criteria and cache bookkeeping, and each decoder layer a few dozen small operations. That
share does not shrink when the FFN blocks are sparsified (:func:`lambda_gelu.inference.sparse.sparsify_`), so it caps
what their speed-up can give end to end. :class:`LeanDecoder` runs the same model, its own modules and weights, with

- one matrix product for the query, key and value projections (their weights stacked once, at construction, or
  Phi-3's layer that holds them stacked);
- a static key-value cache, written in place, and the rotary embedding's cos/sin tabulated for every position (a
  table per layer type where the model has several, as Gemma 3's local and global layers);
- ``scaled_dot_product_attention`` over the cache with grouped-query heads (no repeated keys), for the prompt; a
  layer with a sliding window attends to its last ``window`` positions, and Gemma 2's logit soft-capping is applied
  as its own attention applies it;
- for each new token, one C call per layer from the input norm to the attention's residual (the projections, the
  rotary embedding, the cache write, the attention, Gemma 2's and 3's norm after it) and one for each of the FFN's
  norms, where the model allows it (float32 on CPU, RMS norms of the Llama or Gemma kind, Qwen3's and Gemma 3's
  per-head ones too, Gemma 4's of the values; ``fused=False``: the torch path above, its reference,
  :mod:`~lambda_gelu.inference.torch_path`); and where every FFN is a sparse gated block
  (:func:`~lambda_gelu.inference.sparse.sparsify_`'s), one C call for the whole token, every layer's attention and FFN
  and the final norm (:mod:`~lambda_gelu.inference.token_step`), and for a short prompt over int8 rows
  (:data:`PROMPT_ROWS_IN_C`) one such call for all its tokens, a row at a time, layer by layer;
- the next token from the output layer through its int8 screen
  (:class:`~lambda_gelu.inference.screened_argmax.ScreenedArgmax`: the largest logit's index, reading the float32 rows
  of the few that can hold it), and nothing else between tokens.

The decoder layers' own ``mlp`` modules are called as they are, so a sparsified FFN block runs here as in
``generate`` (in the one call, its kernel reads the module's own rows). The layouts it runs, each model checked on a
probe prompt at construction (its own forward's logits against this one's, the C step included; another layout, or
other logits, is refused with one line):

- the Llama family's: Llama, Mistral and Qwen2 with their sliding windows, Qwen3's per-head query/key norms, SmolLM,
  SmolLM3's layers without rotary embedding; Phi-3's stacked projections, Phi-4-mini's rotary embedding over part of
  each head; GLM's, GLM-4's and ERNIE 4.5's rotation of neighbouring pairs, GLM-4's norms after the attention and
  the FFN; Granite and its mixtures (its embedding, each sublayer's output and the logits scaled); EXAONE 4 (norms
  after the attention and the FFN alone, global layers without rotary embedding); OLMo 2 and 3 (norms after alone,
  and over every head's query at once; OLMo 3's sliding windows) and OLMoE; HunYuan (each head's query and key
  normalized after the rotation);
- the Gemma family's: Gemma, whose embedding module scales its output; Gemma 2 and 3, a norm after the attention and
  around the FFN, Gemma 2's soft-capped logits, Gemma 3's rotary embedding by layer type; VaultGemma; Gemma 4's text
  models (its global layers' wider heads and values taken from the keys' projection, each head's values normalized,
  layers that read an earlier layer's keys and values, each layer's own input per token and scale of its output,
  experts beside the FFN);
- by the torch path alone (what the C step does not compute): Cohere (Command R, Aya: the attention and the FFN side
  by side on one norm's output, neighbouring pairs rotated, scaled logits; Cohere 2's global layers without rotary
  embedding, each layer's rotation found by trying its attention); OLMo's clipped queries, keys and values (OLMo's,
  and OLMoE's where its config clips them).

    decoder = LeanDecoder(model)                        # a LlamaForCausalLM, sparsified or not
    tokens = decoder.generate(input_ids, max_new_tokens=64)   # == model.generate(..., do_sample=False)
    tokens = decoder.generate(input_ids, 64, do_sample=True, temperature=0.7, top_p=0.9)  # as model.generate draws
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .. import _native
from .._native import pointer
from . import layout, torch_path
from .derived import Made
from .gated import SparseGatedMLP
from .int8 import quantize_rows
from .sampling import settings_warpers
from .token_step import TokenStep
from .screened_argmax import ScreenedArgmax

__all__ = ["LeanDecoder", "PROBE_TOLERANCE", "PROMPT_ROWS_IN_C"]

# The longest prompt that goes through the C step (TokenStep) a row at a time, layer by layer, where the attention's
# rows are int8, by the format of the FFNs' rows; a longer one, or one over float32 rows, goes through torch's batched
# products. One row at a time reads each layer's rows again from the cache and skips the torch path's hundred small
# operations a layer. SmolLM2-135M on a 2-core EPYC, interleaved in one process: a 15-token prompt took 40 against
# 54 ms (int8) and 42 against 56 (4-bit); at 20 rows 67 against 71 (int8), at 24 79 against 72; 4-bit rows at 64
# 165 against 169, at 128 441 against 346. Float32 rows took 100 against 69 ms at 15 rows.
PROMPT_ROWS_IN_C = {"int8": 20, "int4": 64}
PROBE_TOLERANCE = 1e-3  # the probe's largest logit difference from the model's own forward, relative to their scale


class LeanDecoder:
    """Greedy or sampled decoding of a Llama- or Gemma-family causal LM at batch 1 (see the module's docstring);
    inference only.

    Args:
        model: a ``...ForCausalLM`` of a layout the module lists (``model.model.layers[i].self_attn.q_proj`` ...,
            a rotary embedding at ``model.model.rotary_emb``, ``model.lm_head``), in float32 or another floating
            dtype.
        max_length: tokens the cache holds, prompt included.
        screen_head: the next token through the output layer's int8 screen (the default; an int8 copy of its rows
            is held, a quarter more of its bytes), or ``False``: every logit computed and their argmax taken.
        fused: each new token's norms and attention in one C call per layer and one for the FFN's norm (the
            default, where it applies: float32 on CPU, RMS norms of the Llama or Gemma kind, per head too, not
            the layers the module's docstring lists by the torch path alone; :attr:`fused` says whether it does), or
            ``False``: the torch path, its reference.
        int8_attention: the attention's projections (queries, keys and values stacked, and its output) read as int8
            rows with a float32 scale each (:func:`~lambda_gelu.inference.int8.quantize_rows`: a quarter of their
            bytes, which bound decoding at batch 1), their input rounded to 16 bits and summed exactly in integers
            by the C step, and so by the prompt's forward where the C step applies
            (:func:`~lambda_gelu.inference.int8.linear_i8`); ``fused=False`` computes with the same rows dequantized.
            The weights' rounding is a quantization: it changes logits, and its cost is measured, not bounded.
        one_call: each new token in one C call, every layer and the final norm
            (:mod:`~lambda_gelu.inference.token_step`), where the C step applies and every layer's FFN is a sparse
            gated block its kernels read (int8, or float32 with its gate's screen:
            :func:`~lambda_gelu.inference.sparse.sparsify_`'s); :attr:`one_call` says whether it does. ``False``:
            a C call per layer for the attention and the FFN's norm, and the FFN module called, its reference.

    Raises ``ValueError`` with one line if the model is not of that layout or its own forward disagrees with this
    one on a probe prompt beyond :data:`PROBE_TOLERANCE` (with ``int8_attention``: the float32 decoder against the
    model's forward, and the int8 C step against the int8 torch path). The stacked query/key/value weights and the
    output layer's int8 rows are copies, made again by :meth:`generate` once a weight or buffer of the model has changed
    (:class:`~lambda_gelu.inference.derived.Made`).
    """

    def __init__(self, model: torch.nn.Module, max_length: int = 2048, screen_head: bool = True, fused: bool = True,
                 int8_attention: bool = False, one_call: bool = True):
        if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 2:
            raise ValueError(f"max_length is a number of tokens ≥ 2, got {max_length!r}")
        problem = layout.layout_problem(model)
        if problem is None:
            config = model.config
            self.model, self.max_length = model, max_length
            self.screen_head, self.fused, self.int8_attention = bool(screen_head), bool(fused), bool(int8_attention)
            self.one_call = bool(one_call)
            self.windows = [layout.window(layer.self_attn, config) for layer in model.model.layers]
            self.softcaps = [getattr(layer.self_attn, "attn_logit_softcapping", None) for layer in model.model.layers]
            self.final_softcap = getattr(config, "final_logit_softcapping", None)
            self.heads = config.num_attention_heads
            self.head_dims = [layer.self_attn.head_dim for layer in model.model.layers]  # Gemma 4's vary by type
            self.owners = layout.cache_owners(model.model.layers)
            self.interleaved = [layout.interleaved(layer.self_attn) for layer in model.model.layers]
            self.clip = getattr(config, "clip_qkv", None)  # OLMo's and OLMoE's bound on queries, keys and values
            self.embedding_multiplier = getattr(model.model, "embedding_multiplier", 1.0)  # Granite's scales
            self.logits_scaling = getattr(config, "logits_scaling", 1.0)
            self.logit_scale = getattr(config, "logit_scale", 1.0)  # Cohere's
            problem = self._problem()
        if problem:
            raise ValueError(f"LeanDecoder does not run {type(model).__name__}, which {problem}: use its generate() "
                             "instead")

    def _problem(self) -> str | None:
        """Why this decoder cannot run its model, its probe prompt included (None if it can), in a few words."""
        if not (self.logits_scaling > 0 and self.logit_scale > 0):  # the screen's largest logit would not be theirs
            return "scales its logits by a number ≤ 0"
        if None in self.owners:
            return "shares a layer's keys and values with none"
        rounding = [m for m in self.model.modules() if isinstance(m, SparseGatedMLP) and m.int4]
        try:
            for m in rounding:  # their inputs rounded to 8 bits jump by more than the probe allows at a change of ulps
                m.round_inputs = False
            self.refresh()
            if not self.int8_attention:
                return self._probe()
            self.int8_attention = False  # the float32 decoder against the model's own forward, then int8 against it
            try:
                problem = self._probe()
            finally:
                self.int8_attention = True
            return problem or self._probe_int8()
        except Exception as e:  # noqa: BLE001 - a module of another signature: not a layout it runs, in one line
            return f"fails in it ({type(e).__name__}: {str(e).strip().splitlines()[0] if str(e) else ''})"
        finally:
            if rounding:
                for m in rounding:
                    m.round_inputs = True
                self.refresh()

    @torch.inference_mode()
    def refresh(self) -> None:
        """Stack the query/key/value weights again, tabulate the rotary embedding and copy the output layer's rows to
        int8."""
        weight, rotary = self.model.model.layers[0].self_attn.o_proj.weight, self.model.model.rotary_emb
        position = torch.arange(self.max_length, device=weight.device)[None]
        tables, zero = {}, torch.zeros((), dtype=weight.dtype, device=weight.device)
        self.rotary = []  # each layer's (cos, sin) for every position: Gemma 3's and OLMo 3's differ by layer type
        kinds = getattr(self.model.config, "layer_types", None) if hasattr(rotary, "layer_types") else None
        for i, layer in enumerate(self.model.model.layers):
            kind = kinds[i] if kinds else None  # as the model's forward tabulates them
            if kind not in tables:  # one table a kind, shared by its layers
                cos, sin = rotary(zero, position) if kind is None else rotary(zero, position, kind)
                tables[kind, "theirs"] = cos, sin = cos[0].to(weight.dtype), sin[0].to(weight.dtype)
                # Cohere's repeats each angle twice in a row: as halves, for the pairs' order
                if layout.paired_table(cos):
                    cos, sin = (torch.cat([t[..., 0::2]] * 2, -1) for t in (cos, sin))
                tables[kind] = cos, sin
                tables[kind, "unturned"] = torch.ones_like(cos), torch.zeros_like(sin)  # cos 1, sin 0: turns by 0
            # a layer without rotary embedding (SmolLM3's, EXAONE 4's, Cohere 2's global ones): the table turning by 0
            turns = layout.rotates(layer.self_attn, *tables[kind, "theirs"])
            self.rotary.append(tables[kind] if turns else tables[kind, "unturned"])
        self.qkv, self.kv_heads = [], []
        for i, (layer, head_dim) in enumerate(zip(self.model.model.layers, self.head_dims)):
            a = layer.self_attn
            if self.owners[i] != i:  # Gemma 4's shared layers: queries only, an earlier layer's keys and values
                self.qkv.append((a.q_proj.weight, a.q_proj.bias, [a.q_proj.out_features]))
                self.kv_heads.append(self.kv_heads[self.owners[i]])
                continue
            if hasattr(a, "qkv_proj"):  # Phi-3's: stacked already
                q = self.heads * head_dim
                kv = (a.qkv_proj.out_features - q) // 2
                self.qkv.append((a.qkv_proj.weight, a.qkv_proj.bias, [q, kv, kv]))
                self.kv_heads.append(kv // head_dim)
                continue
            # Gemma 4's full-attention layers without v_proj take the keys' projection as values (normed apart)
            projections = (a.q_proj, a.k_proj, a.v_proj if a.v_proj is not None else a.k_proj)
            biases = [p.bias for p in projections]
            bias = None if all(b is None for b in biases) else torch.cat(
                [b if b is not None else torch.zeros(p.out_features, dtype=p.weight.dtype)
                 for b, p in zip(biases, projections)])
            self.qkv.append((torch.cat([p.weight for p in projections]), bias, [p.out_features for p in projections]))
            self.kv_heads.append(a.k_proj.out_features // head_dim)
        for i, layer in enumerate(self.model.model.layers):
            if self.interleaved[i]:  # GLM's, ERNIE 4.5's rotation of neighbouring pairs: as halves, rows reordered
                weight, bias, split = self.qkv[i]
                order = layout.halves_order(split, self.head_dims[i], self.rotary[i][0].shape[-1])
                self.qkv[i] = weight[order], None if bias is None else bias[order], split
        # int8 rows of the attention's projections (q/k/v stacked, o), and the weights they stand for, dequantized
        self.int8 = [(*quantize_rows(weight), *quantize_rows(layer.self_attn.o_proj.weight))
                     for layer, (weight, _, _) in zip(self.model.model.layers, self.qkv)] if self.int8_attention else []
        self.dequantized = [(q.float() * s[:, None], oq.float() * os[:, None]) for q, s, oq, os in self.int8]
        self.head = ScreenedArgmax(self.model.lm_head) if self.screen_head else None
        self._steps = self._fused_steps() if self.fused else None
        self.fused = self._steps is not None
        self._token = TokenStep.build(self) if self.one_call and self.fused else None  # makes stale FFN copies again
        self.one_call = self._token is not None
        self._made = Made(self._sources())  # as they are now: the FFNs' copies included

    def _sources(self) -> list[Tensor]:
        return [*self.model.parameters(), *self.model.buffers()]

    def _fused_steps(self) -> list[tuple] | None:
        """What the C decoding step reads per layer (the model's tensors and :attr:`qkv`'s: the input norm's weight
        with eps and plus_one (eps < 0: none), the per-head (or whole-width) query and key norms' and the norm after
        the attention (Qwen3's, Gemma's; None, 0.0, 0 for none), the values' norm's eps, whether the layer shares an
        earlier layer's cache and whether its query and key norms span every head, q/k/v stacked and its bias,
        o_proj's weight and bias (Granite's scaled), then the FFN's norm before it (eps < 0: none) and the one after
        it (Gemma 2's and 3's, GLM-4's, OLMo 2's; None for none)), then the final norm's; None where it does not
        apply."""
        kernels, inner, none, unnormed = _native.library(), self.model.model, (None, 0.0, 0), (None, -1.0, 0)
        if kernels is None or self.clip is not None or any(
                layout.torch_only(layer) for layer in inner.layers) or any(
                head_dim % 2 or self.heads % kv_heads or cos.shape[-1] % 2 or cos.shape[-1] > head_dim
                for head_dim, kv_heads, (cos, _) in zip(self.head_dims, self.kv_heads, self.rotary)):
            return None
        final = layout.rms_norm(inner.norm)
        steps = []
        for i, (layer, (weight, bias, _), head_dim) in enumerate(zip(inner.layers, self.qkv, self.head_dims)):
            a = layer.self_attn
            late = hasattr(a, "query_layernorm")  # HunYuan's per-head norms, after the rotation
            names = ("query_layernorm", "key_layernorm") if late else ("q_norm", "k_norm")
            per_head = tuple(layout.rms_norm(getattr(a, n)) if hasattr(a, n) else none for n in names)
            # Gemma 4's norm of the values, without weight (eps < 0: none, as for a norm before the attention or FFN)
            values = layout.rms_norm(a.v_norm, head_dim) if hasattr(a, "v_norm") else unnormed
            before, after, ffn_before, ffn_after = layout.norms(layer)
            norms = (layout.rms_norm(before) if before else unnormed,
                     layout.rms_norm(ffn_before) if ffn_before else unnormed,
                     layout.rms_norm(after) if after else none, layout.rms_norm(ffn_after) if ffn_after else none)
            whole = layout.whole_width(a, head_dim)  # OLMo 2's norms over every head's query at once, and key
            tensors = [weight, bias, a.o_proj.weight, a.o_proj.bias]
            scale = getattr(layer, "residual_multiplier", 1.0)  # Granite's, on layers without norms after: in o_proj
            if scale != 1.0 and type(a.o_proj) is nn.Linear:
                tensors[2:] = [None if t is None else (t * scale).contiguous() for t in tensors[2:]]
            if (None in norms or None in per_head or values is None or values[0] is not None or final is None
                    or type(a.o_proj) is not nn.Linear or not all(
                        t is None or t.dtype is torch.float32 and t.is_cpu and t.is_contiguous() for t in tensors)):
                return None
            int8 = (None,) * 4
            if self.int8_attention:  # o's scales carry Granite's scale as its float32 weight does
                q, qs, oq, os = self.int8[i]
                int8 = (q, qs, oq, (os * scale).contiguous() if scale != 1.0 else os)
            steps.append((norms[0], per_head[0] + per_head[1] + norms[2] + (values[1], int(self.owners[i] != i),
                                                                             int(whole), int(late)),
                          *tensors, norms[1], norms[3] if ffn_after else None, int8))
        return steps + [final]

    def _one_call(self) -> bool:
        """Whether tokens go through :class:`TokenStep`, one C call for all their layers (the int8 probe turns the
        decoder's int8 attention off, and so the call it was built with)."""
        return self._token is not None and self._token.int8_attention == self.int8_attention

    def _prompt_rows_in_c(self) -> int:
        """The longest prompt :class:`TokenStep` takes a row at a time (:data:`PROMPT_ROWS_IN_C`; 0: none)."""
        if not (self._one_call() and self.int8_attention):
            return 0
        return PROMPT_ROWS_IN_C.get(self._token.ffn_rows, 0)

    def _embed(self, ids: Tensor) -> Tensor:
        return self.model.model.embed_tokens(ids) * self.embedding_multiplier

    def _step(self, ids: Tensor, start: int, keys: list[Tensor], values: list[Tensor]) -> Tensor:
        """:meth:`_forward` by the C decoding step: one token, or a prompt's tokens where :class:`TokenStep` takes
        them."""
        kernels, inner, d = _native.library(), self.model.model, self.model.config.hidden_size
        h = self._embed(ids)
        if self._one_call():
            return self._token(h.reshape(-1, d).contiguous(), start, keys, values)
        per_layer = torch_path.per_layer_inputs(inner, ids, h)
        h = h.reshape(d).contiguous()
        x, y = torch.empty(1, 1, d, dtype=h.dtype), torch.empty(d, dtype=h.dtype)
        threads = torch.get_num_threads()
        for i, (layer, (norm, norms, qkv, qkv_b, o_w, o_b, ffn, ffn_post, int8), (cos, sin), window, softcap, k_cache,
                v_cache, head_dim, kv_heads) in enumerate(zip(inner.layers, self._steps, self.rotary, self.windows,
                                                              self.softcaps, keys, values, self.head_dims,
                                                              self.kv_heads)):
            row = head_dim * h.element_size()
            q_w, q_eps, q_plus_one, k_w, k_eps, k_plus_one, post_w, post_eps, post_plus_one, *flags = norms
            first = 0 if window is None else max(0, start + 1 - window)  # the window's first position
            if kernels.decode_attention_f32(
                    h.data_ptr(), pointer(norm[0]), *norm[1:], pointer(q_w), q_eps, q_plus_one, pointer(k_w), k_eps,
                    k_plus_one, pointer(post_w), post_eps, post_plus_one, *flags, qkv.data_ptr(), pointer(qkv_b),
                    o_w.data_ptr(), pointer(o_b), *(pointer(t if self.int8_attention else None) for t in int8),
                    cos[start].data_ptr(), sin[start].data_ptr(),
                    k_cache.data_ptr() + first * row, v_cache.data_ptr() + first * row, start - first,
                    k_cache.shape[2], d, self.heads, kv_heads, head_dim, cos.shape[-1],
                    float(layer.self_attn.scaling),
                    float(softcap or 0.0), threads) < 0:
                raise MemoryError("LeanDecoder: the decoding step could not allocate its buffers")
            if ffn[1] < 0:  # no norm before the FFN (OLMo 2's)
                x.view(d).copy_(h)
            else:
                kernels.rms_norm_f32(h.data_ptr(), ffn[0].data_ptr(), x.data_ptr(), d, *ffn[1:])
            if ffn_post is None:  # Granite's scale of the FFN's output, where it has one
                h += torch_path.ffn(layer, x, h.view(1, 1, d)).reshape(d) * getattr(layer, "residual_multiplier", 1.0)
            else:  # Gemma 2's and 3's norm of the FFN's output
                out = torch_path.ffn(layer, x, h.view(1, 1, d)).reshape(d).contiguous()  # held while C reads it
                kernels.rms_norm_f32(out.data_ptr(), ffn_post[0].data_ptr(), y.data_ptr(), d, *ffn_post[1:])
                h += y
            if per_layer is not None:  # Gemma 4's, as the torch path adds them
                h += torch_path.per_layer_input(layer, h.view(1, 1, d), per_layer[:, :, i]).reshape(d)
            if hasattr(layer, "layer_scalar"):
                h *= layer.layer_scalar
        out, final = torch.empty(1, d, dtype=h.dtype), self._steps[-1]
        kernels.rms_norm_f32(h.data_ptr(), final[0].data_ptr(), out.data_ptr(), d, *final[1:])
        return out

    def _forward(self, ids: Tensor, start: int, keys: list[Tensor], values: list[Tensor]) -> Tensor:
        """The last position's final hidden state (1, d) for the tokens ``ids`` (1, T) at positions
        start..start+T−1, writing their keys and values into the cache: a prompt (start 0) or one token, by the C
        step where it applies, else by the torch path (:func:`~lambda_gelu.inference.torch_path.forward`)."""
        if self._steps is not None and (ids.shape[1] == 1 or ids.shape[1] <= self._prompt_rows_in_c()):
            return self._step(ids, start, keys, values)
        return torch_path.forward(self, ids, start, keys, values)

    def _logits(self, hidden: Tensor) -> Tensor:
        """The output layer's logits, scaled as Cohere and Granite scale them (logit_scale, logits_scaling; > 0) and
        soft-capped as the model caps them (Gemma 2's final_logit_softcapping): neither moves the largest."""
        logits, cap = self.model.lm_head(hidden) * self.logit_scale / self.logits_scaling, self.final_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    @torch.inference_mode()
    def generate(self, input_ids: Tensor, max_new_tokens: int, eos_token_id: int | None = None, *,
                 do_sample: bool = False, temperature: float | None = None, top_k: int | None = None,
                 top_p: float | None = None, streamer=None) -> Tensor:
        """The prompt (1, T) followed by up to ``max_new_tokens`` tokens, stopping after ``eos_token_id`` if given:
        greedy — the tokens ``model.generate(input_ids, max_new_tokens=..., do_sample=False)`` gives — or with
        ``do_sample=True`` drawn as ``model.generate(..., do_sample=True, temperature=, top_k=, top_p=)`` draws them:
        transformers' own temperature, top-k and top-p warpers on the float32 logits, each setting not given taken
        from ``model.generation_config`` as ``generate`` takes it (transformers' default top_k is 50), then one
        ``torch.multinomial`` a token from torch's global generator (``torch.manual_seed`` repeats a draw). Sampling
        computes every logit; only greedy decoding takes the output layer's screen. ``streamer``, as ``generate``
        takes one (transformers' ``TextStreamer``, or anything with ``put`` and ``end``): ``put`` the prompt, then
        each new token as soon as it is decided, then ``end()``."""
        warpers = settings_warpers(self.model.generation_config, temperature, top_k, top_p) if do_sample else None
        if input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] < 1:
            raise ValueError(f"LeanDecoder decodes one sequence: input_ids of shape (1, T ≥ 1), got "
                             f"{tuple(input_ids.shape)}")
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens is a number of tokens ≥ 0, got {max_new_tokens!r}")
        total = input_ids.shape[1] + max_new_tokens
        if total > self.max_length:
            raise ValueError(f"the prompt's {input_ids.shape[1]} tokens and {max_new_tokens} new ones exceed the "
                             f"decoder's max_length {self.max_length}: build it with a larger max_length")
        if self._made.stale(self._sources()):
            self.refresh()
        keys, values = self._cache(total), self._cache(total)
        out, start, step = [input_ids], 0, input_ids
        put = streamer.put if streamer is not None else None
        if put:
            put(input_ids.cpu())
        for made in range(max_new_tokens):
            if warpers is None and made and self._one_call() and self._token.head is self.head is not None:
                rest = self._token.greedy(int(step), start, max_new_tokens - made, keys, values, self._embed,
                                          self._logits, eos_token_id, put)  # each token one C call from here
                out.append(torch.tensor([rest], dtype=input_ids.dtype))
                break
            hidden = self._forward(step, start, keys, values)
            start += step.shape[1]
            if warpers is not None:
                scores = warpers(torch.cat(out, 1), self._logits(hidden).float())
                token = torch.multinomial(F.softmax(scores, -1), 1)
            else:  # the screen's argmax of the logits before a soft cap is theirs after it: tanh is increasing
                token = self.head(hidden) if self.head is not None else self._logits(hidden).argmax(-1)
            step = token.reshape(1, 1).to(input_ids.dtype)
            out.append(step)
            if put:
                put(step.reshape(1).cpu())
            if eos_token_id is not None and int(step) == eos_token_id:
                break
        if streamer is not None:
            streamer.end()
        return torch.cat(out, 1)

    def _cache(self, length: int) -> list[Tensor]:
        """One layer's keys (or values) for ``length`` positions, per layer, uninitialised; a layer that reads an
        earlier layer's keys and values (Gemma 4's shared layers) holds that layer's tensor."""
        weight, caches = self.qkv[0][0], []
        for i, (owner, kv_heads, head_dim) in enumerate(zip(self.owners, self.kv_heads, self.head_dims)):
            caches.append(caches[owner] if owner != i else torch.empty(1, kv_heads, length, head_dim,
                                                                        dtype=weight.dtype, device=weight.device))
        return caches

    @torch.inference_mode()
    def _probe(self) -> str | None:
        """Why the model's own forward disagrees with this one on a probe prompt and two decoding steps (None if
        it agrees)."""
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(0, self.model.config.vocab_size, (1, 8), generator=generator).to(self.qkv[0][0].device)
        full = self.model(ids).logits[0]
        keys, values = self._cache(8), self._cache(8)
        ours = [self._logits(self._forward(ids[:, :6], 0, keys, values))[0]]
        ours += [self._logits(self._forward(ids[:, i:i + 1], i, keys, values))[0] for i in (6, 7)]
        theirs = full[[5, 6, 7]]
        scale = theirs.abs().max().clamp(min=1e-6)
        gap = float((torch.stack(ours) - theirs).abs().max() / scale)
        return None if gap <= PROBE_TOLERANCE else (f"gives other logits on a probe prompt than this decoder (by "
                                                    f"{gap:.2g} of their scale)")

    @torch.inference_mode()
    def _probe_int8(self) -> str | None:
        """Why the C step (the probe prompt's rows too, where the one call takes them; else the prompt's integer sums)
        over the attention's int8 rows disagrees with the torch path over the same rows, dequantized, on the probe
        prompt and its two decoding steps (None if they agree, or if there is no C step): the two differ by the
        rounding of the projections' inputs to 16 bits and the float rounding of the two paths."""
        if self._steps is None:
            return None
        ids = torch.randint(0, self.model.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
        ids = ids.to(self.qkv[0][0].device)

        def steps():
            keys, values = self._cache(8), self._cache(8)
            self._forward(ids[:, :6], 0, keys, values)
            return torch.stack([self._logits(self._forward(ids[:, i:i + 1], i, keys, values))[0] for i in (6, 7)])
        ours = steps()
        fused, self._steps = self._steps, None
        try:
            theirs = steps()
        finally:
            self._steps = fused
        gap = float((ours - theirs).abs().max() / theirs.abs().max().clamp(min=1e-6))
        return None if gap <= PROBE_TOLERANCE else (f"gives other logits over its int8 attention rows in C than in "
                                                    f"torch (by {gap:.2g} of their scale)")
