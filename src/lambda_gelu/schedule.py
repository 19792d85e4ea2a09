"""The hardening schedule: learn λ, then freeze it and anneal linearly to λ_target."""
from __future__ import annotations

import numbers

import torch
import torch.nn as nn

from .convert import lambda_modules
from .functional import lambda_target as _lambda_target

__all__ = ["HardeningSchedule"]


class HardeningSchedule:
    """Call ``.step()`` after every optimizer step.

    Steps ``k = 0 … switch_step`` leave λ to the optimizer. At ``switch_step = floor(switch_at ·
    total_steps)`` every λ-GELU is frozen (``s`` gets no gradient, so no optimizer moves it, momentum
    included) and its learned λ is recorded. From there λ follows the straight line

        λ_k = (1 − a) · λ_learned + a · λ_target,     a = (k − switch_step) / (total_steps − switch_step),

    reaching λ_target at ``k = total_steps`` (up to the float32 rounding of ``s``, one ulp of λ) and
    staying there. Per-channel λ is annealed
    per channel. ``lambda_target`` defaults to the λ whose gate is within L1 distance ``epsilon`` of
    the step (≈ 159.6 for ε = 0.005); give one or the other.

    ``state_dict()`` holds the step count and the learned λ, so a run restored from a checkpoint of
    (model, optimizer, schedule) continues exactly as if it had never stopped.
    """

    def __init__(self, model: nn.Module, total_steps: int, switch_at: float = 0.25,
                 epsilon: float | None = None, lambda_target: float | None = None):
        if not isinstance(total_steps, numbers.Integral) or isinstance(total_steps, bool) or total_steps < 1:
            raise ValueError(f"total_steps must be a positive int, got {total_steps!r}")
        if not isinstance(switch_at, numbers.Real) or not 0.0 <= switch_at < 1.0:
            raise ValueError(f"switch_at is a fraction of training in [0, 1), got {switch_at!r}")
        if epsilon is not None and lambda_target is not None:
            raise ValueError("give epsilon or lambda_target, not both")
        if lambda_target is None:
            lambda_target = _lambda_target(0.005 if epsilon is None else epsilon)
        elif not isinstance(lambda_target, numbers.Real) or not 1.0 < lambda_target < float("inf"):
            raise ValueError(f"lambda_target must be a finite number > 1, got {lambda_target!r}")
        self.modules = dict(lambda_modules(model))
        if not self.modules:
            raise ValueError("HardeningSchedule found no LambdaGELU in the model; "
                             "call lambda_gelu.convert_to_lambda_gelu_(model) first")
        self.total_steps = int(total_steps)
        self.switch_at = float(switch_at)
        self.switch_step = int(self.switch_at * self.total_steps)
        self.lambda_target = float(lambda_target)
        self.step_count = 0
        self.learned: dict[str, torch.Tensor] | None = None
        self._apply()

    @property
    def hardening(self) -> bool:
        """True once λ is frozen and being annealed."""
        return self.learned is not None

    def step(self) -> None:
        self.step_count += 1
        self._apply()

    def _apply(self) -> None:
        if self.step_count < self.switch_step:
            return
        if self.learned is None:
            self.learned = {}
            for name, m in self.modules.items():
                m.freeze()
                self.learned[name] = m.lam.double()
        a = min(1.0, (self.step_count - self.switch_step) / (self.total_steps - self.switch_step))
        for name, m in self.modules.items():
            m.set_lambda((1.0 - a) * self.learned[name] + a * self.lambda_target)

    def current_lambdas(self) -> dict[str, float | list[float]]:
        """λ of every layer by qualified name, for logging."""
        return {name: m.lam.tolist() for name, m in self.modules.items()}

    def state_dict(self) -> dict:
        return {
            "step_count": self.step_count,
            "total_steps": self.total_steps,
            "switch_step": self.switch_step,
            "lambda_target": self.lambda_target,
            "learned": None if self.learned is None else {k: v.clone() for k, v in self.learned.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        for key in ("total_steps", "switch_step", "lambda_target"):
            if state[key] != getattr(self, key):
                raise ValueError(f"schedule state has {key}={state[key]} but this schedule has "
                                 f"{getattr(self, key)}; build it with the same arguments")
        learned = state["learned"]
        if learned is not None and set(learned) != set(self.modules):
            raise ValueError(f"schedule state names layers {sorted(learned)} but the model has "
                             f"{sorted(self.modules)}")
        self.step_count = int(state["step_count"])
        self.learned = None if learned is None else {k: v.clone() for k, v in learned.items()}
        if self.learned is not None:
            for m in self.modules.values():
                m.freeze()
        self._apply()

    def __repr__(self) -> str:
        return (f"HardeningSchedule(step={self.step_count}/{self.total_steps}, "
                f"switch_step={self.switch_step}, lambda_target={self.lambda_target:.4g})")
