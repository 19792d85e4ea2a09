"""Run a forward only as far as a hook needs: the hook captures what a module receives or returns, then stops
the forward by raising :class:`Stop` (the refit and the blockwise schedule need one layer's input, not the
network's output)."""
from __future__ import annotations

import torch.nn as nn

from ..batches import run_batch


class Stop(Exception):
    """Raised from a hook once what it came for is captured: the rest of the forward is not needed."""


def run_to_hook(model: nn.Module, batch, handle) -> None:
    """Run ``batch`` through ``model`` until the hook behind ``handle`` has what it came for; remove it."""
    try:
        run_batch(model, batch)
    except Stop:
        pass
    finally:
        handle.remove()
