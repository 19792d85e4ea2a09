"""BatchNorm re-estimation: a swap to ReLU shifts the statistics of every later layer, while eval mode keeps
normalising with the GELU network's running statistics; re-estimating them over a few batches (forward passes,
no step) undoes that."""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable

import torch
import torch.nn as nn

from ..core.batches import run_batch
from ..core.convert import eval_mode

__all__ = ["recalibrate_batchnorm_", "batchnorms", "NO_BATCHNORM"]

NO_BATCHNORM = "recalibrate: the model has no BatchNorm with running statistics; leave it out"


def batchnorms(model: nn.Module) -> list[str]:
    """The names of ``model``'s BatchNorms that keep running statistics (what eval mode normalises with)."""
    return [name for name, m in model.named_modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is not None]


@torch.no_grad()
def recalibrate_batchnorm_(model: nn.Module, batches: Iterable) -> list[str]:
    """Re-estimate the running statistics of every BatchNorm in ``model`` from ``batches``: reset, then the
    plain average over all of them (momentum ``None``), each BatchNorm in train mode and every other module
    in eval mode (no dropout); no gradient, no parameter changes. Each module's mode and momentum are
    restored. Returns the names re-estimated; ``ValueError`` if there are none, or if a batch gives a
    BatchNorm one value per channel (no variance to estimate)."""
    names = batchnorms(model)
    if not names:
        raise ValueError(NO_BATCHNORM)
    batches = [batches] if isinstance(batches, torch.Tensor) else list(batches)
    if not batches:
        raise ValueError("recalibrate_batchnorm_ got no batches")
    norms = [model.get_submodule(n) for n in names]
    momenta = [m.momentum for m in norms]
    try:
        with eval_mode(model), two_values_per_channel(model, names):
            for m in norms:
                m.reset_running_stats()
                m.momentum = None
                m.train()
            for batch in batches:
                run_batch(model, batch)
    finally:
        for m, momentum in zip(norms, momenta):
            m.momentum = momentum
    return names


@contextlib.contextmanager
def two_values_per_channel(model: nn.Module, names: list[str]):
    """Within: a forward that gives one of these BatchNorms a single value per channel is a ValueError
    (a variance needs two; BatchNorm itself would fail deep inside the network, or not at all in eval mode)."""
    def check(name, module, args):
        x = args[0]
        if x.dim() < 2 or x.numel() <= x.shape[1]:
            raise ValueError(f"recalibrate: BatchNorm {name!r} got one value per channel (input of shape "
                             f"{tuple(x.shape)}), no variance to estimate: give batches of at least 2 samples, "
                             "or recalibrate=0")
    handles = [model.get_submodule(n).register_forward_pre_hook(functools.partial(check, n)) for n in names]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
