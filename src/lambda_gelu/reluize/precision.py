"""The precision of the distillation's matrix products: float32, or bfloat16 under ``torch.autocast``.

Under bfloat16 the teacher's and the student's linear layers and attention multiply in bfloat16 while everything
that accumulates stays float32: the weights and AdamW's state, the residual stream and the normalisations (the
autocast's own rules), the loss (computed from the outputs cast back to float32). ``auto`` picks bfloat16 only
where the device multiplies it natively: CPUs with AMX or AVX512-BF16 (elsewhere a CPU emulates it, slower than
float32) and CUDA GPUs that support it. A conversion step of SmolLM2-135M in each precision, side by side:
benchmarks/bench_distill.py (docs/performance.md).
"""
from __future__ import annotations

import contextlib

import torch

__all__ = ["PRECISIONS", "native_bfloat16", "autocast_dtype", "precision_context"]

PRECISIONS = ("float32", "bfloat16", "auto")


def native_bfloat16(device: torch.device) -> bool:
    """Whether ``device`` multiplies bfloat16 matrices in hardware."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return any(getattr(torch.cpu, probe, lambda: False)()
                   for probe in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"))
    return False


def autocast_dtype(precision: str | None, device: torch.device) -> torch.dtype | None:
    """The autocast dtype that ``precision`` means on ``device``: bfloat16, or None (float32)."""
    if precision == "bfloat16" or precision == "auto" and native_bfloat16(device):
        return torch.bfloat16
    return None


def precision_context(dtype: torch.dtype | None, device: torch.device):
    """``torch.autocast`` to ``dtype`` on ``device``'s type, or nothing for None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)
