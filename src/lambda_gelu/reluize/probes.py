"""Finding GELU or SiLU applied as a function (``F.gelu(x)`` inside some ``forward``): no module replacement can
make it ReLU, so ``reluize`` refuses such a model before changing anything."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..batches import run_batch
from ..convert import eval_mode, is_reluizable, is_silu_like

__all__ = ["functional_gelu_calls"]


class _GateCallsOutsideModules(TorchFunctionMode):
    """Records calls of the gate functions ``watched`` made while no GELU- or SiLU-like module is running."""

    def __init__(self, watched: tuple):
        super().__init__()
        self.watched, self.depth, self.calls, self.names = watched, 0, 0, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.watched and self.depth == 0:
            self.calls += 1
            self.names.append(func.__name__)
        return func(*args, **(kwargs or {}))


def functional_gelu_calls(model: nn.Module, batch) -> list[str]:
    """The modules whose forward applies a gate the conversion turns into ReLU as a function — gelu always, silu
    where the model has SiLU modules to convert — each as "Class at 'name' applies gelu" (found by running
    ``batch`` once)."""
    watched = (F.gelu, F.silu) if any(is_silu_like(m) for m in model.modules()) else (F.gelu,)
    mode, found, stack = _GateCallsOutsideModules(watched), [], []

    def enter(name, m):
        def hook(*_):
            if is_reluizable(m):
                mode.depth += 1
            stack.append((name, mode.calls))
        return hook

    def leave(name, m):
        def hook(*_):
            if is_reluizable(m):
                mode.depth -= 1
            _, before = stack.pop()
            if mode.calls > before and not found:  # the innermost module that called it
                found.append(f"{type(m).__qualname__} at {name or '<root>'!r} applies {mode.names[-1]}")
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
