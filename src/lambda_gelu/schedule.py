"""The hardening schedule: learn λ, then freeze it and anneal linearly to λ_target."""
from __future__ import annotations

import numbers

import torch
import torch.nn as nn

from .config import DEFAULTS, LambdaGELUConfig
from .convert import lambda_modules
from .functional import lambda_target as _lambda_target

__all__ = ["HardeningSchedule"]

_WRAPPERS = ("_orig_mod.", "module.")  # torch.compile and DistributedDataParallel / DataParallel


def canonical_name(name: str) -> str:
    """A layer's name without the prefixes that compile and DDP wrappers add."""
    while name.startswith(_WRAPPERS):
        name = name.split(".", 1)[1]
    return name.replace("._orig_mod.", ".")


def _is_sharded(p: torch.Tensor) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch built without distributed support
        return False
    return isinstance(p, DTensor)


class HardeningSchedule:
    """Call ``.step()`` after every optimizer step (or ``.step(global_step)`` with a trainer's count).

    Steps ``k = 0 … switch_step`` leave λ to the optimizer. At ``switch_step = floor(switch_at ·
    total_steps)`` every λ-GELU is frozen (see :meth:`LambdaGELU.freeze`: λ becomes a buffer, ``s``
    keeps a zero gradient, so no optimizer moves it and DDP sees the same parameters as before)
    and its learned λ is recorded. From there λ follows the straight line

        λ_k = (1 − a) · λ_learned + a · λ_target,     a = (k − switch_step) / (total_steps − switch_step),

    reaching λ_target at ``k = total_steps`` and staying there. Per-channel λ is annealed per channel.
    ``lambda_target`` defaults to the λ whose gate is within L1 distance ``epsilon`` of the step
    (≈ 159.6 for ε = 0.005); give one or the other. ``switch_at`` and ``epsilon`` default to
    ``config`` (:data:`lambda_gelu.DEFAULTS`).

    The schedule holds no state of its own: the step count, the frozen flag and the learned λ live in
    each module's buffers, so ``model.state_dict()`` — saved by any framework, under any wrapper —
    is a complete checkpoint, and a schedule built on the restored model continues exactly.
    """

    def __init__(self, model: nn.Module, total_steps: int, switch_at: float | None = None,
                 epsilon: float | None = None, lambda_target: float | None = None,
                 config: LambdaGELUConfig | None = None):
        config = config or DEFAULTS
        switch_at = config.switch_at if switch_at is None else switch_at
        if not isinstance(total_steps, numbers.Integral) or isinstance(total_steps, bool) or total_steps < 1:
            raise ValueError(f"total_steps must be a positive int, got {total_steps!r}")
        if not isinstance(switch_at, numbers.Real) or not 0.0 <= switch_at < 1.0:
            raise ValueError(f"switch_at is a fraction of training in [0, 1), got {switch_at!r}")
        if epsilon is not None and lambda_target is not None:
            raise ValueError("give epsilon or lambda_target, not both")
        if lambda_target is None:
            lambda_target = _lambda_target(config.epsilon if epsilon is None else epsilon)
        elif not isinstance(lambda_target, numbers.Real) or not 1.0 < lambda_target < float("inf"):
            raise ValueError(f"lambda_target must be a finite number > 1, got {lambda_target!r}")
        self.modules = {canonical_name(n): m for n, m in lambda_modules(model)}
        if not self.modules:
            raise ValueError("HardeningSchedule found no LambdaGELU in the model; "
                             "call lambda_gelu.convert_to_lambda_gelu_(model) first")
        sharded = [name for name, m in self.modules.items() if _is_sharded(m.s)]
        if sharded:  # freeze() would read a shard of s as if it were λ's raw value
            raise NotImplementedError(
                f"the λ parameters of {sharded[0]!r} are sharded (FSDP's fully_shard), which the hardening "
                "schedule does not support yet; wrap the model with DistributedDataParallel instead")
        self.total_steps = int(total_steps)
        self.switch_at = float(switch_at)
        self.switch_step = int(self.switch_at * self.total_steps)
        self.lambda_target = float(lambda_target)
        self._apply()

    @property
    def step_count(self) -> int:
        """Schedule steps taken, as recorded in the modules (restored with the model's state)."""
        return int(next(iter(self.modules.values())).hardening_step)

    @property
    def hardening(self) -> bool:
        """True once λ is frozen and being annealed."""
        return self.step_count >= self.switch_step

    @property
    def learned(self) -> dict[str, torch.Tensor] | None:
        """λ of every layer when it was frozen, by name; None before the switch."""
        if not self.hardening:
            return None
        return {name: m.lambda_start.double().clone() for name, m in self.modules.items()}

    def step(self, global_step: int | None = None) -> None:
        """Advance by one step, or to ``global_step`` (a trainer's count of optimizer steps taken)."""
        k = self.step_count + 1 if global_step is None else int(global_step)
        if k < 0:
            raise ValueError(f"global_step must be ≥ 0, got {global_step!r}")
        for m in self.modules.values():
            m.hardening_step.fill_(k)
        self._apply()

    def _apply(self) -> None:
        k = self.step_count
        if k < self.switch_step:
            return
        a = min(1.0, (k - self.switch_step) / (self.total_steps - self.switch_step))
        for m in self.modules.values():
            m.freeze()  # records λ_learned the first time; no-op after
            m.set_lambda((1.0 - a) * m.lambda_start.double() + a * self.lambda_target)

    def current_lambdas(self) -> dict[str, float | list[float]]:
        """λ of every layer by qualified name, for logging."""
        return {name: m.lam.tolist() for name, m in self.modules.items()}

    def state_dict(self) -> dict:
        """The schedule's settings and step, for checking a resume; the state itself is in the model."""
        return {"step_count": self.step_count, "total_steps": self.total_steps, "switch_step": self.switch_step,
                "lambda_target": self.lambda_target}

    def load_state_dict(self, state: dict) -> None:
        for key in ("total_steps", "switch_step", "lambda_target"):
            if state[key] != getattr(self, key):
                raise ValueError(f"schedule state has {key}={state[key]} but this schedule has "
                                 f"{getattr(self, key)}; build it with the same arguments")
        if state["step_count"] != self.step_count:
            raise ValueError(f"schedule state is at step {state['step_count']} but the model's λ layers are at "
                             f"{self.step_count}: load the model's state_dict from the same checkpoint")

    def __repr__(self) -> str:
        return (f"HardeningSchedule(step={self.step_count}/{self.total_steps}, "
                f"switch_step={self.switch_step}, lambda_target={self.lambda_target:.4g})")
