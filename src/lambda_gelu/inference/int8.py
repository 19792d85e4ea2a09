"""int8 rows: a row of weights as int8 ``q`` with one float32 scale ``s`` (:func:`quantize_rows`, row ≈ s·q), and the
inputs as the C kernels take them for exact integer sums against such rows — each row of x rounded to 16 bits with a
scale of its own (:func:`int16_rows`) — and a batch's product over them as those kernels compute it
(:func:`linear_i8`). The sparse gated FFNs' int8 blocks, the gates' and the output layer's screens, and the decoder's
int8 attention are made of these rows; the 4-bit rows are :mod:`~lambda_gelu.inference.int4`'s.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import _native
from .._native import pointer

__all__ = ["quantize_rows", "int16_rows", "linear_i8"]


def quantize_rows(w: Tensor) -> tuple[Tensor, Tensor]:
    """Each row of ``w`` as int8 ``q`` and a float32 scale ``s`` = max|row| / 127, rounded to nearest: row ≈ s·q."""
    w = w.detach().float()
    s = w.abs().amax(1) / 127
    s = torch.where(s > 0, s, torch.ones_like(s))
    return torch.round(w / s[:, None]).clamp_(-127, 127).to(torch.int8).contiguous(), s.contiguous()


def int16_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """Each row of ``x`` (..., d) as the C kernels take it for their integer sums: ``x ≈ t·x̃``, x̃ = x / t rounded
    to nearest (an integer of at most 15 bits, and d·127·|x̃| < 2³¹ so that a sum of d int8 products is exact in
    int32), t = max|row| / that largest x̃, one per row (0 for a row of zeros); both in float64."""
    top = min(32767, (2 ** 31 - 1) // (127 * max(x.shape[-1], 1)))
    x = x.detach().double()
    t = x.abs().amax(-1, keepdim=True) / top
    return torch.where(t > 0, torch.round(x / torch.where(t > 0, t, 1.0)), 0.0), t


def linear_i8(x: Tensor, q: Tensor, s: Tensor, bias: Tensor | None = None) -> Tensor:
    """x · (s·q)ᵀ + bias over :func:`quantize_rows`' rows, as the C kernels sum them (a prompt's int8 projections, as
    the decoding step's): each row of x rounded to 16 bits (:func:`int16_rows`) and summed exactly in integers, in float
    where a row holds a NaN or an infinity. Its reference, and where the kernels do not apply: ``F.linear`` over the
    rows dequantized (which differs by x's rounding)."""
    kernels = _native.library()
    if (kernels is None or x.dtype is not torch.float32 or not x.is_cpu or x.shape[-1] != q.shape[1]
            or bias is not None and (bias.dtype is not torch.float32 or bias.shape != q.shape[:1])):
        return F.linear(x, (q.float() * s[:, None]).to(x.dtype), bias)
    x2, b = x.reshape(-1, x.shape[-1]).contiguous(), None if bias is None else bias.contiguous()
    y = torch.empty(len(x2), len(q), dtype=torch.float32)
    if kernels.linear_i8(x2.data_ptr(), q.data_ptr(), s.data_ptr(), pointer(b), y.data_ptr(), len(x2), x2.shape[1],
                         len(q), torch.get_num_threads(), _native.GRAIN) < 0:
        raise MemoryError("linear_i8: the kernel could not allocate its buffers")
    return y.reshape(*x.shape[:-1], len(q))
