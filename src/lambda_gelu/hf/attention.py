"""The attention a Hugging Face student trains with. Under bfloat16 on a CPU it is transformers' eager attention
(two matrix products and a softmax) rather than SDPA, the one models load with: SDPA's bfloat16 backward there is the
slower at a conversion's sentences of a few dozen tokens (SmolLM2's step: ``python benchmarks/bench_distill.py``
times both). The two compute the same attention, rounded differently; the model gets back the implementation it was
loaded with before it is measured and saved, so the checkpoint is the original's in this respect.
"""
from __future__ import annotations

import torch
import torch.nn as nn

__all__ = ["training_attention_", "set_attention_", "attention_of"]


def _hugging_face(model: nn.Module):
    """The outermost transformers model in ``model`` (itself, or a sentence-transformers module's), or None."""
    return next((m for m in model.modules() if hasattr(m, "set_attn_implementation")
                 and hasattr(getattr(m, "config", None), "_attn_implementation")), None)


def training_attention_(model: nn.Module, autocast: torch.dtype | None, device: torch.device) -> str | None:
    """Switches ``model`` from SDPA to eager attention if it will train under bfloat16 on a CPU. Returns the
    implementation to give back with :func:`set_attention_` (None: nothing was changed)."""
    inner = _hugging_face(model)
    if inner is None or autocast != torch.bfloat16 or device.type != "cpu" \
            or inner.config._attn_implementation != "sdpa":
        return None
    inner.set_attn_implementation("eager")
    return "sdpa"


def set_attention_(model: nn.Module, implementation: str | None) -> None:
    """Gives ``model`` the attention ``implementation`` (None: leaves it as it is)."""
    if implementation is not None:
        _hugging_face(model).set_attn_implementation(implementation)


def attention_of(model: nn.Module) -> str | None:
    """The attention implementation ``model`` runs (None: not a transformers model)."""
    inner = _hugging_face(model)
    return None if inner is None else inner.config._attn_implementation
