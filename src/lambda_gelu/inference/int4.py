"""4-bit rows: a row of weights as blocks of :data:`BLOCK`, each block 4-bit codes on its own grid, the grids coded in
8 bits against two floats per row — 4.5 bits a weight, 56% of an int8 row's bytes (a float32 row's 14%).

Block b of a row holds q_j in 0..15 and stands for

    w_j ≈ s·a_b·q_j + m·c_b        (a_b in 1..255, c_b in −127..127; s, m the row's two float32 scales)

the step s·a_b and the offset m·c_b chosen to cover the block: the offset at or below its smallest weight, the top
q = 15 at or above its largest, so that every weight rounds to its nearest code and none is clipped (an error of at
most half the block's step). A row of width d is ``d / 2`` bytes of codes (byte i of a block: q_i in its low nibble,
q_{i+16} in its high one, the order a vector unit unpacks in two steps) then its d / BLOCK step codes a_b and its
d / BLOCK offset codes c_b (as bytes): ``row_bytes(d)`` in all. The C kernels (``_native/int4.h``) sum such a row
against x rounded to int8, one scale a row (x ≈ t·x̂: :func:`int8_rows`), as

    w·x ≈ t·(s·Σ_b a_b·(q_b·x̂_b) + m·Σ_b c_b·Σ x̂_b)

in integers, exactly, so that the value is the dequantized row (:func:`dequantize`, the reference) times t·x̂ but for
one rounding. Codes times int8 is the vector unit's fastest multiply-add (32 products an instruction): 4-bit rows
read half an int8 row's bytes, and their arithmetic must not give back what that saves. Rounding the FFN's inputs
to 8 bits changed the converted SmolLM2's held-out perplexity by less than its noise (the weights' rounding to 4 bits
is the cost).
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["BLOCK", "row_bytes", "fits", "quantize", "dequantize", "int8_rows"]

BLOCK = 32  # weights per block: one 16-byte load of codes, two int16 vectors of x


def row_bytes(d: int) -> int:
    """Bytes of a 4-bit row of d weights: the codes, then a step code and an offset code per block."""
    return d // 2 + 2 * (d // BLOCK)


def fits(d: int) -> bool:
    """Whether rows of width d can be held as 4-bit rows: whole blocks."""
    return d > 0 and d % BLOCK == 0


@torch.no_grad()
def quantize(w: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Each row of ``w`` (rows, d; d a multiple of :data:`BLOCK`) as a 4-bit row: the bytes (rows, row_bytes(d)) as
    uint8, the step scales s and the offset scales m (rows,) as float32. Rows that are not finite are refused."""
    w = w.detach().to(torch.float64)
    rows, d = w.shape
    if not fits(d):
        raise ValueError(f"4-bit rows hold whole blocks of {BLOCK} weights; a row of {d} is not")
    if not bool(torch.isfinite(w).all()):
        raise ValueError("4-bit rows: the weights hold a NaN or an infinity")
    blocks = w.reshape(rows, d // BLOCK, BLOCK)
    lo, hi = blocks.amin(2), blocks.amax(2)
    m = lo.abs().amax(1) / 127  # the offset scale: the largest offset is 127 of it
    m = torch.where(m > 0, m, torch.ones_like(m))
    c = torch.floor(lo / m[:, None]).clamp_(-127, 127)  # offsets at or below each block's smallest weight
    c = torch.where(c * m[:, None] > lo, c - 1, c).clamp_(-127, 127)  # (floor's rounding in double, made sure)
    offset = c * m[:, None]
    span = (hi - offset) / 15  # the step each block needs to reach its largest weight
    s = span.amax(1) / 255
    s = torch.where(s > 0, s, torch.ones_like(s))
    a = torch.ceil(span / s[:, None]).clamp_(1, 255)
    step = a * s[:, None]
    q = torch.round((blocks - offset[..., None]) / step[..., None]).clamp_(0, 15).to(torch.uint8)
    codes = q[..., :BLOCK // 2] | (q[..., BLOCK // 2:] << 4)  # byte i: q_i low, q_{i+16} high
    out = torch.cat([codes.reshape(rows, d // 2), a.to(torch.uint8), c.to(torch.int8).view(torch.uint8)], 1)
    return out.contiguous(), s.float().contiguous(), m.float().contiguous()


def dequantize(q: Tensor, s: Tensor, m: Tensor, d: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """The weights (rows, d) the 4-bit rows ``q`` with scales ``s``, ``m`` stand for, in ``dtype``."""
    rows, nb = q.shape[0], d // BLOCK
    codes = q[:, :d // 2].reshape(rows, nb, BLOCK // 2)
    values = torch.cat([codes & 15, codes >> 4], 2).to(dtype)
    a = q[:, d // 2:d // 2 + nb].to(dtype)
    c = q[:, d // 2 + nb:d // 2 + 2 * nb].contiguous().view(torch.int8).to(dtype)
    s, m = s.to(dtype)[:, None], m.to(dtype)[:, None]
    return (values * (s * a)[..., None] + (m * c)[..., None]).reshape(rows, d)


def int8_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """Each row of ``x`` (..., d) as int8 x̂ (as float32) and its scale t (..., 1) as float64, x ≈ t·x̂: t = max|row| /
    127 (1 for a row of zeros), x̂ = x / t rounded to nearest — how the 4-bit kernels take a row's input."""
    x64 = x.detach().to(torch.float64)
    t = x64.abs().amax(-1, keepdim=True) / 127
    t = torch.where(t > 0, t, torch.ones_like(t))
    return torch.round(x64 / t).clamp_(-127, 127).float(), t
