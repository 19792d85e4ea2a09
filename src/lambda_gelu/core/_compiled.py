"""Fused kernels for λ-GELU, compiled on first use by ``torch.compile`` (Inductor).

Eager PyTorch needs about five passes over memory for the forward and ten for the backward
(z = λx, the erf, the products, the reduction); ``F.gelu`` needs one and two. Compiled, each
direction is one fused loop. The kernels compute the mathematics of :mod:`lambda_gelu.core.functional`
(in an arrangement with GELU's own operation count) and are tested against the eager formulas and
the plain reference.

Inputs are viewed in a canonical rank — (N,) for one λ, (outer, C) or (outer, C, inner) for
per-channel λ — and detached, so one compiled graph (with dynamic sizes) serves every shape. Each
(direction, rank, dtype) gets its own compiled function with its own cache, compiled once per
process (Inductor also caches kernels on disk across processes). If one fails to compile (no C++
compiler, an unsupported device or dtype), a warning is issued once and that kernel uses the eager
path from then on.
"""
from __future__ import annotations

import math
import types
import warnings

import torch
from torch import Tensor

_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_SQRT1_2 = math.sqrt(0.5)
_KERNELS: dict[tuple, object] = {}
_FAILED: dict[tuple, str] = {}


def _fwd(x: Tensor, lam: Tensor) -> Tensor:
    """x·Φ(λx) = x·(½ + ½·erf(x·λ/√2)): the same operation count as GELU itself (no division)."""
    xc = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    c = lam.to(xc.dtype) * _SQRT1_2
    return (xc * (0.5 + 0.5 * torch.erf(xc * c))).to(x.dtype)


def _bwd(g: Tensor, x: Tensor, lam: Tensor, need_lam: bool, reduce_dims: tuple[int, ...]):
    """∂L/∂x = g·(Φ(z) + λ·u), ∂L/∂λ = Σ g·x·u, with z = λx and u = x·φ(z) computed once."""
    xc = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    gc = g.to(xc.dtype)
    lamc = lam.to(xc.dtype)
    z = xc * lamc
    u = xc * (torch.exp(-0.5 * z * z) * _INV_SQRT_2PI)
    grad_x = (gc * (0.5 + 0.5 * torch.erf(z * _SQRT1_2) + lamc * u)).to(x.dtype)
    if not need_lam:
        return grad_x, None
    grad_lam = (gc * xc * u).sum(dim=reduce_dims, keepdim=True).to(lam.dtype)
    return grad_x, grad_lam


def layout(x: Tensor, lam: Tensor) -> tuple[int, int, int]:
    """(outer, C, inner) such that x viewed as (outer, C, inner) has λ[c] along its dim 1 — for a
    λ that broadcasts against x (see ``functional._broadcastable_lambda``); (1, 1, N) for one λ."""
    if lam.dim() == 0:
        return 1, 1, x.numel()
    trailing = lam.dim() - 1  # λ is (C, 1, ..., 1) against x's dims from the channel dim on
    d = x.dim() - 1 - trailing
    return math.prod(x.shape[:d]), x.shape[d], math.prod(x.shape[d + 1:])


def _canonical(x: Tensor, lam: Tensor) -> tuple[Tensor, Tensor, tuple[int, ...]]:
    """x as (N,) with 0-dim λ; or (outer, C[, inner]) with λ shaped to broadcast; and λ's reduction dims."""
    x = x.detach()
    lam = lam.detach()
    if lam.dim() == 0:
        return x.reshape(-1), lam, (0,)
    outer, c, inner = layout(x, lam)
    if inner == 1:
        return x.reshape(outer, c), lam.reshape(1, -1), (0,)
    return x.reshape(outer, c, inner), lam.reshape(1, -1, 1), (0, 2)


def _kernel(key: tuple, fn):
    """A compiled copy of ``fn`` for ``key``. The copy has its own code object, hence its own
    compilation cache: kernels for other dtypes or ranks never evict it or count against its limit."""
    if key not in _KERNELS:
        fresh = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
        _KERNELS[key] = torch.compile(fresh, dynamic=True, fullgraph=True)
    return _KERNELS[key]


def _guarded(key: tuple, call, fallback):
    if key in _FAILED:
        return fallback()
    try:
        return call()
    except Exception as e:  # compilation is an optimisation: a failure falls back, once, loudly
        _FAILED[key] = repr(e)
        warnings.warn(f"lambda_gelu: compiling the fused kernel {key} failed ({type(e).__name__}: {e}); "
                      "using the eager implementation for it from now on (LAMBDA_GELU_BACKEND=eager "
                      "silences this)", RuntimeWarning, stacklevel=4)
        return fallback()


def forward(x: Tensor, lam: Tensor, fallback) -> Tensor:
    xc, lamc, _ = _canonical(x, lam)
    key = ("fwd", xc.dim(), x.dtype, lam.dtype)
    return _guarded(key, lambda: _kernel(key, _fwd)(xc, lamc).view(x.shape), fallback)


def _bwd_x(g, x, lam, dims):
    return _bwd(g, x, lam, False, dims)


def _bwd_x_lam(g, x, lam, dims):
    return _bwd(g, x, lam, True, dims)


def backward(g: Tensor, x: Tensor, lam: Tensor, need_lam: bool, fallback):
    xc, lamc, dims = _canonical(x, lam)
    gc = g.detach().reshape(xc.shape)
    key = ("bwd", xc.dim(), x.dtype, lam.dtype, need_lam)

    def call():
        grad_x, grad_lam = _kernel(key, _bwd_x_lam if need_lam else _bwd_x)(gc, xc, lamc, dims)
        return grad_x.view(x.shape), None if grad_lam is None else grad_lam.reshape(lam.shape)
    return _guarded(key, call, fallback)


def failed() -> dict[tuple, str]:
    """The kernels that failed to compile, with the error; empty when all is well."""
    return dict(_FAILED)
