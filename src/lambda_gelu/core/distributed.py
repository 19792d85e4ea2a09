"""λ under FSDP: every λ kept whole on every rank, its gradient averaged across the ranks.

FSDP (``torch.distributed.fsdp.fully_shard``) shards every parameter along its first dimension. A
per-layer λ is a 0-dim parameter, which ``fully_shard`` refuses, and a per-channel λ would be split
across ranks, while the hardening schedule reads λ whole to freeze and anneal it. λ is a few numbers
per layer, so nothing is gained by sharding it: leave it out of FSDP and average its gradient like
DDP does::

    convert_to_lambda_gelu_(model)
    model.to(device)                                      # before FSDP, which won't move λ
    lambdas = lambda_gelu.replicate_lambdas(model)
    for block in model.blocks:
        fully_shard(block, ignored_params=lambdas)
    fully_shard(model, ignored_params=lambdas)
    opt = torch.optim.AdamW(lambda_param_groups(model, lr=3e-4))
    schedule = HardeningSchedule(model, total_steps)      # as without FSDP

Every rank then holds the same λ, its state (the schedule's buffers) and its optimizer state, as
under DDP.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from .convert import lambda_modules

__all__ = ["replicate_lambdas"]


def replicate_lambdas(model: nn.Module, group: dist.ProcessGroup | None = None) -> set[nn.Parameter]:
    """The λ parameters of ``model``, to pass as ``fully_shard(..., ignored_params=...)``, their gradients
    averaged over ``group`` (default: the whole world) at the end of every backward.

    FSDP neither shards nor reduces the parameters it ignores, so this does: when a backward first
    accumulates into a λ, it queues one all-reduce of all of them, in a fixed order, for the end of that
    backward, as DDP does with its buckets. A rank whose forward skipped some λ (a branch taken on one
    rank and not on another) sends zeros for it; a λ no rank reached keeps no gradient. Every rank must
    reach at least one λ in each backward, or the others wait for it. It averages on every backward,
    also where FSDP skips its own reduction (``set_requires_gradient_sync(False)`` for gradient
    accumulation): the average of an average plus the new gradients is still the exact average, at the
    cost of a few floats sent. A second call adds no second reduction. Call it after the process group
    is initialized and before ``fully_shard``.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("replicate_lambdas averages λ's gradients across ranks and needs a process group: "
                           "call torch.distributed.init_process_group() first")
    params = {name: m.s for name, m in lambda_modules(model)}
    if not params:
        raise ValueError("replicate_lambdas found no LambdaGELU in the model; "
                         "call lambda_gelu.convert_to_lambda_gelu_(model) first")
    sharded = [name for name, p in params.items() if _is_sharded(p)]
    if sharded:
        raise ValueError(f"the λ of {sharded[0]!r} is sharded already: call replicate_lambdas before fully_shard "
                         "and pass its result as fully_shard(..., ignored_params=...)")
    new = [p for p in dict.fromkeys(params.values()) if not getattr(p, "_lambda_gelu_replicated", False)]
    if new:
        average = _AverageAtEndOfBackward(new, group)
        for p in new:
            p.register_post_accumulate_grad_hook(average.queue)
            p._lambda_gelu_replicated = True
    return set(params.values())


class _AverageAtEndOfBackward:
    """One all-reduce of ``params``' gradients per backward, after the last of them is accumulated."""

    def __init__(self, params: list[nn.Parameter], group: dist.ProcessGroup | None):
        self.params, self.group, self.queued = params, group, False

    def queue(self, _: nn.Parameter) -> None:
        if not self.queued:
            self.queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self.average)

    def average(self) -> None:
        self.queued = False
        device = self.params[0].device
        has = [p.grad is not None for p in self.params]
        flat = torch.cat([(p.grad.detach() if h else torch.zeros_like(p)).reshape(-1).to(device, torch.float64)
                          for p, h in zip(self.params, has)] + [torch.tensor(has, dtype=torch.float64, device=device)])
        dist.all_reduce(flat, group=self.group)
        flat[:-len(self.params)] /= dist.get_world_size(self.group)
        reached, offset = flat[-len(self.params):], 0
        for p, anywhere in zip(self.params, reached.tolist()):
            mean = flat[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
            if p.grad is not None:
                p.grad.copy_(mean)
            elif anywhere:
                p.grad = mean.to(p.device, p.dtype, copy=True)


def _is_sharded(p: torch.Tensor) -> bool:
    """A DTensor: a parameter FSDP manages (and shards)."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch built without distributed support
        return False
    return isinstance(p, DTensor)
