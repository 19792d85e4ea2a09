"""Fused kernels for λ-GELU, compiled on first use by ``torch.compile`` (Inductor).

Eager PyTorch needs about five passes over memory for the forward and ten for the backward
(z = λx, the erf, the products, the reduction); ``F.gelu`` needs one and two. Compiled, each
direction is one fused loop, within a few percent of ``F.gelu``. The kernels compute exactly the
formulas of :mod:`lambda_gelu.functional` and are tested against them.

Inputs are viewed in a canonical rank — (N,) for one λ, (outer, C, inner) for per-channel λ — so
one compiled graph (with dynamic sizes) serves every shape. Compilation happens once per process
per dtype and kind of λ (Inductor also caches kernels on disk across processes); if it fails (no C++
compiler, unsupported device), a warning is issued once and the eager path is used from then on.
"""
from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from torch import Tensor

_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_KERNELS: dict[str, object] = {}
_FAILED: list[str] = []


def _fwd(x: Tensor, lam: Tensor) -> Tensor:
    xc = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    lam = lam.to(xc.dtype)
    return (F.gelu(xc * lam) / lam).to(x.dtype)


def _bwd(g: Tensor, x: Tensor, lam: Tensor, need_lam: bool, reduce_dims: tuple[int, ...]):
    xc = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    gc = g.to(xc.dtype)
    lamc = lam.to(xc.dtype)
    z = xc * lamc
    grad_x = torch.ops.aten.gelu_backward(gc, z).to(x.dtype)
    if not need_lam:
        return grad_x, None
    x_phi = xc * torch.exp(-0.5 * z * z) * _INV_SQRT_2PI
    grad_lam = (gc * x_phi * xc).sum(dim=reduce_dims, keepdim=True).to(lam.dtype)
    return grad_x, grad_lam


def _canonical(x: Tensor, lam: Tensor) -> tuple[Tensor, Tensor, tuple[int, ...]]:
    """x as (N,) with 0-dim λ, or (outer, C, inner) with λ as (1, C, 1); and the λ reduction dims."""
    if lam.dim() == 0:
        return x.reshape(-1), lam, (0,)
    trailing = lam.dim() - 1  # λ is (C, 1, ..., 1) against x's dims from the channel dim on
    d = x.dim() - 1 - trailing
    outer = math.prod(x.shape[:d])
    inner = math.prod(x.shape[d + 1:])
    return x.reshape(outer, x.shape[d], inner), lam.reshape(1, -1, 1), (0, 2)


def _kernel(name: str, fn):
    if name not in _KERNELS:
        _KERNELS[name] = torch.compile(fn, dynamic=True, fullgraph=True)
    return _KERNELS[name]


def _guarded(call, fallback):
    if _FAILED:
        return fallback()
    try:
        return call()
    except Exception as e:  # compilation is an optimisation: any failure falls back, once, loudly
        _FAILED.append(repr(e))
        warnings.warn(f"lambda_gelu: compiling the fused kernels failed ({type(e).__name__}: {e}); "
                      "using the eager implementation from now on (set LAMBDA_GELU_BACKEND=eager to "
                      "silence this)", RuntimeWarning, stacklevel=4)
        return fallback()


def forward(x: Tensor, lam: Tensor, fallback) -> Tensor:
    def call():
        xc, lamc, _ = _canonical(x, lam)
        return _kernel(f"fwd{xc.dim()}", _fwd)(xc, lamc).view(x.shape)
    return _guarded(call, fallback)


def backward(g: Tensor, x: Tensor, lam: Tensor, need_lam: bool, fallback):
    def call():
        xc, lamc, dims = _canonical(x, lam)
        gc = g.reshape(xc.shape)
        fn = _kernel(f"bwd{xc.dim()}{'xl' if need_lam else 'x'}",
                     lambda g_, x_, l_: _bwd(g_, x_, l_, need_lam, dims))
        grad_x, grad_lam = fn(gc, xc, lamc)
        return grad_x.view(x.shape), None if grad_lam is None else grad_lam.reshape(lam.shape)
    return _guarded(call, fallback)


def failed() -> bool:
    return bool(_FAILED)
