"""KL(teacher ‖ student) of the softmax over a language model's vocabulary, weighted over positions: the
``logits-kl`` loss's core, with its gradient computed in the same pass.

Over a vocabulary of 49,152 a batch of 32 × 21 positions has 33M logits a side; the plain formula
(:func:`kl_reference`) makes five such tensors in float32 and its backward three more, far larger than any cache.
:func:`kl_divergence` walks the positions in chunks of about a million logits: each chunk's log-softmaxes, its KL and
its gradient, softmax(student) − softmax(teacher) times the position's weight, are computed while the chunk is in
cache, and the gradient is what the backward returns (scaled by the incoming gradient). The same arithmetic in float32,
summed in another order: equal to the reference within float32 rounding (tests/test_kl.py).
"""
from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

__all__ = ["kl_divergence", "kl_reference", "CHUNK_ELEMENTS"]

CHUNK_ELEMENTS = 2 ** 20  # logits a chunk: 4 MB a float32 tensor; 4 to 64 positions of SmolLM2's ran alike


def kl_reference(student: torch.Tensor, teacher: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Σ_positions weight · KL(softmax(teacher) ‖ softmax(student)), the plain formula: ``student`` and ``teacher``
    are (..., V) logits, ``weights`` their leading shape; computed in float32 at least."""
    dtype = _compute_dtype(student)
    log_p_s = torch.log_softmax(student.to(dtype), -1)
    log_p_t = torch.log_softmax(teacher.to(dtype), -1)
    return ((log_p_t.exp() * (log_p_t - log_p_s)).sum(-1) * weights.to(dtype)).sum()


def kl_divergence(student: torch.Tensor, teacher: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """:func:`kl_reference`, chunk by chunk of positions with the gradient for ``student`` made in the same pass
    (``teacher`` gets none: it is the target)."""
    if student.shape != teacher.shape or student.shape[:-1] != weights.shape:
        raise ValueError(f"kl_divergence: student {tuple(student.shape)}, teacher {tuple(teacher.shape)} and "
                         f"weights {tuple(weights.shape)} do not fit (logits (..., V), weights (...))")
    vocabulary = student.shape[-1]
    return _ChunkedKL.apply(student.reshape(-1, vocabulary), teacher.detach().reshape(-1, vocabulary),
                            weights.detach().reshape(-1), max(1, CHUNK_ELEMENTS // max(vocabulary, 1)))


def _compute_dtype(logits: torch.Tensor) -> torch.dtype:
    return torch.promote_types(logits.dtype, torch.float32)


class _ChunkedKL(torch.autograd.Function):
    @staticmethod
    def forward(ctx, student, teacher, weights, rows):
        dtype = _compute_dtype(student)
        grad = torch.empty_like(student, memory_format=torch.contiguous_format) if ctx.needs_input_grad[0] else None
        total = torch.zeros((), dtype=dtype, device=student.device)
        with torch.autocast(student.device.type, enabled=False):  # called inside one too, the KL stays float32
            _chunks(student, teacher, weights, rows, dtype, grad, total)
        ctx.save_for_backward(grad)
        return total

    @staticmethod
    @once_differentiable
    def backward(ctx, incoming):
        grad, = ctx.saved_tensors
        return (grad * incoming.to(grad.dtype) if grad is not None else None), None, None, None


def _chunks(student, teacher, weights, rows: int, dtype: torch.dtype, grad: torch.Tensor | None,
            total: torch.Tensor) -> None:
    """Adds each chunk of ``rows`` positions' weighted KL to ``total`` and writes its gradient into ``grad``."""
    for i in range(0, len(student), rows):
        w = weights[i:i + rows].to(dtype)
        log_p_s = torch.log_softmax(student[i:i + rows].to(dtype), -1)
        log_p_t = torch.log_softmax(teacher[i:i + rows].to(dtype), -1)
        p_t = log_p_t.exp()
        kl = torch.bmm(p_t.unsqueeze(1), log_p_t.sub_(log_p_s).unsqueeze(2)).view(-1)  # Σ_v p_t·(log p_t − log p_s)
        total += (kl * w).sum()
        if grad is not None:
            grad[i:i + rows] = log_p_s.exp_().sub_(p_t).mul_(w.unsqueeze(1))
