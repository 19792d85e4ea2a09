"""Baselines the paper did not run, each ending in an exact-ReLU network.

``LearnableSwish`` is x·σ(βx) with a learnable β, reparameterized and hardened exactly like λ-GELU
(it *is* a ``LambdaGELU`` whose gate is the logistic σ instead of Φ, so parameter groups, the
hardening schedule and ``to_relu_`` all apply). Its gate's L1 distance to the step is
∫|σ(βx) − H(x)| dx = 2·ln 2 / β, so the same ε gives β_target = 2·ln 2 / ε, and the same starting
gap as a λ-GELU at λ₀ means β₀ = λ₀·√(2π)·ln 2.
"""
from __future__ import annotations

import math

import torch

import lambda_gelu as lg


def swish_target(epsilon: float) -> float:
    """β whose gate σ(βx) is within L1 distance ε of the step."""
    return 2.0 * math.log(2.0) / epsilon


def swish_init(init_lambda: float) -> float:
    """β with the same gate-to-step gap as a λ-GELU at ``init_lambda``."""
    return init_lambda * math.sqrt(2.0 * math.pi) * math.log(2.0)


class LearnableSwish(lg.LambdaGELU):
    """x·σ(βx), β = 1 + softplus(s/t) learned; ``.lam`` is β."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        beta = self._lambda()
        if beta.dim() == 1:
            beta = beta.view((-1,) + (1,) * (x.dim() - self.channel_dim % x.dim() - 1))
        return x * torch.sigmoid(beta * x)
