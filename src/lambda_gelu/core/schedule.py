"""The hardening schedule: learn λ, then freeze it and anneal linearly to λ_target — at a fixed
fraction of training, or when the λ-GELU layers' sign patterns have settled (``switch_at="auto"``)."""
from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn as nn

from ..errors import field_check
from .batches import run_batch
from .config import DEFAULTS, LambdaGELUConfig
from .convert import eval_mode, lambda_modules
from .distributed import _is_sharded
from .functional import lambda_target as _lambda_target

__all__ = ["HardeningSchedule", "AutoSwitch"]

_WRAPPERS = ("_orig_mod.", "module.")  # torch.compile and DistributedDataParallel / DataParallel
_POPCOUNT = torch.tensor([bin(i).count("1") for i in range(256)], dtype=torch.int64)
_BIT = 1 << torch.arange(8, dtype=torch.uint8)


def canonical_name(name: str) -> str:
    """A layer's name without the prefixes that compile and DDP wrappers add."""
    while name.startswith(_WRAPPERS):
        name = name.split(".", 1)[1]
    return name.replace("._orig_mod.", ".")


@dataclass(frozen=True)
class AutoSwitch:
    """When ``switch_at="auto"`` switches: once the λ-GELU layers' on/off patterns have stopped drifting.

    Every ``every`` of training the schedule runs a fixed probe batch through the model (eval mode, no
    gradients) and records the sign of every λ-GELU input — the on/off state of each unit on each probe
    example; sign(x·Φ(λx)) = sign(x), so λ itself does not enter. The *drift* is the fraction of these
    signs that differ from the pattern ``window`` checks earlier. Early in training it falls quickly as
    the network's structure forms, then flattens at the level that SGD noise keeps flipping. λ is frozen
    (and annealed from there) once the drift has not fallen below ``(1 − min_gain)`` × its lowest value
    so far for ``patience`` checks in a row — never before ``earliest`` nor after ``latest`` of training.

    With the defaults a check every 2% of training compares against the pattern 10% of training
    earlier; on the lab's Fashion-MNIST and MNIST-1D MLPs the drift flattens near 20–25% of training.
    """
    every: float = 0.02     # check interval, as a fraction of training
    window: int = 5         # drift is measured against the pattern this many checks earlier
    min_gain: float = 0.1   # a fall in drift smaller than this fraction of its best is no progress
    patience: int = 3       # checks without progress before the switch
    earliest: float = 0.1   # never switch before this fraction of training ...
    latest: float = 0.5     # ... nor after this one

    def __post_init__(self):
        need = field_check(self)

        def fraction(name):
            v = getattr(self, name)
            return isinstance(v, numbers.Real) and not isinstance(v, bool) and 0 <= v < 1

        need(fraction("every") and self.every > 0, "every", "a fraction of training in (0, 1)")
        for name in ("window", "patience"):
            v = getattr(self, name)
            need(isinstance(v, int) and not isinstance(v, bool) and v >= 1, name, "a positive int")
        need(fraction("min_gain"), "min_gain", "a fraction in [0, 1)")
        need(fraction("earliest"), "earliest", "a fraction of training in [0, 1)")
        need(fraction("latest") and self.latest >= self.earliest, "latest", "a fraction of training in [earliest, 1)")

    def check_interval(self, total_steps: int) -> int:
        """Optimizer steps between two checks in a training of ``total_steps`` steps."""
        return max(1, round(self.every * total_steps))


def _pack(bits: torch.Tensor) -> torch.Tensor:
    """A flat bool tensor as bytes, 8 signs per byte (zero padding)."""
    bits = torch.nn.functional.pad(bits.to(torch.uint8), (0, -bits.numel() % 8))
    return (bits.view(-1, 8) * _BIT.to(bits.device)).sum(1, dtype=torch.uint8)


def _on_device(probe, device: torch.device):
    if isinstance(probe, torch.Tensor):
        return probe.to(device)
    if isinstance(probe, Mapping):
        return {k: _on_device(v, device) for k, v in probe.items()}
    if isinstance(probe, (tuple, list)):
        return type(probe)(_on_device(v, device) for v in probe)
    return probe


