"""Optimizer-aware parameter groups: λ gets its own learning rate and no weight decay."""
from __future__ import annotations

import numbers

import torch.nn as nn

from .convert import lambda_modules

__all__ = ["lambda_param_groups", "DEFAULT_MULTIPLIER"]

DEFAULT_MULTIPLIER = 9.0


def lambda_param_groups(
    model: nn.Module, lr: float, weight_decay: float = 0.0, multiplier: float = DEFAULT_MULTIPLIER
) -> list[dict]:
    """Parameter groups for any ``torch.optim`` optimizer (SGD, AdamW, ...).

    Every λ parameter (``LambdaGELU.s``) goes into a group named ``"lambda"`` with learning rate
    ``multiplier * lr`` and ``weight_decay=0`` — decay would drag s towards 0, i.e. λ towards
    1 + ln 2, which is not a prior anybody wants. All other parameters form the group ``"default"``
    with ``lr`` and ``weight_decay``. Learning-rate schedulers scale both groups alike, so the
    ratio c stays fixed. ``torch.optim.AdamW(lambda_param_groups(model, lr=1e-3, weight_decay=0.05))``.
    """
    for name, value, low in (("lr", lr, 0.0), ("weight_decay", weight_decay, 0.0), ("multiplier", multiplier, 0.0)):
        if not isinstance(value, numbers.Real) or not value >= low:
            raise ValueError(f"{name} must be a number ≥ {low}, got {value!r}")
    lam_params = {id(m.s): m.s for _, m in lambda_modules(model)}
    if not lam_params:
        raise ValueError("lambda_param_groups found no LambdaGELU in the model; "
                         "call lambda_gelu.convert_to_lambda_gelu_(model) first")
    others = [p for p in model.parameters() if id(p) not in lam_params]
    groups = [{"params": others, "lr": lr, "weight_decay": weight_decay, "name": "default"}] if others else []
    groups.append({"params": list(lam_params.values()), "lr": lr * multiplier, "weight_decay": 0.0, "name": "lambda"})
    return groups
