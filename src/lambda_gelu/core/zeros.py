"""Exact zeros counted, the one way the library counts them: at chosen sites of a model (a module's output, or its
first input), over the real tokens of the batches (a batch's ``attention_mask`` leaves padding out), with the share
of each site's units (its last dimension) never active. What a sparse kernel can skip, layer by layer."""
from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn as nn

from .batches import attention_mask, run_batch
from .convert import eval_mode

__all__ = ["exact_zeros", "relu_sites"]


def relu_sites(model: nn.Module) -> list[tuple[str, nn.Module, str]]:
    """Every ``nn.ReLU``'s output, keyed by the module's name."""
    return [(name, m, "output") for name, m in model.named_modules() if isinstance(m, nn.ReLU)]


@torch.no_grad()
def exact_zeros(model: nn.Module, batches: Iterable, sites: list | None = None) -> dict[str, dict[str, float]]:
    """{key: {"zero_fraction", "outputs", "dead_fraction"}} over ``batches`` (any form
    :func:`~lambda_gelu.core.batches.run_batch` runs), at each site ``(key, module, "output" or "input")`` of
    ``sites`` (default: every ReLU's output): the fraction of its values that are exactly zero, how many values were
    seen, and the fraction of its units never active. Sites that share a key are counted together; ``-0`` is zero
    and NaN is not, as ``x == 0`` says."""
    sites = relu_sites(model) if sites is None else sites
    counts, mask = {}, {"now": None}

    def hook(key, where):
        def count(mod, args, out=None):
            x = out if where == "output" else args[0]
            m = mask["now"]
            values = x[m.bool()] if m is not None and m.shape == x.shape[:-1] else x
            zeros, total, active = counts.get(key, (0, 0, None))
            seen = (values.reshape(-1, values.shape[-1]) != 0).any(0) if values.dim() else (values != 0).reshape(1)
            active = seen if active is None or active.shape != seen.shape else active | seen
            counts[key] = (zeros + int((values == 0).sum()), total + values.numel(), active)
        return count

    handles = [m.register_forward_hook(hook(key, where)) if where == "output"
               else m.register_forward_pre_hook(hook(key, where)) for key, m, where in sites]
    try:
        with eval_mode(model):
            for b in batches:
                mask["now"] = attention_mask(b)
                run_batch(model, b)
    finally:
        for h in handles:
            h.remove()
    return {key: {"zero_fraction": zeros / total, "outputs": total,
                  "dead_fraction": 1.0 - active.float().mean().item()}
            for key, (zeros, total, active) in counts.items() if total}
