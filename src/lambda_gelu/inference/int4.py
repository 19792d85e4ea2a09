"""4-bit rows: a row of weights as blocks of :data:`BLOCK`, each block 4-bit codes on its own grid through 0, the grids
coded in 8 bits against one float per row — 4.5 bits a weight, 56% of an int8 row's bytes (a float32 row's 14%).

Block b of a row holds q_j in 0..15 and stands for

    w_j ≈ s·a_b·(q_j − z_b)        (a_b in 1..255, z_b in 0..15; s the row's float32 scale)

the step s·a_b the least of the row's codes that covers the block and 0 with the zero code z_b chosen for it, so that
every weight rounds to its nearest code, none is clipped (an error of at most half the block's step), and 0 is on
every grid. A grid spanning each block from its smallest weight to its largest (llama.cpp's Q4_1) re-finds, in a
model quantized that way once and fine-tuned since (a conversion from a Q4_1 GGUF), nearly the grid it came from,
and rounds the fine-tuning away: SmolLM2 converted at 85% gate zeros lost ×1.42 its held-out perplexity to such 4-bit
FFN rows, ×1.11 on these (``benchmarks/bench_llamacpp.py``, 256 sentences). A row of width d is ``d / 2`` bytes of
codes (byte i of a block: q_i in its low nibble, q_{i+16} in its high one, the order a vector unit unpacks in two
steps), then its d / BLOCK step codes a_b and its d / BLOCK zero codes z_b (as bytes): ``row_bytes(d)`` in all. The C
kernels (``_native/int4.h``) sum such a row against x rounded to int8, one scale a row (x ≈ t·x̂:
:func:`int8_rows`), as

    w·x ≈ t·s·Σ_b a_b·(q_b·x̂_b − z_b·Σ x̂_b)

in integers, exactly, so that the value is the dequantized row (:func:`dequantize`, the reference) times t·x̂ but for
its roundings in double and to float32. Codes times int8 is the vector unit's fastest multiply-add (32 products an
instruction): 4-bit rows read half an int8 row's bytes, and their arithmetic must not give back what that saves.
Rounding the FFN's inputs to 8 bits changed the converted SmolLM2's held-out perplexity by less than its noise (the
weights' rounding to 4 bits is the cost).

Grids through 0 are for weights that sit on a 4-bit grid already (:func:`on_4bit_grids`: a conversion of a 4-bit
GGUF). Off grids, steps of a block's largest magnitude over 7 (``quantize(w, symmetric=True)``: z_b = 8, codes −7..7
on either side) do better: SmolLM2's conversion moved off its grids by noise (0.3 of a step) lost ×1.24 its held-out
perplexity to grids through 0, ×1.18 to those; the conversion itself ×1.10 and ×1.12 (256 sentences).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = ["BLOCK", "row_bytes", "fits", "quantize", "grids_through_zero", "dequantize", "int8_rows", "on_4bit_grids",
           "FROM_4BIT", "SYMMETRIC"]

BLOCK = 32  # weights per block: one 16-byte load of codes, two int16 vectors of x
ON_GRID = 0.8  # a block sits on a 4-bit grid when this share of its weights lies within a quarter step of it
FROM_4BIT = 0.25  # the share of such blocks from which weights are taken for a conversion of a 4-bit file
SYMMETRIC = 7  # steps from 0 to a symmetric block's largest magnitude: codes −7..7 about a zero code of 8


def row_bytes(d: int) -> int:
    """Bytes of a 4-bit row of d weights: the codes, then a step code and an offset code per block."""
    return d // 2 + 2 * (d // BLOCK)


def fits(d: int) -> bool:
    """Whether rows of width d can be held as 4-bit rows: whole blocks."""
    return d > 0 and d % BLOCK == 0


@torch.no_grad()
def quantize(w: Tensor, symmetric: bool = False) -> tuple[Tensor, Tensor]:
    """Each row of ``w`` (rows, d; d a multiple of :data:`BLOCK`) as a 4-bit row: the bytes (rows, row_bytes(d)) as
    uint8 and the scales s (rows,) as float32, on grids through 0 or, ``symmetric``, on steps of each block's largest
    magnitude over 7 (see the module's docstring). Rows that are not finite are refused."""
    w = w.detach().to(torch.float64)
    rows, d = w.shape
    if not fits(d):
        raise ValueError(f"4-bit rows hold whole blocks of {BLOCK} weights; a row of {d} is not")
    if not bool(torch.isfinite(w).all()):
        raise ValueError("4-bit rows: the weights hold a NaN or an infinity")
    blocks = w.reshape(rows, d // BLOCK, BLOCK)
    if symmetric:
        need = blocks.abs().amax(-1) / SYMMETRIC
        zero = torch.full_like(need, SYMMETRIC + 1, dtype=torch.int64)
    else:
        need, zero = grids_through_zero(blocks)
    s64 = need.amax(1) / 255
    s = s64.float()
    s = torch.where(s.double() < s64, torch.nextafter(s, torch.tensor(float("inf"))), s)  # 255·s covers every step
    s = torch.where(s > 0, s, torch.ones_like(s))
    s64 = s.double()[:, None]
    a = torch.ceil(need / s64)
    a = torch.where(a * s64 < need, a + 1, a).clamp_(1, 255)  # (ceil's rounding in double, made sure)
    step = (a * s64)[..., None]
    q = (torch.round(blocks / step) + zero[..., None]).clamp_(0, 15).to(torch.uint8)
    codes = q[..., :BLOCK // 2] | (q[..., BLOCK // 2:] << 4)  # byte i: q_i low, q_{i+16} high
    out = torch.cat([codes.reshape(rows, d // 2), a.to(torch.uint8), zero.to(torch.uint8)], 1)
    return out.contiguous(), s.contiguous()


def grids_through_zero(blocks: Tensor) -> tuple[Tensor, Tensor]:
    """For blocks of weights (..., n) in float64: each block's least step with which 16 codes, one of them 0, cover it
    and 0, and the first zero code z (0..15, as int64) that gives it: z steps below 0, 15 − z above. A block of
    zeros takes step 0 and z = 0."""
    lo, hi = blocks.amin(-1, keepdim=True).clamp(max=0), blocks.amax(-1, keepdim=True).clamp(min=0)
    z = torch.arange(16, dtype=torch.float64)
    none = torch.tensor(float("inf"), dtype=torch.float64)  # a zero code that cannot cover the block
    below = torch.where(z > 0, -lo / z.clamp(min=1), torch.where(lo < 0, none, 0.0))  # z codes below 0
    above = torch.where(z < 15, hi / (15 - z).clamp(min=1), torch.where(hi > 0, none, 0.0))  # 15 − z above
    return torch.maximum(below, above).min(-1)


def dequantize(q: Tensor, s: Tensor, d: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """The weights (rows, d) the 4-bit rows ``q`` with scales ``s`` stand for, in ``dtype``."""
    rows, nb = q.shape[0], d // BLOCK
    codes = q[:, :d // 2].reshape(rows, nb, BLOCK // 2)
    values = torch.cat([codes & 15, codes >> 4], 2).to(dtype)
    a = q[:, d // 2:d // 2 + nb].to(dtype)
    z = q[:, d // 2 + nb:d // 2 + 2 * nb].to(dtype)
    return ((values - z[..., None]) * (s.to(dtype)[:, None] * a)[..., None]).reshape(rows, d)


def int8_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """Each row of ``x`` (..., d) as int8 x̂ (as float32) and its scale t (..., 1) as float64, x ≈ t·x̂: t = max|row| /
    127 (1 for a row of zeros), x̂ = x / t rounded to nearest — how the 4-bit kernels take a row's input."""
    x64 = x.detach().to(torch.float64)
    t = x64.abs().amax(-1, keepdim=True) / 127
    t = torch.where(t > 0, t, torch.ones_like(t))
    return torch.round(x64 / t).clamp_(-127, 127).float(), t


def on_4bit_grids(weights: list) -> float:
    """The share of the 32-weight blocks of ``weights`` (matrices, as tensors or arrays, of rows a multiple of 32
    wide; blocks of zeros, on every grid, left out) that sit on a 4-bit grid: :data:`ON_GRID` of a block's weights
    within a quarter step of Q4_0's grid (the step its largest magnitude over 8) or of Q4_1's (its smallest weight to
    its largest in 15 steps), as a block quantized to either and then fine-tuned by less than a step keeps them. Of
    weights off any grid, half lie within a quarter step of either: about one block in a thousand passes (SmolLM2's
    conversions: 72–74%; moved off their grids by noise of 0.3 steps, 0.4%)."""
    on, total = 0, 0
    for w in weights:
        all_blocks = (w.detach().cpu().float().numpy() if isinstance(w, Tensor) else np.asarray(w)).reshape(-1, BLOCK)
        for start in range(0, len(all_blocks), 1 << 16):  # a bounded copy at a time, whatever the matrix
            blocks = all_blocks[start:start + (1 << 16)].astype(np.float64)
            blocks = blocks[np.abs(blocks).max(1) > 0]  # a block of zeros is on every grid and tells nothing
            largest, low, high = np.abs(blocks).max(1), blocks.min(1), blocks.max(1)
            q4_0 = blocks / (largest / 8)[:, None]
            q4_1 = (blocks - low[:, None]) / np.where(high > low, (high - low) / 15, 1.0)[:, None]
            near = [np.mean(np.abs(r - np.rint(r)) <= 0.25, 1) for r in (q4_0, q4_1)]
            on, total = on + int((np.maximum(*near) >= ON_GRID).sum()), total + len(blocks)
    return on / total if total else 0.0
