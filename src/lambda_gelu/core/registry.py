"""Activation by name: ``get_act_layer("lambda_gelu")`` → class, ``create_act("gelu")`` → module."""
from __future__ import annotations

from collections.abc import Callable

import torch.nn as nn

from .module import LambdaGELU, LambdaSiLU

__all__ = ["get_act_layer", "create_act", "ACTIVATIONS"]

ACTIVATIONS: dict[str, Callable[..., nn.Module]] = {
    "lambda_gelu": LambdaGELU,
    "lambda_silu": LambdaSiLU,
    "gelu": nn.GELU,
    "relu": nn.ReLU,
    "prelu": nn.PReLU,
    "silu": nn.SiLU,
    "identity": nn.Identity,
}


def get_act_layer(spec: str | type[nn.Module] | Callable[..., nn.Module] | None):
    """Resolve a name (case and '-' insensitive), a module class / factory, or None (→ None)."""
    if spec is None or callable(spec):
        return spec
    if isinstance(spec, str):
        key = spec.lower().replace("-", "_")
        if key in ACTIVATIONS:
            return ACTIVATIONS[key]
        raise ValueError(f"unknown activation {spec!r}; known: {', '.join(sorted(ACTIVATIONS))}")
    raise TypeError(f"activation must be a name, a module class or None, got {spec!r}")


def create_act(spec, **kwargs) -> nn.Module | None:
    """``get_act_layer(spec)(**kwargs)``, or None for None."""
    layer = get_act_layer(spec)
    return None if layer is None else layer(**kwargs)
