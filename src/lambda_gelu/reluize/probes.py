"""What one forward of a batch shows before a conversion: GELU or SiLU applied as a function (``F.gelu(x)`` inside
some ``forward``), which no module replacement can make ReLU, so ``reluize`` converts every activation module and
leaves such a call as it is, saying where; and the activation modules the batch never reaches (a multimodal model's
vision tower, on text), which a conversion would make ReLU without ever training them."""
from __future__ import annotations

import re

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..core.batches import run_batch
from ..core.convert import eval_mode, is_reluizable, is_silu_like

__all__ = ["functional_gelu_calls", "never_reached", "run_hooked"]


class _GateCallsOutsideModules(TorchFunctionMode):
    """Counts calls of the gate functions ``watched`` made while no GELU- or SiLU-like module is running, and names
    the last."""

    def __init__(self, watched: tuple):
        super().__init__()
        self.watched, self.depth, self.calls, self.claimed, self.last = watched, 0, 0, 0, ""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.watched and self.depth == 0:
            self.calls += 1
            self.last = func.__name__
        return func(*args, **(kwargs or {}))


def functional_gelu_calls(model: nn.Module, batch, silu: bool | None = None, reached: set | None = None) -> list[str]:
    """Where ``model``'s forward applies a gate the conversion turns into ReLU as a function, found by running
    ``batch`` once: gelu always, silu where the model has SiLU modules to convert (``silu=True``: always). One entry
    per class of the innermost module that calls it, in the order met: "Class at 'name' applies gelu", or "Class at
    'name' (and 29 more of its class) applies silu". ``reached``, where given, gets the activation modules the
    forward runs (for :func:`never_reached`, without a forward of its own)."""
    if silu is None:
        silu = any(is_silu_like(m) for m in model.modules())
    mode, stack = _GateCallsOutsideModules((F.gelu, F.silu) if silu else (F.gelu,)), []
    found: dict[tuple[str, str], dict] = {}  # (class, function) → the names of the modules calling it, in order

    def enter(m):
        def hook(*_):
            if is_reluizable(m):
                mode.depth += 1
                if reached is not None:
                    reached.add(m)
            stack.append(mode.calls)
        return hook

    def leave(name, m):
        def hook(*_):
            if is_reluizable(m):
                mode.depth -= 1
            before = stack.pop()
            if mode.calls > max(before, mode.claimed):  # calls of its own, not its submodules' (which claimed theirs)
                mode.claimed = mode.calls
                found.setdefault((type(m).__qualname__, mode.last), {})[name or "<root>"] = None
        return hook

    handles = []
    for name, m in model.named_modules():
        handles.append(m.register_forward_pre_hook(enter(m)))
        handles.append(m.register_forward_hook(leave(name, m)))
    with mode:
        run_hooked(model, batch, handles)
    return [f"{cls} at {next(iter(names))!r}" + (f" (and {len(names) - 1} more of its class)" if len(names) > 1 else "")
            + f" applies {func}" for (cls, func), names in found.items()]


def never_reached(model: nn.Module, reached: set) -> list[str]:
    """The GELU- and SiLU-like modules of ``model`` a forward that has run never reached (not in ``reached``), where
    none of their kind was either — the same name with any layer or expert number: a mixture's expert the batch routes
    nothing to is trained when another batch routes to it, a vision tower on text never is."""
    def kind(name: str) -> str:
        return re.sub(r"\.\d+(?=\.|$)", ".*", name)

    modules = {m: name for name, m in model.named_modules() if is_reluizable(m)}
    kinds = {kind(modules[m]) for m in reached if m in modules}
    return [name for m, name in modules.items() if m not in reached and kind(name) not in kinds]


def run_hooked(model: nn.Module, batch, handles: list, hidden_states: bool = False):
    """One forward of ``batch`` through ``model`` in eval mode without gradients, for the hooks ``handles`` to see;
    they are removed after it, whatever happens. Returns its output (``hidden_states``: as
    :func:`~lambda_gelu.core.batches.run_batch` asks for them)."""
    try:
        with torch.no_grad(), eval_mode(model):
            return run_batch(model, batch, hidden_states=hidden_states)
    finally:
        for h in handles:
            h.remove()
