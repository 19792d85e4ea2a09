"""The blockwise schedule (per-block reconstruction, as APHQ-ViT does for fc1/fc2): block by block in forward
order, the block's activations become ReLU and its own parameters are trained to reproduce the teacher's block
output from the input the (already converted) network upstream gives it.

A block is the module that calls the activation (a transformer's FFN, a residual block, a conv-BN-act stem); where
that is an ``nn.Sequential`` holding several activations (a plain MLP), each stretch ending at an activation is a
block, the last one running to the end (the head). A block that ends at its activation cannot shape its own output,
so where the next parameters sit beside it in the same parent and belong to no block — BERT's ``intermediate``
holds the first projection, ``output`` the second — the block is that parent, the whole layer. The steps are
shared equally by the blocks; a step runs the networks only up to the block.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from ..core.batches import attention_mask, run_batch
from ..core.convert import is_reluizable, replace_modules_
from .capture import Stop, run_to_hook
from .losses import relative_error
from .result import ReluizeResult
from .training import lr_decay, progress_bar

__all__ = ["reconstruction_blocks", "ReconstructionBlock", "blockwise"]


@dataclass
class ReconstructionBlock:
    """A stretch of the network reconstructed as one: ``modules`` run in turn (one module, or a slice
    of an ``nn.Sequential``), holding the GELU-like ``activations``."""
    name: str
    modules: list[str]
    activations: list[str] = field(default_factory=list)


def reconstruction_blocks(model: nn.Module, batch) -> list[ReconstructionBlock]:
    """The blocks of ``schedule="blockwise"``, in the order ``batch``'s forward reaches them."""
    start, end = _forward_order(model, batch)
    order = sorted((n for n in start if is_reluizable(model.get_submodule(n))), key=start.get)
    blocks: dict[str, ReconstructionBlock] = {}
    for fqn in order:
        parent_name = fqn.rpartition(".")[0]
        parent = model.get_submodule(parent_name)
        siblings = [n for n in order if n.rpartition(".")[0] == parent_name]
        if isinstance(parent, nn.Sequential) and len(siblings) > 1:  # each stretch ending at an activation
            prefix = f"{parent_name}." if parent_name else ""
            children = [f"{prefix}{n}" for n, _ in parent.named_children()]
            ends = sorted(children.index(n) for n in siblings)
            i = ends.index(children.index(fqn))
            start_at, stop = (ends[i - 1] + 1 if i else 0), (ends[i] + 1 if i + 1 < len(ends) else len(children))
            name = f"{parent_name or '<root>'}[{start_at}:{stop}]"
            blocks.setdefault(name, ReconstructionBlock(name, children[start_at:stop])).activations.append(fqn)
        else:
            block = blocks.setdefault(parent_name, ReconstructionBlock(parent_name or "<root>", [parent_name]))
            block.activations.append(fqn)
    return _enclose_what_follows(model, list(blocks.values()), start, end)


def _forward_order(model: nn.Module, batch) -> tuple[dict[str, int], dict[str, int]]:
    """When each submodule first starts and last ends in ``batch``'s forward, on one clock."""
    clock, start, end = itertools.count(), {}, {}

    def started(name):
        def hook(mod, args):  # returns None: a pre-hook's return value would replace the input
            start.setdefault(name, next(clock))
        return hook

    def ended(name):
        def hook(mod, args, out):
            end[name] = next(clock)
        return hook

    handles = [h for name, m in model.named_modules() if name
               for h in (m.register_forward_pre_hook(started(name)), m.register_forward_hook(ended(name)))]
    try:
        with torch.no_grad():
            run_batch(model, batch)
    finally:
        for h in handles:
            h.remove()
    return start, end


def _enclose_what_follows(model, blocks, start, end) -> list[ReconstructionBlock]:
    """A block that ends at its activation cannot shape its own output: the projection reading it must
    learn too. Where the next module with parameters belongs to no block but sits in the block's own
    parent (BERT's ``output.dense`` beside ``intermediate``), the block becomes that parent (the layer)."""
    def inside(name, root):
        return name == root or name.startswith(root + ".")

    def owned(name):
        return any(inside(name, m) for b in blocks for m in b.modules)

    out: dict[str, ReconstructionBlock] = {}
    for b in blocks:
        parent = b.modules[0].rpartition(".")[0]
        if len(b.modules) == 1 and parent:
            after = [n for n in start if start[n] > end[b.modules[0]]
                     and next(model.get_submodule(n).parameters(recurse=False), None) is not None]
            follower = min(after, key=start.get, default=None)
            if follower is not None and not owned(follower) and inside(follower, parent):
                b = ReconstructionBlock(parent, [parent], b.activations)
        if b.name in out:
            out[b.name].activations += b.activations
        else:
            out[b.name] = b
    return list(out.values())


