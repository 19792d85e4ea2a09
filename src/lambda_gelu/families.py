"""What the library knows of each model family, in one table: where a family keeps its FFN's parts (gated or not),
its decoder layer's norms, its experts' parameters, and the llama.cpp architecture its GGUF export is written as.

Everything that looks for these parts reads :data:`FAMILIES` when it looks — :func:`~lambda_gelu.inference.sparse.
sparsify_` (the layers after a ReLU, the gated FFNs, the experts), the gate threshold of
:mod:`lambda_gelu.reluize.threshold`, :class:`~lambda_gelu.inference.decoder.LeanDecoder` (the norms) and
:func:`~lambda_gelu.deploy.gguf.export_gguf` — so a family whose parts have other names is one row more::

    from lambda_gelu import families
    families.add(families.Family("Mixtral's experts of old", ffn=families.Gated("w1", "w3", "w2", "act_fn")))

A row names modules only; what a module computes is always checked on a probe input before it is replaced, so a
row can never make the library compute something else than the model does. Which activations a conversion turns
into ReLU is not a family's: any GELU or SiLU module or config field is (:mod:`lambda_gelu.core.convert`).
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Family", "Gated", "Ungated", "FAMILIES", "add", "gated_layouts", "ungated_layouts", "norm_layouts", "gguf_classes",
           "expert_parameters", "gguf_architecture"]


@dataclass(frozen=True)
class Gated:
    """A gated FFN's attributes: ``down(act(gate(x)) * up(x))``. One whose ``gate`` and ``up`` are the same layer is
    *bundled*: that layer's rows are the gate's, then up's, in two halves (Phi-3's ``gate_up_proj``, which its forward
    splits with ``chunk(2, dim=-1)``)."""
    gate: str
    up: str
    down: str
    act: str

    @property
    def bundled(self) -> bool:
        return self.gate == self.up


@dataclass(frozen=True)
class Ungated:
    """An ungated FFN's attributes: ``second(act(first(x)))``."""
    first: str
    act: str
    second: str


Norms = tuple  # a decoder layer's norms: before the attention, after it, before the FFN, after it (None: none)


@dataclass(frozen=True)
class Family:
    name: str
    ffn: Gated | Ungated | None = None
    norms: Norms | None = None
    experts: tuple[str, str] | None = None  # a fused experts module's parameters: (E, 2I, H) gate and up, (E, H, I)
    gguf: str | None = None  # the llama.cpp architecture the family's GGUF export is written as
    classes: tuple[str, ...] = ()  # the transformers classes exported as ``gguf``


_LLAMA_NORMS = ("input_layernorm", None, "post_attention_layernorm", None)
_SWIGLU = Gated("gate_proj", "up_proj", "down_proj", "act_fn")

FAMILIES: list[Family] = [
    Family("Llama, Mistral, Qwen2/3, SmolLM (SwiGLU); Gemma 1 (GeGLU)", _SWIGLU, _LLAMA_NORMS, gguf="llama",
           classes=("LlamaForCausalLM", "MistralForCausalLM")),
    Family("Gemma 2, 3 and 4 (GeGLU)", _SWIGLU,
           ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"),
           gguf="gemma3", classes=("Gemma3ForCausalLM",)),
    Family("GLM-4", Gated("gate_up_proj", "gate_up_proj", "down_proj", "activation_fn"),
           ("input_layernorm", "post_self_attn_layernorm", "post_attention_layernorm", "post_mlp_layernorm")),
    Family("OLMo 2 and 3 (norms after, not before)", _SWIGLU,
           (None, "post_attention_layernorm", None, "post_feedforward_layernorm")),
    Family("VaultGemma", _SWIGLU, ("input_layernorm", None, "pre_feedforward_layernorm", None)),
    # one norm before both, the attention and the FFN reading the layer's input side by side
    Family("Cohere", _SWIGLU, ("input_layernorm", None, "input_layernorm", None)),
    Family("Llama 4", Gated("gate_proj", "up_proj", "down_proj", "activation_fn"), _LLAMA_NORMS),
    Family("Phi-3, Phi-4-mini, GLM (gate and up bundled)", Gated("gate_up_proj", "gate_up_proj", "down_proj",
                                                                 "activation_fn"), _LLAMA_NORMS),
    Family("T5 v1.1, Flan-T5, mT5, UMT5 (GeGLU)", Gated("wi_0", "wi_1", "wo", "act")),
    Family("ModernBERT and its decoder (bundled)", Gated("Wi", "Wi", "Wo", "act")),
    Family("GPT-2 (Conv1D), StarCoder2", Ungated("c_fc", "act", "c_proj")),
    Family("GPT-NeoX (Pythia), Falcon", Ungated("dense_h_to_4h", "act", "dense_4h_to_h")),
    Family("Phi-1 and 2, OPT, BART and their kinds", Ungated("fc1", "activation_fn", "fc2")),
    Family("GPT-J", Ungated("fc_in", "act", "fc_out")),
    Family("T5 v1.0 (ReLU as trained)", Ungated("wi", "act", "wo")),
    Family("transformers' fused experts (Qwen3-MoE, OLMoE, Mixtral, ...)", experts=("gate_up_proj", "down_proj")),
]


def add(family: Family) -> None:
    """One more row, read by everything from the next call on (the table is a list: tests and users extend it)."""
    if not isinstance(family, Family):
        raise TypeError(f"a families row is a Family, got {type(family).__name__}")
    FAMILIES.append(family)


def _unique(items):
    return tuple(dict.fromkeys(i for i in items if i is not None))


def gated_layouts() -> tuple[Gated, ...]:
    return _unique(f.ffn for f in FAMILIES if isinstance(f.ffn, Gated))


def ungated_layouts() -> tuple[Ungated, ...]:
    return _unique(f.ffn for f in FAMILIES if isinstance(f.ffn, Ungated))


def norm_layouts() -> tuple[Norms, ...]:
    """The norm layouts, most names first (a layer takes the first whose every named norm it has: Gemma's four before
    Llama's two, Llama's two before Cohere's one), the table's order among equals."""
    layouts = _unique(f.norms for f in FAMILIES)
    return tuple(sorted(layouts, key=lambda names: -len({n for n in names if n})))


def expert_parameters() -> tuple[tuple[str, str], ...]:
    return _unique(f.experts for f in FAMILIES)


def gguf_architecture(class_name: str) -> str | None:
    """The llama.cpp architecture a transformers class is exported as, or None."""
    return next((f.gguf for f in FAMILIES if class_name in f.classes), None)


def gguf_classes() -> tuple[str, ...]:
    return tuple(c for f in FAMILIES if f.gguf for c in f.classes)
