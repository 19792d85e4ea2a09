r"""λ-GELU, the math in one place.

    f(x; λ)  = x · Φ(λx)                          Φ: standard normal CDF, φ: its density
    ∂f/∂x    = Φ(λx) + λx · φ(λx)
    ∂f/∂λ    = x² · φ(λx)

Limits. λ = 1 is exact (erf) GELU. As λ → ∞ the gate Φ(λx) tends to the Heaviside step H(x) and f
tends to ReLU. The L1 distance between gate and step is

    E(λ) = ∫ |Φ(λx) − H(x)| dx = (2/λ) ∫₀^∞ (1 − Φ(u)) du = 2 / (λ √(2π)),

so a gate within ε of the step needs λ ≥ λ_target(ε) = 2 / (ε √(2π)) (≈ 159.6 for ε = 0.005).

How the eager path computes it. f(x; λ) = GELU(λx)/λ and ∂f/∂x = GELU'(λx), so the forward and
the input gradient reuse PyTorch's GELU kernels — at λ = 1 the result is bit-identical to
``F.gelu``. The λ gradient is *not* taken from that identity: d/dλ [GELU(λx)/λ] is the difference of
two nearly equal sums, which in float32 at λ = 160 keeps only a few digits (0.1–2% error over a
million inputs, growing with their number, against ~1e-7 for the direct form; see the tests). It
is computed directly as Σ g · x² · φ(λx), written as (x·φ(λx))·x so that it stays finite for any
finite x.

Finite input gives finite output and gradients at every λ, on every path: where |λx| ≥ 2⁶⁴ the gate
is exactly 0 or 1 and the eager path returns that limit (x or −0, gradient g or 0) instead of
asking ``F.gelu``, which overflows near the float range and returns NaN for ±inf on some CPUs. Non-finite input follows ``F.gelu``: NaN gives NaN;
±inf gives what this platform's ``F.gelu`` gives in eager mode (NaN on some CPUs, ±inf or 0 on
others) and the limits in the fused kernels (+inf → +inf, −inf → NaN, as x·Φ(λx) = −inf·0).

Only ``x`` (and λ) are saved for backward, as ``F.gelu`` saves only its input. Half-precision inputs
are computed in float32 and the result is cast back.

Backends. The formulas below (``_forward``/``_backward``) are the eager implementation, a few
passes over memory each. By default (backend ``"auto"``) tensors of at least
``COMPILED_MIN_NUMEL`` elements go through fused kernels of the same mathematics, one loop each
way: for float32 and bfloat16 on CPU, small C kernels built on first use
(:mod:`lambda_gelu._native`), also inside a user's ``torch.compile`` as custom operators;
otherwise (float16, other devices, no C compiler) Inductor's (:mod:`lambda_gelu.core._compiled`,
backend ``"inductor"``). Both agree with the eager formulas to float rounding (the C kernels' Φ is
within 1.5e-7 of the exact one), not bit for bit. ``set_backend("eager")`` or the environment
variable ``LAMBDA_GELU_BACKEND=eager`` turns them off. For double backward, and inside a compiled
model where the C kernels do not apply, the eager formulas are used (and fused by the outer
compiler where there is one).
"""
from __future__ import annotations

import contextlib
import math
import numbers
import os

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import _native
from . import _compiled

__all__ = ["lambda_gelu", "lambda_gelu_reference", "l1_gap", "lambda_target", "set_backend", "get_backend",
           "backend"]

_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
BACKENDS = ("auto", "inductor", "eager")
COMPILED_MIN_NUMEL = 1 << 16  # below this, launch overhead rather than memory traffic dominates


def set_backend(name: str) -> str:
    """Choose ``"auto"`` (fused kernels for large tensors: C for float32/bfloat16 on CPU, Inductor
    otherwise), ``"inductor"`` (Inductor's kernels for every dtype) or ``"eager"``; returns the
    previous choice."""
    global _backend
    if name not in BACKENDS:
        raise ValueError(f"unknown λ-GELU backend {name!r}; choose one of {', '.join(BACKENDS)}")
    previous, _backend = _backend, name
    return previous


def get_backend() -> str:
    return _backend


@contextlib.contextmanager
def backend(name: str):
    """``with lambda_gelu.backend("eager"): ...`` — the backend for a block of code."""
    previous = set_backend(name)
    try:
        yield
    finally:
        set_backend(previous)


