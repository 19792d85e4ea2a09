"""What a conversion's parts cost on this machine, timed before it runs, so that its time budget plans them: the
refit (a forward and the largest solve), a step (in its parts) and AdamW's update. Nothing here changes a model."""
from __future__ import annotations

import time

import torch

from ..reluize.reluizer import teacher_student_loss

__all__ = ["refit_seconds", "step_seconds", "update_seconds"]


def refit_seconds(model, batch) -> tuple[float, float]:
    """What the refit will cost on ``model``: (seconds to solve its layers, seconds per batch), estimated from
    one forward of ``batch`` and one solve of the largest layer, both timed, without running the refit. Per
    batch, the activations are reached by one forward paused at each (lambda_gelu.reluize.capture), a gated FFN's
    block is run twice more, and each layer's Gram matrix is formed in float64."""
    from ..reluize import refit_consumers
    from ..reluize.refit import layer_sides, ridge_solve
    consumers = refit_consumers(model, batch)
    with torch.no_grad():
        t = time.perf_counter()
        model(**batch)
        forward = time.perf_counter() - t
    layers = [model.get_submodule(n) for names in consumers.values() for n in names]
    inputs, outputs = max(layer_sides(layer) for layer in layers)
    width = inputs + 1
    gram = torch.randn(width, width, dtype=torch.float64)
    gram = gram @ gram.T + width * torch.eye(width, dtype=torch.float64)  # a Gram matrix and its ridge
    t = time.perf_counter()
    ridge_solve(gram, gram[:, :outputs])
    solve = time.perf_counter() - t
    rows = int(batch["attention_mask"].sum()) if "attention_mask" in batch else batch["input_ids"].numel()
    x = torch.randn(rows, width, dtype=torch.float64)
    t = time.perf_counter()
    x.T @ x  # one layer's Gram matrix over the batch, timed: the machine's float64 speed, not a guess
    gram_seconds = len(layers) * (time.perf_counter() - t)
    per_batch = forward + 2 * forward * len(consumers.gated) / max(len(consumers), 1)
    return len(layers) * solve, per_batch + gram_seconds


def step_seconds(model, teacher, batch, loss, autocast: torch.dtype | None = None) -> float:
    """What one conversion step takes on ``batch``, timed in its parts: the teacher's forward, the student's forward
    (both under an ``autocast`` to that dtype, if given), ``loss`` and backward (the best of three), and AdamW's update
    of the trainable weights (:func:`update_seconds`). The gradients are dropped again; the weights are not touched."""
    times, device = [], next(model.parameters()).device
    for _ in range(3):
        t = time.perf_counter()
        teacher_student_loss(model, teacher, batch, loss, autocast, device).backward()
        times.append(time.perf_counter() - t)
    model.zero_grad(set_to_none=True)
    return min(times) + update_seconds([p for p in model.parameters() if p.requires_grad])


def update_seconds(params, sample: int = 2 ** 24) -> float:
    """AdamW's step over ``params``, timed on tensors of its own shaped as the first of them (those of up to 2^22
    elements, up to ``sample`` in all; a first step makes the state, the better of two more counts) and scaled to
    their number of elements: an update reads and writes each element's four values once."""
    total, shapes, n = sum(p.numel() for p in params), [], 0
    for p in params:
        if p.numel() <= 2 ** 22 and n < sample:
            shapes.append(p.shape)
            n += p.numel()
    if total == 0:
        return 0.0
    if n == 0:  # every tensor is larger: one flat slice of them
        shapes, n = [(min(total, sample),)], min(total, sample)
    weights = [torch.zeros(shape, requires_grad=True) for shape in shapes]
    for w in weights:
        w.grad = torch.ones_like(w)
    optimizer, times = torch.optim.AdamW(weights), []
    for _ in range(3):
        t = time.perf_counter()
        optimizer.step()
        times.append(time.perf_counter() - t)
    return min(times[1:]) * total / n
