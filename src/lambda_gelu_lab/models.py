"""Models of the lab's tasks. Each takes ``act``: a zero-argument factory of activation modules,
called once per activation layer, so every layer gets its own module (and its own λ)."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch.nn as nn

ActFactory = Callable[[], nn.Module]


class MLP(nn.Sequential):
    """Flatten → [Linear → act] × len(hidden) → Linear."""

    def __init__(self, in_features: int, hidden: Sequence[int], num_classes: int, act: ActFactory):
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for h in hidden:
            layers += [nn.Linear(width, h), act()]
            width = h
        layers.append(nn.Linear(width, num_classes))
        super().__init__(*layers)


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(LN(x)), then x + MLP(LN(x)) with the activation inside."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int, act: ActFactory, dropout: float = 0.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), act(), nn.Linear(mlp_ratio * dim, dim))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))