_backend = "auto"
set_backend(os.environ.get("LAMBDA_GELU_BACKEND", "auto"))


def _fused_kernels(x: Tensor):
    """The module of fused kernels for ``x`` (``_native`` or ``_compiled``), or None for the eager path."""
    if _backend == "eager" or x.dtype == torch.float64 or x.numel() < COMPILED_MIN_NUMEL:
        return None
    if _backend == "auto" and _native.supports(x) and _native.available():
        return _native
    return None if torch.compiler.is_compiling() else _compiled  # the outer compiler fuses the formulas


def l1_gap(lam: float | Tensor) -> float | Tensor:
    """L1 distance between the gate Φ(λx) and the Heaviside step: E(λ) = 2 / (λ √(2π))."""
    if isinstance(lam, numbers.Real) and lam <= 0:
        raise ValueError(f"l1_gap needs λ > 0, got {lam}")
    return 2.0 * _INV_SQRT_2PI / lam


def lambda_target(epsilon: float = 0.005) -> float:
    """The λ whose gate is within L1 distance ``epsilon`` of the step: 2 / (ε √(2π)) ≈ 159.6 at 0.005."""
    if not isinstance(epsilon, numbers.Real) or not 0.0 < epsilon < l1_gap(1.0):
        raise ValueError(
            f"epsilon must be in (0, {l1_gap(1.0):.4f}) — the gap of GELU itself — got {epsilon!r}"
        )
    return 2.0 * _INV_SQRT_2PI / float(epsilon)


def lambda_gelu_reference(x: Tensor, lam: float | Tensor, channel_dim: int = -1) -> Tensor:
    """The obviously correct version: ``x * Φ(λx)`` under plain autograd. Slow (it saves several
    full-size tensors), kept to check the fast path against."""
    lam = _broadcastable_lambda(lam, x, channel_dim)
    return x * torch.special.ndtr(lam * x)


def lambda_gelu(x: Tensor, lam: float | Tensor, channel_dim: int = -1) -> Tensor:
    """f(x; λ) = x · Φ(λx), differentiable in ``x`` and ``lam``.

    Args:
        x: input of any shape and floating dtype.
        lam: λ, a Python number, a 0-dim tensor, or a 1-dim tensor of one λ per channel.
        channel_dim: the dimension of ``x`` that a 1-dim ``lam`` runs along (-1 for features in
            linear/transformer layers, 1 for NCHW convolution maps). Ignored for scalar λ.
    """
    lam = _broadcastable_lambda(lam, x, channel_dim)
    return _LambdaGELUFunction.apply(x, lam)


def _bad_lambda(value: float) -> ValueError:
    limit = "; the ReLU limit is nn.ReLU itself (lambda_gelu.to_relu_)" if value == math.inf else ""
    return ValueError(f"λ must be finite and positive (λ ≥ 1 for λ-GELU), got {value}{limit}")


def _broadcastable_lambda(lam: float | Tensor, x: Tensor, channel_dim: int) -> Tensor:
    """λ as a tensor that broadcasts against ``x``: 0-dim, or shaped (C, 1, ..., 1) / (C,)."""
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise TypeError(f"lambda_gelu needs a floating-point tensor x, got {type(x).__name__}"
                        + (f" of dtype {x.dtype}" if isinstance(x, Tensor) else ""))
    if isinstance(lam, numbers.Real) and not isinstance(lam, bool):
        if not 0 < lam < math.inf:
            raise _bad_lambda(lam)
        return torch.tensor(float(lam), dtype=torch.promote_types(x.dtype, torch.float32),
                            device=x.device)
    if not isinstance(lam, Tensor) or not lam.is_floating_point():
        raise TypeError(f"λ must be a number or a floating-point tensor, got {lam!r}")
    if lam.device.type == "cpu" and lam.numel() and not torch.compiler.is_compiling():
        low, high = (float(v) for v in torch.aminmax(lam.detach()))  # on an accelerator this would wait: CPU only
        if not (0 < low and high < math.inf):
            raise _bad_lambda(high if 0 < low else low)
    if lam.dim() == 0:
        return lam
    if lam.dim() != 1:
        raise ValueError(f"λ must be 0-dim (one per layer) or 1-dim (one per channel), "
                         f"got shape {tuple(lam.shape)}")
    if x.dim() == 0 or not -x.dim() <= channel_dim < x.dim():
        raise ValueError(f"channel_dim={channel_dim} is out of range for an input of shape "
                         f"{tuple(x.shape)}")
    dim = channel_dim % x.dim()
    if x.shape[dim] != lam.numel():
        raise ValueError(f"per-channel λ has {lam.numel()} entries but the input has {x.shape[dim]} "
                         f"channels along dim {channel_dim} (shape {tuple(x.shape)}); "
                         "set channel_dim to the channel dimension")
    return lam.view((-1,) + (1,) * (x.dim() - dim - 1))


