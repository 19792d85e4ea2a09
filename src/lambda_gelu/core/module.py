"""``LambdaGELU``: the λ-GELU activation as a layer with a learnable, constrained hardness λ."""
from __future__ import annotations

import math
import numbers

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .config import DEFAULTS
from .functional import lambda_gelu, lambda_target
from .silu import lambda_silu, silu_lambda_target

__all__ = ["LambdaGELU", "LambdaSiLU", "lambda_to_raw", "raw_to_lambda"]

DEFAULT_INIT_LAMBDA = DEFAULTS.init_lambda
DEFAULT_TEMPERATURE = DEFAULTS.temperature
RAW_EXACT_GELU = -1000.0  # s/t at or below which λ is exactly 1: softplus(−1000) = 0 in every float type
_HALF = (torch.float16, torch.bfloat16)
# The hardening state, as buffers: name → (dtype, default, one per channel? — None: sized on first use).
# Default: learning.
_STATE = {
    "lambda_frozen": (torch.bool, False, False),
    "lambda_fixed": (torch.float32, 1.0, True),     # λ while frozen
    "lambda_start": (torch.float32, 1.0, True),     # λ when it was frozen (or began annealing while learning)
    # annealing while still learning (HardeningSchedule(freeze=False)): λ = (1 − w)·λ(s) + w·lambda_fixed
    "lambda_annealing": (torch.bool, False, False),
    "anneal_weight": (torch.float32, 0.0, False),   # w, from 0 at the switch to 1 at the end
    "hardening_step": (torch.int64, 0, False),      # steps the hardening schedule has taken
    # the automatic switch point (HardeningSchedule(switch_at="auto"), see schedule.AutoSwitch)
    "switch_step": (torch.int64, -1, False),        # the step λ was frozen at; −1: not decided yet
    "switch_checks": (torch.int64, 0, False),       # sign-pattern checks done on the probe batch
    "switch_best": (torch.float64, math.inf, False),  # lowest pattern drift seen
    "switch_stale": (torch.int64, 0, False),        # checks since the drift last fell by min_gain
    "switch_signs": (torch.uint8, 0, None),         # the last `window` sign patterns, bit-packed: sized on use
}


def raw_to_lambda(s: Tensor, temperature: float) -> Tensor:
    """λ = 1 + softplus(s / t): every real s maps to a λ ≥ 1 (s/t ≤ −1000 gives exactly 1)."""
    return 1.0 + F.softplus(s / temperature)


def lambda_to_raw(lam: float | Tensor, temperature: float) -> Tensor:
    """The inverse of :func:`raw_to_lambda`, computed in float64: s = t · softplus⁻¹(λ − 1). λ = 1
    maps to the finite s = −1000·t (not −∞), so that arithmetic on parameters (norms, averages,
    clipping) never meets inf or NaN."""
    y = torch.as_tensor(lam, dtype=torch.float64) - 1.0
    if bool((y < 0).any()) or not bool(torch.isfinite(y).all()):
        raise ValueError(f"λ must be ≥ 1 and finite, got {lam}"
                         + ("; the ReLU limit is nn.ReLU itself (lambda_gelu.to_relu_)" if bool(torch.isinf(y).any())
                            else ""))
    # softplus⁻¹(y) = y + log(1 − e^{−y}); F.softplus returns its input unchanged above 20, so do we.
    inv = torch.where(y > 20.0, y, y + torch.log(-torch.expm1(-y)))
    return temperature * inv.clamp(min=RAW_EXACT_GELU)


