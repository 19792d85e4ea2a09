"""``LambdaGELU``: the λ-GELU activation as a layer with a learnable, constrained hardness λ."""
from __future__ import annotations

import math
import numbers

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .functional import lambda_gelu

__all__ = ["LambdaGELU", "lambda_to_raw", "raw_to_lambda"]

DEFAULT_INIT_LAMBDA = 1.5
DEFAULT_TEMPERATURE = 0.1
RAW_EXACT_GELU = -1000.0  # s/t at or below which λ is exactly 1: softplus(−1000) = 0 in every float type
_HALF = (torch.float16, torch.bfloat16)


def raw_to_lambda(s: Tensor, temperature: float) -> Tensor:
    """λ = 1 + softplus(s / t): every real s maps to a λ ≥ 1 (s/t ≤ −1000 gives exactly 1)."""
    return 1.0 + F.softplus(s / temperature)


def lambda_to_raw(lam: float | Tensor, temperature: float) -> Tensor:
    """The inverse of :func:`raw_to_lambda`, computed in float64: s = t · softplus⁻¹(λ − 1). λ = 1
    maps to the finite s = −1000·t (not −∞), so that arithmetic on parameters (norms, averages,
    clipping) never meets inf or NaN."""
    y = torch.as_tensor(lam, dtype=torch.float64) - 1.0
    if bool((y < 0).any()) or bool(torch.isnan(y).any()):
        raise ValueError(f"λ must be ≥ 1, got {lam}")
    # softplus⁻¹(y) = y + log(1 − e^{−y}); F.softplus returns its input unchanged above 20, so do we.
    inv = torch.where(y > 20.0, y, y + torch.log(-torch.expm1(-y)))
    return temperature * inv.clamp(min=RAW_EXACT_GELU)


class LambdaGELU(nn.Module):
    r"""λ-GELU, f(x; λ) = x · Φ(λx), with one learnable λ per layer (or per channel).

    λ = 1 is exact GELU, λ → ∞ is ReLU. The module holds a raw parameter ``s`` and uses

        λ = 1 + softplus(s / t),      t = ``temperature`` (0.1 by default),

    so λ ≥ 1 whatever the optimizer does. Derivatives (see :mod:`lambda_gelu.functional`):

        ∂f/∂x = Φ(λx) + λx · φ(λx),      ∂f/∂λ = x² · φ(λx),      ∂λ/∂s = σ(s/t) / t,

    hence a plain SGD step of learning rate η_s on ``s`` moves λ by approximately

        Δλ ≈ −η_s · σ(s/t)² / t² · ∂L/∂λ.

    The temperature amplifies λ's step by 1/t²; :func:`lambda_gelu.lambda_param_groups` gives ``s``
    its own learning rate (c·η) and no weight decay, which would otherwise pull λ towards 1 + ln 2.

    Args:
        init_lambda: starting λ, ≥ 1. The default 1.5 starts close to GELU (gate L1 gap 0.53
            against GELU's 0.80) where λ still learns freely: ∂λ/∂s ∝ σ(s/t) = λ − 1 for λ near 1,
            so a start at λ ≈ 1 barely moves under SGD. To convert a pretrained GELU network
            without changing its outputs use ``1.0`` (exact GELU: s = −1000·t, finite, where λ's
            gradient is 0, so it cannot move) or ``1 + 1e-6`` (outputs equal to ~1e-6, λ
            trainable, slowly at first).
        temperature: t in λ = 1 + softplus(s/t), > 0.
        num_channels: None for one λ for the whole layer, or C for one λ per channel.
        channel_dim: the input dimension the C channels run along: -1 (features, the default) or
            1 for NCHW convolution maps.
    """

    def __init__(
        self,
        init_lambda: float = DEFAULT_INIT_LAMBDA,
        temperature: float = DEFAULT_TEMPERATURE,
        num_channels: int | None = None,
        channel_dim: int = -1,
    ):
        super().__init__()
        if not isinstance(init_lambda, numbers.Real) or not init_lambda >= 1.0 or math.isinf(init_lambda):
            raise ValueError(f"init_lambda must be a finite number ≥ 1 (1 is exact GELU), got {init_lambda!r}")
        if not isinstance(temperature, numbers.Real) or not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature!r}")
        if num_channels is not None and (not isinstance(num_channels, int) or num_channels < 1):
            raise ValueError(f"num_channels must be None (one λ per layer) or a positive int, got {num_channels!r}")
        self.temperature = float(temperature)
        self.num_channels = num_channels
        self.channel_dim = int(channel_dim)
        shape = () if num_channels is None else (num_channels,)
        raw = lambda_to_raw(float(init_lambda), self.temperature).item()
        self.s = nn.Parameter(torch.full(shape, raw, dtype=torch.float32))

    def _lambda(self) -> Tensor:
        return raw_to_lambda(self.s, self.temperature)

    @property
    def lam(self) -> Tensor:
        """The current λ (detached copy, for logging)."""
        with torch.no_grad():
            return self._lambda().detach().clone()

    @property
    def frozen(self) -> bool:
        return not self.s.requires_grad

    def freeze(self) -> None:
        """Stop learning λ: no gradient reaches ``s``, so no optimizer (momentum included) moves it."""
        self.s.requires_grad_(False)
        self.s.grad = None

    def unfreeze(self) -> None:
        self.s.requires_grad_(True)

    @torch.no_grad()
    def set_lambda(self, value: float | Tensor) -> None:
        """Set λ (a number, or one value per channel) by writing the matching ``s``."""
        raw = lambda_to_raw(value, self.temperature)
        if raw.dim() > 0 and raw.shape != self.s.shape:
            raise ValueError(f"set_lambda got shape {tuple(raw.shape)} for λ of shape {tuple(self.s.shape)}")
        self.s.copy_(raw.to(self.s.dtype).expand_as(self.s))

    def _apply(self, fn, recurse=True):
        """Keep ``s`` in its precision when the model is cast to float16/bfloat16 (``.half()``,
        ``.to(torch.bfloat16)``): near λ_target float16 resolves λ only to about ±0.1. The input is
        still computed in float32 and returned in its own dtype, as for any half-precision input."""
        before = self.s.data
        super()._apply(fn, recurse)
        if self.s.dtype in _HALF and before.dtype not in _HALF:
            self.s.data = before.to(self.s.device)
            if self.s.grad is not None:
                self.s.grad = self.s.grad.to(before.dtype)
        return self

    def forward(self, x: Tensor) -> Tensor:
        return lambda_gelu(x, self._lambda(), self.channel_dim)

    def extra_repr(self) -> str:
        lam = self.lam
        if lam.dim() == 0:
            desc = f"lam={lam.item():.4g}"
        else:
            desc = (f"num_channels={self.num_channels}, channel_dim={self.channel_dim}, "
                    f"lam=[{lam.min().item():.4g}, {lam.max().item():.4g}]")
        return f"{desc}, temperature={self.temperature:g}" + (", frozen" if self.frozen else "")