def _compute_dtype(x: Tensor, lam: Tensor) -> torch.dtype:
    return torch.promote_types(torch.promote_types(x.dtype, lam.dtype), torch.float32)


def _forward(x: Tensor, lam: Tensor) -> Tensor:
    dtype = _compute_dtype(x, lam)
    xc, lam = x.to(dtype), lam.to(dtype)
    z = xc * lam
    return torch.where(_saturated(z, xc), _step_limit(xc), F.gelu(z) / lam).to(x.dtype)


_SATURATED = 2.0 ** 64  # |λx| beyond which Φ(λx) is exactly 0 or 1 in every float type, φ(λx) exactly 0


def _saturated(z: Tensor, x: Tensor) -> Tensor:
    """Where the gate is exactly 0 or 1 and x is finite. There the result is the limit itself: F.gelu
    would overflow an intermediate near the float range, and given ±inf (λx overflowed) it returns
    NaN on some CPUs. Elsewhere F.gelu's own kernel is used, so λ = 1 stays bit-identical to it."""
    return (z.abs() >= _SATURATED) & torch.isfinite(x)


def _step_limit(v: Tensor) -> Tensor:
    """v where x > 0, else 0 (−0 for negative x, as x·Φ(λx) underflows): the λ → ∞ limit."""
    return torch.where(v > 0, v, v * 0)


def _backward(g: Tensor, x: Tensor, lam: Tensor, need_x: bool, need_lam: bool):
    dtype = _compute_dtype(x, lam)
    xc, gc, lamc = x.to(dtype), g.to(dtype), lam.to(dtype)
    z = xc * lamc
    grad_x = grad_lam = None
    if need_x:  # g · (Φ(z) + z φ(z)), PyTorch's own fused GELU derivative; g · H(x) where saturated
        grad_x = torch.where(_saturated(z, xc), gc * (xc > 0), torch.ops.aten.gelu_backward(gc, z))
        grad_x = grad_x.to(x.dtype)
    if need_lam:  # Σ g · x² φ(λx), finite for any finite x
        x_phi = xc * torch.exp(-0.5 * z * z) * _INV_SQRT_2PI
        grad_lam = (gc * x_phi * xc).sum_to_size(lam.shape).to(lam.dtype)
    return grad_x, grad_lam


class _LambdaGELUFunction(torch.autograd.Function):
    """Saves only x and λ. The backward is written in differentiable ops, so double backward works."""

    @staticmethod
    def forward(ctx, x: Tensor, lam: Tensor) -> Tensor:
        ctx.save_for_backward(x, lam)
        kernels = _fused_kernels(x)
        if kernels is _native:
            return (_native.forward_op if torch.compiler.is_compiling() else _native.forward)(x, lam)
        if kernels is _compiled:
            return _compiled.forward(x, lam, fallback=lambda: _forward(x, lam))
        return _forward(x, lam)

    @staticmethod
    def backward(ctx, g: Tensor):
        x, lam = ctx.saved_tensors
        need_x, need_lam = ctx.needs_input_grad
        # the fused kernels are not differentiable: double backward takes the eager formulas
        kernels = _fused_kernels(x) if need_x and not torch.is_grad_enabled() else None
        if kernels is _native and torch.compiler.is_compiling():
            grad_x, grad_lam = _native.backward_op(g, x, lam, need_lam)
            return grad_x, grad_lam if need_lam else None
        if kernels is _native:
            return _native.backward(g, x, lam, need_lam)
        if kernels is _compiled:
            return _compiled.backward(g, x, lam, need_lam,
                                      fallback=lambda: _backward(g, x, lam, need_x, need_lam))
        return _backward(g, x, lam, need_x, need_lam)