class LambdaGELU(nn.Module):
    r"""λ-GELU, f(x; λ) = x · Φ(λx), with one learnable λ per layer (or per channel).

    λ = 1 is exact GELU, λ → ∞ is ReLU. The module holds a raw parameter ``s`` and uses

        λ = 1 + softplus(s / t),      t = ``temperature`` (0.1 by default),

    so λ ≥ 1 whatever the optimizer does. Derivatives (see :mod:`lambda_gelu.core.functional`):

        ∂f/∂x = Φ(λx) + λx · φ(λx),      ∂f/∂λ = x² · φ(λx),      ∂λ/∂s = σ(s/t) / t,

    hence a plain SGD step of learning rate η_s on ``s`` moves λ by approximately

        Δλ ≈ −η_s · σ(s/t)² / t² · ∂L/∂λ.

    The temperature amplifies λ's step by 1/t²; :func:`lambda_gelu.lambda_param_groups` gives ``s``
    its own learning rate (c·η) and no weight decay, which would otherwise pull λ towards 1 + ln 2.

    Frozen λ (hardening). :meth:`freeze` makes λ the buffer ``lambda_fixed`` (set by
    :meth:`set_lambda`, e.g. by :class:`lambda_gelu.HardeningSchedule`) while ``s`` stays in the graph
    with a zero gradient. So freezing never changes which parameters receive gradients (as
    DistributedDataParallel requires), no optimizer state (momentum, Adam's moments, weight
    decay) can move a frozen λ, and everything the schedule needs — ``lambda_frozen``,
    ``lambda_fixed``, ``lambda_start`` (λ when frozen) and ``hardening_step`` — is in the module's
    buffers: ``model.state_dict()`` is a complete checkpoint under any framework. The alternative,
    :meth:`anneal_towards`, hardens without freezing: λ = (1 − w)·λ(s) + w·target with ``s`` still
    learning (buffers ``lambda_annealing``, ``anneal_weight``; the target in ``lambda_fixed``).

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
        inplace: ignored (the output is always a new tensor); accepted so that timm's
            ``create_model(..., act_layer=LambdaGELU)`` can pass it, as to any of its activations.
    """

    def __init__(
        self,
        init_lambda: float = DEFAULT_INIT_LAMBDA,
        temperature: float = DEFAULT_TEMPERATURE,
        num_channels: int | None = None,
        channel_dim: int = -1,
        inplace: bool = False,
    ):
        super().__init__()  # inplace: accepted as every timm activation accepts it; λ-GELU is never in place
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
        for name, (dtype, default, per_channel) in _STATE.items():
            size = (0,) if per_channel is None else shape if per_channel else ()
            self.register_buffer(name, torch.full(size, default, dtype=dtype))

    def _lambda(self) -> Tensor:
        learned = raw_to_lambda(self.s, self.temperature)
        fixed = self.lambda_fixed.to(learned.dtype)
        w = self.anneal_weight.to(learned.dtype)
        current = torch.where(self.lambda_annealing, (1.0 - w) * learned + w * fixed, learned)
        # frozen: the fixed λ, and s in the graph with a zero gradient (never unused, never moved)
        return torch.where(self.lambda_frozen, fixed, current)

    @property
    def lam(self) -> Tensor:
        """The current λ (detached copy, for logging)."""
        with torch.no_grad():
            return self._lambda().detach().clone()

    @property
    def frozen(self) -> bool:
        return bool(self.lambda_frozen)

    @torch.no_grad()
    def freeze(self) -> None:
        """Stop learning λ: from now on λ is ``lambda_fixed`` (the current λ until :meth:`set_lambda`
        changes it) and ``s`` receives a zero gradient. The λ at this moment is kept in
        ``lambda_start``. Freezing a frozen module changes nothing."""
        if self.frozen:
            return
        lam = raw_to_lambda(self.s, self.temperature)
        self.lambda_start.copy_(lam)
        self.lambda_fixed.copy_(lam)
        self.lambda_frozen.fill_(True)

    @torch.no_grad()
    def anneal_towards(self, target: float, weight: float) -> None:
        """Anneal without freezing: λ = (1 − weight)·λ(s) + weight·target, ``s`` still learning (its
        gradient scaled by 1 − weight). ``weight`` = 1 gives exactly ``target``. The learned λ when
        this is first called is kept in ``lambda_start``. The alternative to :meth:`freeze` that the
        freeze ablation compares against (``HardeningSchedule(freeze=False)``)."""
        if self.frozen:
            raise RuntimeError("anneal_towards() on a frozen LambdaGELU: it was hardened with freeze=True")
        if not (1.0 <= target < math.inf and 0.0 <= weight <= 1.0):
            raise ValueError(f"anneal_towards needs a finite target ≥ 1 and a weight in [0, 1], got {target}, {weight}")
        if not self.lambda_annealing:
            self.lambda_start.copy_(raw_to_lambda(self.s, self.temperature))
            self.lambda_annealing.fill_(True)
        self.lambda_fixed.fill_(target)
        self.anneal_weight.fill_(weight)

    @torch.no_grad()
    def unfreeze(self) -> None:
        """Learn λ again, from its current (fixed) value."""
        if self.frozen:
            self.s.copy_(lambda_to_raw(self.lambda_fixed.double(), self.temperature).to(self.s.dtype))
            self.lambda_frozen.fill_(False)

    @torch.no_grad()
    def set_lambda(self, value: float | Tensor) -> None:
        """Set λ (a number, or one value per channel): the fixed λ if frozen, else through ``s``."""
        raw = lambda_to_raw(value, self.temperature)  # validates λ ≥ 1
        if raw.dim() > 0 and raw.shape != self.s.shape:
            raise ValueError(f"set_lambda got shape {tuple(raw.shape)} for λ of shape {tuple(self.s.shape)}")
        if self.frozen:
            value = torch.as_tensor(value, dtype=torch.float64)
            self.lambda_fixed.copy_(value.to(self.lambda_fixed.dtype).expand_as(self.lambda_fixed))
        else:
            self.s.copy_(raw.to(self.s.dtype).expand_as(self.s))

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # checkpoints from before the hardening state lived in buffers: a learning (unfrozen) module
        for name, (_, default, _) in _STATE.items():
            if prefix + "s" in state_dict and prefix + name not in state_dict:
                state_dict[prefix + name] = getattr(self, name).clone().fill_(default)
        saved = state_dict.get(prefix + "switch_signs")  # sized by the probe batch it was taken on
        if saved is not None and saved.shape != self.switch_signs.shape:
            self.switch_signs = self.switch_signs.new_zeros(saved.shape)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def _apply(self, fn, recurse=True):
        """Keep ``s`` in its precision when the model is cast to float16/bfloat16 (``.half()``,
        ``.to(torch.bfloat16)``): near λ_target float16 resolves λ only to about ±0.1. The input is
        still computed in float32 and returned in its own dtype, as for any half-precision input."""
        before = {name: t.data for name, t in (("s", self.s), ("lambda_fixed", self.lambda_fixed),
                                               ("lambda_start", self.lambda_start), ("switch_best", self.switch_best),
                                               ("anneal_weight", self.anneal_weight))}
        super()._apply(fn, recurse)
        for name, old in before.items():
            t = getattr(self, name)
            if t.dtype in _HALF and old.dtype not in _HALF:
                if name == "s":
                    t.data = old.to(t.device)
                    if t.grad is not None:
                        t.grad = t.grad.to(old.dtype)
                else:
                    setattr(self, name, old.to(t.device))
        return self

    _activation = staticmethod(lambda_gelu)   # the gate's op, f(x; λ)
    _target = staticmethod(lambda_target)      # ε → the λ at which the gate is within ε of the step

    def lambda_target_for(self, epsilon: float) -> float:
        """The λ at which this layer's gate is within L1 distance ``epsilon`` of the step."""
        return self._target(epsilon)

    def forward(self, x: Tensor) -> Tensor:
        return self._activation(x, self._lambda(), self.channel_dim)

    def extra_repr(self) -> str:
        lam = self.lam
        if lam.dim() == 0:
            desc = f"lam={lam.item():.4g}"
        else:
            desc = (f"num_channels={self.num_channels}, channel_dim={self.channel_dim}, "
                    f"lam=[{lam.min().item():.4g}, {lam.max().item():.4g}]")
        state = ", frozen" if self.frozen else ", annealing" if bool(self.lambda_annealing) else ""
        return f"{desc}, temperature={self.temperature:g}" + state


class LambdaSiLU(LambdaGELU):
    """λ-SiLU, x · σ(λx) (:mod:`lambda_gelu.core.silu`): exact SiLU at λ = 1, ReLU as λ → ∞, for the SiLU gates of
    gated FFNs (SwiGLU). Everything else is :class:`LambdaGELU`'s: the parametrisation λ = 1 + softplus(s/t), the
    hardening state in buffers, ``freeze``/``set_lambda``; its λ_target for a gap ε is 2 ln 2 / ε (≈ 277)."""
    _activation = staticmethod(lambda_silu)
    _target = staticmethod(silu_lambda_target)