def _unwrapped(model: nn.Module) -> nn.Module:
    """The module under DDP's and torch.compile's wrappers: probing it runs no collective, no recompile."""
    while True:
        if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):
            model = model._orig_mod
        else:
            return model


def _rank0_says(flag: bool, device: torch.device) -> bool:
    """``flag`` as rank 0 has it when torch.distributed is running (every rank calls this at the same
    check), else ``flag``: replicas that round differently still switch at one step."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return flag
    t = torch.tensor([int(flag)], device=device)
    torch.distributed.broadcast(t, src=0)
    return bool(t.item())


def _switch_rule(switch_at: float | str | AutoSwitch, probe) -> AutoSwitch | None:
    """The :class:`AutoSwitch` that ``switch_at`` asks for, or None for a fixed fraction; a clear error
    for anything else, or for a probe missing where ``"auto"`` needs one (or given where nothing uses it).
    :class:`HardeningSchedule` and :func:`_check_callback_arguments` check with it."""
    auto = AutoSwitch() if isinstance(switch_at, str) and switch_at == "auto" else \
        switch_at if isinstance(switch_at, AutoSwitch) else None
    if auto is None and (not isinstance(switch_at, numbers.Real) or isinstance(switch_at, bool)
                         or not 0.0 <= switch_at < 1.0):
        raise ValueError(f"switch_at is a fraction of training in [0, 1) or 'auto', got {switch_at!r}")
    if auto is not None and probe is None:
        raise ValueError("switch_at='auto' needs probe=: a fixed batch of inputs (e.g. 256 training examples) "
                         "whose sign patterns tell when to switch")
    if auto is None and probe is not None:
        raise ValueError(f"probe= is only used with switch_at='auto', but switch_at={switch_at!r}")
    return auto


def _check_callback_arguments(switch_at, epsilon: float | None, config: LambdaGELUConfig | None, probe) -> None:
    """What :class:`HardeningSchedule` would refuse among a trainer callback's arguments, checked when the
    callback is built (where they were written) rather than once training has started and builds the schedule."""
    _switch_rule((config or DEFAULTS).switch_at if switch_at is None else switch_at, probe)
    if epsilon is not None:
        _lambda_target(epsilon)


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

    ``switch_at="auto"`` (or an :class:`AutoSwitch` with its own settings) chooses ``switch_step``
    during training: when the sign patterns of the λ-GELU inputs on ``probe`` — a fixed batch, passed
    to the model as ``model(probe)``, ``model(*probe)`` for a tuple or ``model(**probe)`` for a dict —
    have stopped drifting (see :class:`AutoSwitch`). ``switch_step`` is None until then. Under DDP every
    rank probes its own replica and rank 0's decision is broadcast, so all ranks switch together.

    ``freeze=False`` is the ablation of the freeze: λ keeps learning during the anneal, as
    ``λ_k = (1 − a) · λ(s) + a · λ_target`` with ``s`` still trained (:meth:`LambdaGELU.anneal_towards`);
    it reaches λ_target exactly at the end, where ``s`` no longer matters. With ``freeze=True`` (the
    paper's method) the same line starts from the λ learned at the switch, fixed.

    The schedule holds no state of its own: the step count, the frozen flag, the learned λ and the
    automatic switch's history live in each module's buffers, so ``model.state_dict()`` — saved by any
    framework, under any wrapper — is a complete checkpoint, and a schedule built on the restored model
    continues exactly.
    """

    def __init__(self, model: nn.Module, total_steps: int, switch_at: float | str | AutoSwitch | None = None,
                 epsilon: float | None = None, lambda_target: float | None = None,
                 config: LambdaGELUConfig | None = None, probe=None, freeze: bool = True):
        config = config or DEFAULTS
        switch_at = config.switch_at if switch_at is None else switch_at
        if not isinstance(total_steps, numbers.Integral) or isinstance(total_steps, bool) or total_steps < 1:
            raise ValueError(f"total_steps must be a positive int, got {total_steps!r}")
        self.auto = _switch_rule(switch_at, probe)
        if epsilon is not None and lambda_target is not None:
            raise ValueError("give epsilon or lambda_target, not both")
        self.epsilon = None if lambda_target is not None else config.epsilon if epsilon is None else epsilon
        if lambda_target is None:
            lambda_target = _lambda_target(self.epsilon)
        elif not isinstance(lambda_target, numbers.Real) or not 1.0 < lambda_target < float("inf"):
            raise ValueError(f"lambda_target must be a finite number > 1, got {lambda_target!r}")
        self.modules = {canonical_name(n): m for n, m in lambda_modules(model)}
        if not self.modules:
            raise ValueError("HardeningSchedule found no LambdaGELU in the model; "
                             "call lambda_gelu.convert_to_lambda_gelu_(model) first")
        sharded = [name for name, m in self.modules.items() if _is_sharded(m.s)]
        if sharded:  # freeze() would read a shard of s as if it were λ's raw value
            raise ValueError(
                f"the λ of {sharded[0]!r} is sharded by FSDP's fully_shard, but the schedule reads every λ whole: "
                "keep λ out of FSDP with fully_shard(..., ignored_params=lambda_gelu.replicate_lambdas(model))")
        hardened_otherwise = [name for name, m in self.modules.items()
                              if (m.frozen and not freeze) or (bool(m.lambda_annealing) and freeze)]
        if hardened_otherwise:
            raise ValueError(f"{hardened_otherwise[0]!r} was hardened with freeze={not freeze}; resume with the same "
                             "freeze= setting")
        self.freeze = bool(freeze)
        self.total_steps = int(total_steps)
        self.lambda_target = float(lambda_target)
        if self.auto is None:
            self.switch_at = float(switch_at)
            self._switch_step = int(self.switch_at * self.total_steps)
        else:
            self.switch_at = "auto"
            self._model = _unwrapped(model)
            self._probe = _on_device(probe, next(iter(self.modules.values())).s.device)
            self._every = self.auto.check_interval(self.total_steps)
            self._earliest = math.ceil(self.auto.earliest * self.total_steps)
            self._latest = int(self.auto.latest * self.total_steps)
            if self._state("switch_checks") == 0 and self.step_count == 0:
                self._check()  # the pattern at step 0; also tells at once if the probe does not run
            if self.switch_step is None and self.step_count >= self._latest:
                self._fill("switch_step", self.step_count)
        self._apply()

    @property
    def step_count(self) -> int:
        """Schedule steps taken, as recorded in the modules (restored with the model's state)."""
        return self._state("hardening_step")

    @property
    def switch_step(self) -> int | None:
        """The step λ is (or was) frozen at; with ``switch_at="auto"``, None until it is chosen."""
        if self.auto is None:
            return self._switch_step
        chosen = self._state("switch_step")
        return None if chosen < 0 else chosen

    @property
    def hardening(self) -> bool:
        """True once the anneal has begun (λ frozen, or with ``freeze=False`` annealing while it learns)."""
        return self.switch_step is not None and self.step_count >= self.switch_step

    @property
    def learned(self) -> dict[str, torch.Tensor] | None:
        """λ of every layer at the switch (when it was frozen), by name; None before the switch."""
        if not self.hardening:
            return None
        return {name: m.lambda_start.double().clone() for name, m in self.modules.items()}

    def step(self, global_step: int | None = None) -> None:
        """Advance by one step, or to ``global_step`` (a trainer's count of optimizer steps taken)."""
        before = self.step_count
        k = before + 1 if global_step is None else int(global_step)
        if k < 0:
            raise ValueError(f"global_step must be ≥ 0, got {global_step!r}")
        self._fill("hardening_step", k)
        if self.auto is not None and self.switch_step is None:
            self._observe(before, k)
        self._apply()

    def _state(self, name: str):
        return next(iter(self.modules.values())).get_buffer(name).item()

    def _fill(self, name: str, value) -> None:
        for m in self.modules.values():
            m.get_buffer(name).fill_(value)

    def _observe(self, before: int, k: int) -> None:
        """Check the sign patterns if step ``k`` reached a check, and choose the switch when they have settled."""
        if k >= self._latest:  # not settled by the latest allowed step: switch now
            self._fill("switch_step", k)
            return
        if k // self._every == before // self._every:
            return
        drift = self._check()
        if drift is not None:
            if drift < (1.0 - self.auto.min_gain) * self._state("switch_best"):
                self._fill("switch_best", drift)
                self._fill("switch_stale", 0)
            else:
                self._fill("switch_stale", self._state("switch_stale") + 1)
        settled = self._state("switch_stale") >= self.auto.patience and k >= self._earliest
        if _rank0_says(settled, next(iter(self.modules.values())).switch_step.device):
            self._fill("switch_step", k)

    @torch.no_grad()
    def _check(self) -> float | None:
        """Run the probe, store each layer's sign pattern, and return the drift: the fraction of signs that
        differ from ``window`` checks earlier (None while fewer checks than that have been made)."""
        signs = {m: [] for m in self.modules.values()}
        hooks = [m.register_forward_pre_hook(lambda mod, args: signs[mod].append((args[0] > 0).reshape(-1)))
                 for m in signs]
        try:
            with eval_mode(self._model):  # no dropout: the pattern must depend on the weights alone
                run_batch(self._model, self._probe)
        except Exception as e:
            raise RuntimeError(f"HardeningSchedule could not run its probe batch through the model "
                               f"({type(e).__name__}: {e}); pass probe= as the model takes a batch") from e
        finally:
            for h in hooks:
                h.remove()
        if not any(signs.values()):
            raise ValueError("the probe batch ran through the model without reaching any LambdaGELU")
        checks = self._state("switch_checks")
        slot = checks % self.auto.window
        differ = total = 0
        for name, m in self.modules.items():
            if not signs[m]:
                continue
            pattern = torch.cat(signs[m])
            packed = _pack(pattern)
            if m.switch_signs.numel() == 0:
                m.switch_signs = packed.new_zeros(self.auto.window, packed.numel())
            elif m.switch_signs.shape != (self.auto.window, packed.numel()):
                raise ValueError(f"the sign patterns stored in {name!r} have shape {tuple(m.switch_signs.shape)}, "
                                 f"but this schedule and probe give {(self.auto.window, packed.numel())}: "
                                 "resume with the same probe batch and AutoSwitch settings")
            differ += int(_POPCOUNT.to(packed.device)[(m.switch_signs[slot] ^ packed).long()].sum())
            total += pattern.numel()
            m.switch_signs[slot] = packed
        self._fill("switch_checks", checks + 1)
        return differ / total if checks >= self.auto.window else None

    def _apply(self) -> None:
        k, switch = self.step_count, self.switch_step
        if switch is None or k < switch:
            return
        a = min(1.0, (k - switch) / (self.total_steps - switch)) if self.total_steps > switch else 1.0
        for m in self.modules.values():
            target = self.target_of(m)
            if not self.freeze:
                m.anneal_towards(target, a)  # records λ_learned the first time
                continue
            m.freeze()  # records λ_learned the first time; no-op after
            m.set_lambda((1.0 - a) * m.lambda_start.double() + a * target)

    def target_of(self, module) -> float:
        """The λ ``module`` is annealed to: ``lambda_target`` if one was given, else the λ at which its own gate
        (Φ for λ-GELU, σ for λ-SiLU) is within ``epsilon`` of the step."""
        return self.lambda_target if self.epsilon is None else module.lambda_target_for(self.epsilon)

    def current_lambdas(self) -> dict[str, float | list[float]]:
        """λ of every layer by qualified name, for logging."""
        return {name: m.lam.tolist() for name, m in self.modules.items()}

    def state_dict(self) -> dict:
        """The schedule's settings and step, for checking a resume; the state itself is in the model."""
        return {"step_count": self.step_count, "total_steps": self.total_steps, "switch_step": self.switch_step,
                "lambda_target": self.lambda_target, "freeze": self.freeze}

    def load_state_dict(self, state: dict) -> None:
        for key in ("total_steps", "switch_step", "lambda_target", "freeze"):
            theirs = state.get(key, True) if key == "freeze" else state[key]  # older states: freeze=True
            if theirs != getattr(self, key):
                raise ValueError(f"schedule state has {key}={theirs} but this schedule has "
                                 f"{getattr(self, key)}; build it with the same arguments")
        if state["step_count"] != self.step_count:
            raise ValueError(f"schedule state is at step {state['step_count']} but the model's λ layers are at "
                             f"{self.step_count}: load the model's state_dict from the same checkpoint")

    def __repr__(self) -> str:
        return (f"HardeningSchedule(step={self.step_count}/{self.total_steps}, "
                f"switch_step={self.switch_step}, lambda_target={self.lambda_target:.4g})")
