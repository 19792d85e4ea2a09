"""What the steps of every schedule share: the default optimizer, its falling learning rate, the progress bar."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn


def adamw(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=weight_decay)


def lr_decay(optimizer: torch.optim.Optimizer | None, steps: int | Callable[[], int], lr_schedule: str):
    """The scheduler of ``lr_schedule="linear"`` over ``steps`` optimizer steps, or over what ``steps()`` says at
    each step when a plan may change them (None: constant)."""
    if optimizer is None or lr_schedule == "constant":
        return None
    total = steps if callable(steps) else lambda: steps
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: max(0.0, 1 - i / total()))


def progress_bar(total: int, enabled: bool):
    if enabled:
        try:
            from tqdm import tqdm
            return tqdm(total=total, desc="reluize", unit="step")
        except ImportError:
            pass
    return _Quiet()


class _Quiet:
    total = 0

    def refresh(self): ...
    def set_postfix_str(self, *_): ...
    def update(self, *_): ...
    def close(self): ...
