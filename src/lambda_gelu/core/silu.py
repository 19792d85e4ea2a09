r"""λ-SiLU, the math in one place: the λ family for SiLU gates (Llama, Mistral, Qwen, SmolLM: SwiGLU).

    f(x; λ)  = x · σ(λx)                          σ: the logistic function, σ' = σ(1 − σ)
    ∂f/∂x    = σ(λx) + λx · σ'(λx)
    ∂f/∂λ    = x² · σ'(λx)

Limits. λ = 1 is exact SiLU (``F.silu``, bit for bit on the eager path). As λ → ∞ the gate σ(λx) tends to the
Heaviside step and f to ReLU. The L1 distance between gate and step is

    E(λ) = ∫ |σ(λx) − H(x)| dx = (2/λ) ∫₀^∞ (1 − σ(u)) du = 2 ln 2 / λ,

so a gate within ε of the step needs λ ≥ λ_target(ε) = 2 ln 2 / ε (≈ 277 for ε = 0.005): the same ε as
λ-GELU's, its own λ.

The eager path computes f = SiLU(λx)/λ and ∂f/∂x = SiLU'(λx) with PyTorch's own kernels, and the λ gradient
directly as Σ g · x · (x·σ'(λx)) (the identity's difference of two nearly equal sums would cancel in float32, as
for λ-GELU). Large float32 and bfloat16 tensors on CPU go through the fused C kernels of :mod:`lambda_gelu._native`
(the same loops as λ-GELU's, with σ for Φ), within float rounding of these formulas; everything else is eager.
Where |λx| ≥ 2⁶⁴ the gate is exactly 0 or 1 and the limit is returned. Only x and λ are saved for backward.
"""
from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import _native
from .functional import _broadcastable_lambda, _compute_dtype, _saturated, _step_limit, get_backend

__all__ = ["lambda_silu", "lambda_silu_reference", "silu_l1_gap", "silu_lambda_target"]

_LN2 = math.log(2.0)


def silu_l1_gap(lam: float | Tensor) -> float | Tensor:
    """L1 distance between the gate σ(λx) and the Heaviside step: E(λ) = 2 ln 2 / λ."""
    if isinstance(lam, numbers.Real) and lam <= 0:
        raise ValueError(f"silu_l1_gap needs λ > 0, got {lam}")
    return 2.0 * _LN2 / lam


def silu_lambda_target(epsilon: float = 0.005) -> float:
    """The λ whose gate σ(λx) is within L1 distance ``epsilon`` of the step: 2 ln 2 / ε ≈ 277 at 0.005."""
    if not isinstance(epsilon, numbers.Real) or isinstance(epsilon, bool) or not 0.0 < epsilon < 2.0 * _LN2:
        raise ValueError(f"epsilon must be in (0, {2 * _LN2:.4f}) — the gap of SiLU itself — got {epsilon!r}")
    return 2.0 * _LN2 / float(epsilon)


def lambda_silu_reference(x: Tensor, lam: float | Tensor, channel_dim: int = -1) -> Tensor:
    """The obviously correct version: ``x * sigmoid(λx)`` under plain autograd, to check the fast path against."""
    lam = _broadcastable_lambda(lam, x, channel_dim)
    return x * torch.sigmoid(lam * x)


def lambda_silu(x: Tensor, lam: float | Tensor, channel_dim: int = -1) -> Tensor:
    """f(x; λ) = x · σ(λx), differentiable in ``x`` and ``lam`` (a number, a 0-dim tensor, or one λ per channel
    along ``channel_dim``), as :func:`lambda_gelu.lambda_gelu` takes them."""
    return _LambdaSiLUFunction.apply(x, _broadcastable_lambda(lam, x, channel_dim))


def _fused(x: Tensor) -> bool:
    from .functional import COMPILED_MIN_NUMEL
    return (get_backend() != "eager" and x.numel() >= COMPILED_MIN_NUMEL and _native.supports(x)
            and _native.available())


def _forward(x: Tensor, lam: Tensor) -> Tensor:
    dtype = _compute_dtype(x, lam)
    xc, lam = x.to(dtype), lam.to(dtype)
    z = xc * lam
    return torch.where(_saturated(z, xc), _step_limit(xc), F.silu(z) / lam).to(x.dtype)


def _backward(g: Tensor, x: Tensor, lam: Tensor, need_x: bool, need_lam: bool):
    dtype = _compute_dtype(x, lam)
    xc, gc, lamc = x.to(dtype), g.to(dtype), lam.to(dtype)
    z = xc * lamc
    grad_x = grad_lam = None
    if need_x:  # g · SiLU'(z): PyTorch's own kernel, or for double backward its differentiable form; g · H(x) where
        # saturated
        if torch.is_grad_enabled():
            s = torch.sigmoid(z)
            d = gc * s * (1 + z * (1 - s))
        else:
            d = torch.ops.aten.silu_backward(gc, z)
        grad_x = torch.where(_saturated(z, xc), gc * (xc > 0), d).to(x.dtype)
    if need_lam:  # Σ g · x · (x σ'(λx)), finite for any finite x
        s = torch.sigmoid(z)
        grad_lam = (gc * (xc * (s * (1 - s))) * xc).sum_to_size(lam.shape).to(lam.dtype)
    return grad_x, grad_lam


class _LambdaSiLUFunction(torch.autograd.Function):
    """Saves only x and λ. The eager backward is written in differentiable ops, so double backward works."""

    @staticmethod
    def forward(ctx, x: Tensor, lam: Tensor) -> Tensor:
        ctx.save_for_backward(x, lam)
        if _fused(x):
            return (_native.forward_op if torch.compiler.is_compiling() else _native.forward)(x, lam, "silu")
        return _forward(x, lam)

    @staticmethod
    def backward(ctx, g: Tensor):
        x, lam = ctx.saved_tensors
        need_x, need_lam = ctx.needs_input_grad
        if need_x and not torch.is_grad_enabled() and _fused(x):
            if torch.compiler.is_compiling():
                grad_x, grad_lam = _native.backward_op(g, x, lam, need_lam, "silu")
                return grad_x, grad_lam if need_lam else None
            return _native.backward(g, x, lam, need_lam, "silu")
        return _backward(g, x, lam, need_x, need_lam)
