"""Finding GELU applied as a function (``F.gelu(x)`` inside some ``forward``): no module replacement can make it
ReLU, so ``reluize`` refuses such a model before changing anything."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..batches import run_batch
from ..convert import eval_mode, is_gelu_like

__all__ = ["functional_gelu_calls"]


class _GeluCallsOutsideModules(TorchFunctionMode):
    """Records calls of ``F.gelu`` made while no GELU-like module is running."""

    def __init__(self):
        super().__init__()
        self.depth, self.calls = 0, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.gelu and self.depth == 0:
            self.calls += 1
        return func(*args, **(kwargs or {}))


def functional_gelu_calls(model: nn.Module, batch) -> list[str]:
    """The modules whose forward applies gelu as a function (found by running ``batch`` once)."""
    mode, found, stack = _GeluCallsOutsideModules(), [], []

    def enter(name, m):
        def hook(*_):
            if is_gelu_like(m):
                mode.depth += 1
            stack.append((name, mode.calls))
        return hook

    def leave(name, m):
        def hook(*_):
            if is_gelu_like(m):
                mode.depth -= 1
            _, before = stack.pop()
            if mode.calls > before and not found:  # the innermost module that called it
                found.append(f"{type(m).__qualname__} at {name or '<root>'!r}")
        return hook

    handles = []
    for name, m in model.named_modules():
        handles.append(m.register_forward_pre_hook(enter(name, m)))
        handles.append(m.register_forward_hook(leave(name, m)))
    try:
        with torch.no_grad(), mode, eval_mode(model):
            run_batch(model, batch)
    finally:
        for h in handles:
            h.remove()
    return found
