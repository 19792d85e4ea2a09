"""Sampled decoding's settings as transformers' ``generate`` takes them, and its warpers: what
:meth:`~lambda_gelu.inference.decoder.LeanDecoder.generate` applies to the float32 logits before drawing a token."""
from __future__ import annotations

__all__ = ["settings_warpers", "setting", "warpers"]


def settings_warpers(config, temperature: float | None, top_k: int | None, top_p: float | None):
    """transformers' warpers for the settings given, each one not given taken as ``generate`` takes it
    (:func:`setting`), in its order and on its conditions (:func:`warpers`)."""
    return warpers(*(setting(config, name, given) for name, given in (
        ("temperature", temperature), ("top_k", top_k), ("top_p", top_p))))


def setting(config, name: str, given):
    """A sampling setting as ``generate`` takes it: given, else the model's generation config's, else transformers'
    default (which transformers 5 leaves unset in the config and fills in at ``generate``)."""
    if given is not None:
        return given
    value = getattr(config, name, None)
    return value if value is not None else getattr(type(config), "_get_default_generation_params", dict)().get(name)


def warpers(temperature: float | None, top_k: int | None, top_p: float | None):
    """transformers' warpers for these settings, in the order and on the conditions its ``generate`` applies them
    (None: that warper left out)."""
    from transformers.generation.logits_process import (LogitsProcessorList, TemperatureLogitsWarper,
                                                        TopKLogitsWarper, TopPLogitsWarper)
    temperature = 1.0 if temperature is None else temperature
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
        raise ValueError(f"temperature is a number > 0 (do_sample=False for greedy decoding), got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
        raise ValueError(f"top_k is a number of tokens ≥ 0 (0 or None: no top-k), got {top_k!r}")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
        raise ValueError(f"top_p is a probability in (0, 1] (1 or None: no top-p), got {top_p!r}")
    chain = LogitsProcessorList()
    if temperature != 1.0:
        chain.append(TemperatureLogitsWarper(float(temperature)))
    if top_k:
        chain.append(TopKLogitsWarper(top_k))
    if top_p is not None and top_p < 1.0:
        chain.append(TopPLogitsWarper(float(top_p)))
    return chain
