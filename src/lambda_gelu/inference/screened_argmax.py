"""The index of a linear layer's largest output, read through int8 copies of its rows: a greedy decoder's next token
from its output layer, exact, reading about a quarter of the layer's bytes.

A greedy decoder wants one number from its output layer, the index of the largest logit, and pays for all of them:
at batch 1 the layer is a matrix-vector product bound by reading its rows (SmolLM2-135M's, 49152 × 576 float32, is
113 MB, a fifth of the bytes of a token). With each row also held as int8 ``q`` with a scale ``s``
(:func:`~lambda_gelu.inference.gated.screen_rows`, the gated FFNs' screen) and x rounded to int16, every logit
``y_k = w[k]·x + b[k]`` lies within a margin ``m_k`` of ``a_k``, an exact integer sum scaled:

    |y_k − a_k| ≤ m_k = r_k·‖x‖₂ + n_k·‖x − t·x̃‖₂ (+ what double rounds),

so the largest logit is at least ``L = max_j (a_j − m_j)`` and only a row with ``a_k + m_k ≥ L`` can hold it. Those
rows alone (a few to a few dozen of SmolLM2's 49152) are read in float32 and their logits summed in double. The
index returned is the largest exact logit's, the first of equals as ``torch.argmax`` gives it; the dense layer's
float32 logits give the same index unless its two largest are closer than float32 rounds them.

    head = ScreenedArgmax(model.lm_head)      # int8 copies of its rows: a quarter more of its bytes
    token = head(hidden)                      # == model.lm_head(hidden).argmax(-1)

The C kernel runs for float32 layers on CPU; anything else (another dtype or device, an input with a NaN or an
infinity, a row whose logit is not finite) is computed by the layer itself and its argmax, as it would be without
the screen.
"""
from __future__ import annotations

import torch
import torch.nn as nn
from torch import Tensor

from .. import _native
from .derived import Made
from .gated import screen_rows
from .int8 import int16_rows

__all__ = ["ScreenedArgmax", "screened_argmax_reference"]

CHUNK_ROWS = 8192  # rows screened at a time when building (float64 copies of a chunk, not of the whole layer)


def screened_argmax_reference(x: Tensor, weight: Tensor, bias: Tensor | None,
                              screen: tuple[Tensor, Tensor, Tensor, Tensor]) -> tuple[int, Tensor]:
    """The C kernel's reference in float64 for one x (d,): the index of the largest logit and the rows the screen
    leaves (``screen`` = :func:`~lambda_gelu.inference.gated.screen_rows` of ``weight``), without double's roundings."""
    q, s, r, n = (t.double() for t in screen)
    x64 = x.detach().double()
    xq, t = int16_rows(x64)
    b = torch.zeros(len(q), dtype=torch.float64) if bias is None else bias.detach().double()
    a = (q @ xq) * s * t + b
    margin = r * x64.norm() + n * (x64 - t * xq).norm()
    left = ((a + margin) >= (a - margin).max()).nonzero().squeeze(1)
    y = weight.detach().double()[left] @ x64 + b[left]
    return int(left[y.argmax()]), left


class ScreenedArgmax:
    """``layer(x).argmax(-1)`` for a ``nn.Linear`` (see the module's docstring), each row of x one call of the C
    kernel. Building it copies the layer's rows to int8 (a quarter more of the weight's bytes) if the weight is
    float32 on CPU; a call after the weight changed copies them again first
    (:class:`~lambda_gelu.inference.derived.Made`). :attr:`rows_read` is the number of float32 rows the last row of x
    read (the layer's ``out_features`` where the layer computed them all)."""

    def __init__(self, layer: nn.Linear):
        if not isinstance(layer, nn.Linear):
            raise TypeError(f"ScreenedArgmax screens an nn.Linear, got {type(layer).__name__}")
        self.layer, self.rows_read = layer, layer.out_features
        self.refresh()

    @torch.no_grad()
    def refresh(self) -> None:
        """Copy the layer's rows to int8 again."""
        w = self.layer.weight
        self.screen, self._made = None, Made([w])
        if w.dtype is torch.float32 and w.is_cpu:
            parts = [screen_rows(w[i:i + CHUNK_ROWS]) for i in range(0, w.shape[0], CHUNK_ROWS)]
            self.screen = tuple(torch.cat(p).contiguous() for p in zip(*parts))

    @torch.no_grad()
    def __call__(self, x: Tensor) -> Tensor:
        if self._made.stale([self.layer.weight]):
            self.refresh()
        w, b = self.layer.weight, self.layer.bias
        kernels = _native.library() if (self.screen is not None and x.dtype is w.dtype and x.is_cpu
                                        and w.is_contiguous() and _native.biases_fit(self.layer)) else None
        if kernels is None:
            self.rows_read = self.layer.out_features
            return self.layer(x).argmax(-1)
        rows = x.reshape(-1, x.shape[-1]).contiguous()
        out = torch.empty(len(rows), dtype=torch.long)
        read = torch.zeros(1, dtype=torch.int64)
        q, s, r, n = self.screen
        for i, row in enumerate(rows):
            k = kernels.screened_argmax_f32(row.data_ptr(), w.data_ptr(), _native.pointer(b),
                                            q.data_ptr(), s.data_ptr(), r.data_ptr(), n.data_ptr(), w.shape[0],
                                            w.shape[1], torch.get_num_threads(), _native.GRAIN, read.data_ptr())
            if k == -1:
                raise MemoryError("ScreenedArgmax: the kernel could not allocate its buffers")
            self.rows_read = int(read) if k >= 0 else self.layer.out_features
            out[i] = k if k >= 0 else self.layer(row).argmax(-1)  # -2: not finite, as the layer treats it
        return out.reshape(x.shape[:-1])
