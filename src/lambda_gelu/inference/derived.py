"""Copies made from weights — stacked, transposed, quantized, screened — and whether those weights changed since.

A copy that certifies (a screen ruling units or rows out) is sound only for the weights it was made from, so the
classes that hold one (:class:`~lambda_gelu.inference.gated.SparseGatedMLP`,
:class:`~lambda_gelu.inference.screened_argmax.ScreenedArgmax`, :class:`~lambda_gelu.hf.LeanDecoder`) note them with
:class:`Made` and make the copy again before using it when :meth:`Made.stale` says one was replaced, moved or changed
in place. In place means through torch's version counter, which every in-place operation bumps (an optimizer's step,
``load_state_dict``, ``copy_`` under ``no_grad``); writes through ``.data`` bypass it and are not seen, nor are writes
to a tensor made under ``torch.inference_mode``, which has no counter.
"""
from __future__ import annotations

from collections.abc import Iterable

from torch import Tensor

__all__ = ["Made"]


class Made:
    """The tensors a copy was made from (None entries skipped), each with its version and address then. Holds them,
    so that no tensor made later takes the identity of one replaced since."""

    def __init__(self, tensors: Iterable[Tensor | None]):
        self.tensors = [t for t in tensors if t is not None]
        self.marks = [_mark(t) for t in self.tensors]

    def stale(self, tensors: Iterable[Tensor | None]) -> bool:
        """Whether ``tensors`` (the same kind of list, as it is now) differ from those noted: another tensor in some
        place, or one changed in place or moved since."""
        now = [t for t in tensors if t is not None]
        return len(now) != len(self.tensors) or any(
            a is not b or _mark(a) != mark for a, b, mark in zip(now, self.tensors, self.marks))


def _mark(t: Tensor) -> tuple[int | None, int]:
    return None if t.is_inference() else t._version, t.data_ptr()
