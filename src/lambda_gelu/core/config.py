"""``LambdaGELUConfig``: the paper's settings in one place, taken by every entry point (the layer,
conversion, parameter groups, the hardening schedule, the integrations and the lab)."""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass

from ..errors import field_check
from .functional import lambda_target

__all__ = ["LambdaGELUConfig", "DEFAULTS"]


@dataclass(frozen=True)
class LambdaGELUConfig:
    init_lambda: float = 1.5     # λ₀: close to GELU (gap 0.53 vs 0.80) where λ still learns (see LambdaGELU)
    temperature: float = 0.1     # t in λ = 1 + softplus(s/t)
    multiplier: float = 9.0      # c: λ's learning rate is c·η, with no weight decay
    switch_at: float = 0.25      # fraction of training after which λ is frozen and annealed
    epsilon: float = 0.005       # L1 gap between gate and step at the end → λ_target = 2/(ε√(2π)) ≈ 159.6
    per_channel: bool = False    # one λ per channel (conversion then needs an example input)

    def __post_init__(self):
        need = field_check(self)

        def real(name):
            v = getattr(self, name)
            return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)

        need(real("init_lambda") and self.init_lambda >= 1, "init_lambda", "a finite number ≥ 1 (1 is exact GELU)")
        need(real("temperature") and self.temperature > 0, "temperature", "a finite number > 0")
        need(real("multiplier") and self.multiplier >= 0, "multiplier", "a finite number ≥ 0")
        need(real("switch_at") and 0 <= self.switch_at < 1, "switch_at", "a fraction of training in [0, 1)")
        need(real("epsilon") and 0 < self.epsilon < 2 / math.sqrt(2 * math.pi), "epsilon",
             "in (0, 0.798): below the gap of GELU itself")
        need(isinstance(self.per_channel, bool), "per_channel", "True or False")

    @property
    def lambda_target(self) -> float:
        return lambda_target(self.epsilon)

    def replace(self, **changes) -> "LambdaGELUConfig":
        return dataclasses.replace(self, **changes)


DEFAULTS = LambdaGELUConfig()