def _block_input(model: nn.Module, block: ReconstructionBlock, batch):
    """The (args, kwargs) the first module of ``block`` receives when ``model`` runs ``batch``."""
    seen = {}

    def grab(mod, args, kwargs):
        seen["in"] = (args, kwargs)
        raise Stop

    first = model.get_submodule(block.modules[0])
    run_to_hook(model, batch, first.register_forward_pre_hook(grab, with_kwargs=True))
    return _reached(seen, "in", block)


def _block_output(model: nn.Module, block: ReconstructionBlock, batch) -> torch.Tensor:
    """What the last module of ``block`` returns when ``model`` runs ``batch``."""
    seen = {}

    def grab(mod, args, output):
        seen["out"] = output
        raise Stop

    run_to_hook(model, batch, model.get_submodule(block.modules[-1]).register_forward_hook(grab))
    return _tensor_output(_reached(seen, "out", block), block)


def _reached(seen: dict, key: str, block: ReconstructionBlock):
    if key not in seen:
        raise RuntimeError(f"block {block.name} was not reached by the forward")
    return seen[key]


def _run_block(model: nn.Module, block: ReconstructionBlock, args, kwargs) -> torch.Tensor:
    modules = [model.get_submodule(n) for n in block.modules]
    out = modules[0](*args, **kwargs)
    for m in modules[1:]:
        out = m(out)
    return _tensor_output(out, block)


def _tensor_output(out, block: ReconstructionBlock) -> torch.Tensor:
    if isinstance(out, tuple) and out and isinstance(out[0], torch.Tensor):
        out = out[0]  # a Hugging Face layer's (hidden_states, attentions...)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"block {block.name} returns {type(out).__name__}, not a tensor: schedule='blockwise' "
                        "reconstructs tensor outputs; use schedule='anneal' or 'swap'")
    return out


def blockwise(model, teacher, stream, steps, first, lr, weight_decay, lr_schedule, progress,
               callback) -> ReluizeResult:
    blocks = reconstruction_blocks(model, first)
    if steps < len(blocks):
        raise ValueError(f"schedule='blockwise' needs at least one step per block: {len(blocks)} blocks, {steps} "
                         "steps for them")
    for b in blocks:
        for name in b.modules:
            try:
                teacher.get_submodule(name)
            except AttributeError:
                raise ValueError(f"schedule='blockwise' matches blocks by name, and the teacher has no {name!r}: "
                                 "give a teacher with the model's structure (or none: a copy of the model)") from None
    result = ReluizeResult([])
    bar = progress_bar(steps, progress)
    t0, step = time.perf_counter(), 0
    model.eval()
    for i, block in enumerate(blocks):
        if result.stopped:
            break
        result.replaced += replace_modules_(model, lambda m, fqn: fqn in block.activations, lambda old: nn.ReLU(),
                                            "GELU")
        params = list({id(p): p for n in block.modules for p in model.get_submodule(n).parameters()
                       if p.requires_grad}.values())
        optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay) if params else None
        block_steps = steps // len(blocks) + (i < steps % len(blocks))
        decay = lr_decay(optimizer, block_steps, lr_schedule)
        for _ in range(block_steps):
            batch = next(stream)
            with torch.no_grad():
                args, kwargs = _block_input(model, block, batch)
                target = _block_output(teacher, block, batch)
            mask = attention_mask(batch)
            value = relative_error(_run_block(model, block, args, kwargs), target, mask)
            if optimizer is not None:
                optimizer.zero_grad(set_to_none=True)
                value.backward()
                optimizer.step()
                if decay is not None:
                    decay.step()
            step += 1
            entry = {"step": step, "lam": float("inf"), "loss": value.item(), "seconds": time.perf_counter() - t0,
                     "block": block.name}
            if result.record(entry, bar, f"{block.name} loss {entry['loss']:.4g}", callback):
                break
    bar.close()
    # the activations of blocks not reached (the callback ended it) and of none (never called)
    result.replaced += replace_modules_(model, lambda m, fqn: is_reluizable(m), lambda old: nn.ReLU(), "GELU")
    result.seconds = time.perf_counter() - t0
    return result
