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
