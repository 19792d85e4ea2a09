"""Activation modules a conversion leaves as they are: ``with kept(model, names):`` hides each named module behind a
:class:`KeptActivation`, which no conversion recognises (it holds the module without registering it; GELU and SiLU
modules have no weights, so the state dict is unchanged), and puts each back on exit.

    with kept(model, ["model.vision_tower.encoder.layers.0.mlp.activation_fn", ...]):
        lambda_gelu.reluize(model, text_batches, steps)   # the text model's activations only

A multimodal model's vision tower, which text never reaches, is what the CLI keeps so; a Hugging Face config then
names ReLU only where the network now has it (``text_config``'s field, not ``vision_config``'s:
:func:`lambda_gelu.core.convert.relu_config_problem` looks for the fields that rebuild the network as it is).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch.nn as nn

__all__ = ["KeptActivation", "kept", "keep_"]


class KeptActivation(nn.Module):
    """``module``, run as it is and invisible to ``named_modules`` (so to every conversion)."""

    def __init__(self, module: nn.Module):
        super().__init__()
        object.__setattr__(self, "kept_module", module)  # not a submodule

    def forward(self, *args, **kwargs):
        return self.kept_module(*args, **kwargs)

    def extra_repr(self) -> str:
        return f"kept: {self.kept_module!r}"


@contextlib.contextmanager
def kept(model: nn.Module, names: list[str]):
    """Within the block, the modules ``names`` of ``model`` are left out of any conversion; on exit each is back."""
    restore = keep_(model, names)
    try:
        yield
    finally:
        restore()


def keep_(model: nn.Module, names: list[str]) -> Callable[[], None]:
    """:func:`kept` without a block: hides the modules ``names`` and returns what puts them back."""
    places = []
    for name in names:
        parent, _, attr = name.rpartition(".")
        owner = model.get_submodule(parent)
        module = getattr(owner, attr)
        if any(t.numel() for t in (*module.parameters(), *module.buffers())):
            raise ValueError(f"kept: {name} holds weights, which a KeptActivation would hide from the state dict")
        places.append((owner, attr, module))
    for owner, attr, module in places:
        setattr(owner, attr, KeptActivation(module))

    def restore() -> None:
        for owner, attr, module in places:
            setattr(owner, attr, module)
    return restore
