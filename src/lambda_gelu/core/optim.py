"""Optimizer-aware parameter groups: λ gets its own learning rate and no weight decay."""
from __future__ import annotations

import numbers
from collections.abc import Iterable

import torch.nn as nn

from .config import DEFAULTS
from .convert import lambda_modules

__all__ = ["lambda_param_groups", "DEFAULT_MULTIPLIER"]

DEFAULT_MULTIPLIER = DEFAULTS.multiplier


def lambda_param_groups(
    model: nn.Module, lr: float, weight_decay: float = 0.0, multiplier: float | None = None, *,
    groups: Iterable[dict] | None = None, no_decay_1d: bool = False,
) -> list[dict]:
    """Parameter groups for any ``torch.optim`` optimizer (SGD, AdamW, ...).

    Every λ parameter (``LambdaGELU.s``) goes into a group named ``"lambda"`` with learning rate
    ``multiplier * lr`` (``multiplier`` defaults to c = :data:`lambda_gelu.DEFAULTS.multiplier`)
    and ``weight_decay=0`` — decay would drag s towards 0, i.e. λ towards 1 + ln 2, which is not a
    prior anybody wants. Learning-rate schedulers scale all groups alike, so the ratio c stays fixed.

    Without ``groups``, every other parameter forms the group ``"default"`` with ``lr`` and
    ``weight_decay``; with ``no_decay_1d=True`` biases and normalisation weights (parameters with
    at most one dimension) go to a group ``"no_decay"`` with ``weight_decay=0``, as is usual for
    transformers.

    With ``groups`` (your own parameter groups: layer-wise learning rates, no-decay sets, ...), they
    are kept as they are, except that λ parameters are taken out of them: the λ of each group goes
    to a ``"lambda"`` group with c times that group's learning rate (or ``lr`` where it sets none)
    and no weight decay. Parameters of the model that no group holds are an error, as in any optimizer.

        torch.optim.AdamW(lambda_param_groups(model, lr=1e-3, weight_decay=0.05))
    """
    multiplier = DEFAULT_MULTIPLIER if multiplier is None else multiplier
    for name, value in (("lr", lr), ("weight_decay", weight_decay), ("multiplier", multiplier)):
        if not isinstance(value, numbers.Real) or isinstance(value, bool) or not value >= 0:
            raise ValueError(f"{name} must be a number ≥ 0, got {value!r}")
    lam_params = {id(m.s): m.s for _, m in lambda_modules(model)}
    if not lam_params:
        raise ValueError("lambda_param_groups found no LambdaGELU in the model; "
                         "call lambda_gelu.convert_to_lambda_gelu_(model) first")
    if groups is None:
        others = [p for p in model.parameters() if id(p) not in lam_params]
        decayed = [p for p in others if not (no_decay_1d and p.dim() <= 1)]
        out = [{"params": decayed, "lr": lr, "weight_decay": weight_decay, "name": "default"}] if decayed else []
        if len(decayed) < len(others):
            out.append({"params": [p for p in others if no_decay_1d and p.dim() <= 1], "lr": lr, "weight_decay": 0.0,
                        "name": "no_decay"})
        return out + [{"params": list(lam_params.values()), "lr": lr * multiplier, "weight_decay": 0.0,
                       "name": "lambda"}]

    out, seen = [], set()
    for i, group in enumerate(groups):
        if not isinstance(group, dict) or "params" not in group:
            raise ValueError(f"groups[{i}] must be a dict with 'params', as for torch.optim, got {group!r}")
        params = list(group["params"])
        seen.update(id(p) for p in params)
        rest = [p for p in params if id(p) not in lam_params]
        lams = [p for p in params if id(p) in lam_params]
        if rest:
            out.append({**group, "params": rest})
        if lams:
            out.append({**group, "params": lams, "lr": group.get("lr", lr) * multiplier, "weight_decay": 0.0,
                        "name": "lambda"})
    missing = [id(p) for p in lam_params.values() if id(p) not in seen]
    if missing:  # the usual case: groups built before conversion, or over the other parameters only
        out.append({"params": [lam_params[i] for i in missing], "lr": lr * multiplier, "weight_decay": 0.0,
                    "name": "lambda"})
    unheld = [n for n, p in model.named_parameters() if id(p) not in seen and id(p) not in lam_params]
    if unheld:
        raise ValueError(f"groups hold no entry for {len(unheld)} parameters of the model (e.g. {unheld[0]!r}); "
                         "give every parameter a group")
    return out
