"""A run's configuration: typed, validated when built, hashed by what actually affects the run."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, fields

from lambda_gelu import DEFAULTS

from .arms import ARM_FIELDS, ARMS, LAB_POSTHOC
from lambda_gelu.errors import field_check

LATER_FIELDS = ("train_limit", "posthoc_recalibrate")


class ConfigError(ValueError):
    """A configuration value or key is wrong; the message names it and what is allowed."""


@dataclass(frozen=True)
class RunConfig:
    task: str
    arm: str
    seed: int = 0
    epochs: int = 10                # passes over the training split
    batch_size: int = 128           # examples per optimizer step
    optimizer: str = "sgd"          # "sgd" (with momentum) or "adamw"
    lr: float = 0.05                # base learning rate, peak of the schedule
    momentum: float = 0.9           # SGD only
    weight_decay: float = 5e-4      # on weights, never on λ
    warmup: float = 0.0             # fraction of steps with linear LR warm-up, then cosine to 0
    # the λ settings default to the library's (lambda_gelu.DEFAULTS, the paper's values)
    init_lambda: float = DEFAULTS.init_lambda   # λ at initialisation
    temperature: float = DEFAULTS.temperature   # t in λ = 1 + softplus(s/t)
    multiplier: float = DEFAULTS.multiplier     # λ's learning rate = multiplier · lr
    switch_at: float | str = DEFAULTS.switch_at  # fraction of training after which λ is frozen and annealed, or "auto"
    epsilon: float = DEFAULTS.epsilon           # target L1 gap between gate and step → λ_target ≈ 159.6
    sparsity: float = 1.0           # lambda-harden-sparse: the activation L1 penalty's final factor
    posthoc_budget: float = 0.1     # reluize-*: conversion steps as a fraction of the GELU training's
    posthoc_lr: float = LAB_POSTHOC.lr  # reluize-*: AdamW's learning rate during the conversion
    # reluize-swap/-anneal: batches over which BatchNorm's running statistics are re-estimated once the network is
    # ReLU; forward passes at a third of a step each, taken from the budget's steps
    posthoc_recalibrate: int = LAB_POSTHOC.recalibrate
    train_limit: int = 0            # use only the first N training examples (0: all) — for smoke tests

    def __post_init__(self):
        need = field_check(self, ConfigError, qualified=False)

        need(self.arm in ARMS, "arm", "one of " + ", ".join(ARMS))
        for name in ("seed", "epochs", "batch_size", "train_limit", "posthoc_recalibrate"):
            v = getattr(self, name)
            nonneg = name in ("seed", "train_limit", "posthoc_recalibrate")
            need(isinstance(v, int) and not isinstance(v, bool) and v >= (0 if nonneg else 1),
                 name, "a non-negative int" if nonneg else "a positive int")
        need(self.optimizer in ("sgd", "adamw"), "optimizer", "'sgd' or 'adamw'")
        for name in ("lr", "momentum", "weight_decay", "temperature", "multiplier", "epsilon", "warmup", "sparsity",
                     "posthoc_budget", "posthoc_lr"):
            v, strict = getattr(self, name), name in ("lr", "temperature", "posthoc_budget", "posthoc_lr")
            need(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0,
                 name, "a finite number > 0" if strict else "a finite number ≥ 0")
        need(self.lr > 0, "lr", "> 0")
        need(0 < self.posthoc_budget <= 1, "posthoc_budget", "in (0, 1]: a fraction of the training steps")
        need(self.temperature > 0, "temperature", "> 0")
        need(self.momentum < 1, "momentum", "< 1")
        need(self.warmup < 1, "warmup", "< 1")
        need(isinstance(self.init_lambda, (int, float)) and 1 <= self.init_lambda < math.inf, "init_lambda", "≥ 1")
        need(self.switch_at == "auto" and self.arm != "gelu-finetune" or isinstance(self.switch_at, (int, float))
             and not isinstance(self.switch_at, bool) and 0 <= self.switch_at < 1, "switch_at",
             "in [0, 1), or 'auto' (when the sign patterns settle; not for gelu-finetune, which has no λ)")
        need(0 < self.epsilon < 0.79, "epsilon", "in (0, 0.79): below GELU's own gap 2/√(2π)")
        need(self.arm != "lambda-harden-sparse" or self.switch_at != "auto", "switch_at",
             "a fraction for lambda-harden-sparse: its penalty starts rising at the switch point")
        if ARMS[self.arm].posthoc is not None:
            try:
                self.reluize_config()
            except ValueError as e:
                raise ConfigError(f"{self.arm}: {e}") from None

    def reluize_config(self):
        """A post-hoc arm's reluize recipe with this run's settings (None for the other arms)."""
        recipe = ARMS[self.arm].posthoc
        if recipe is None:
            return None
        return recipe.replace(lr=self.posthoc_lr, recalibrate=self.posthoc_recalibrate, epsilon=self.epsilon)

    def replace(self, **changes) -> "RunConfig":
        return dataclasses.replace(self, **changes)

    def relevant(self) -> dict:
        """The fields that determine this run's result: the shared ones plus its arm's own. Fields
        added after results existed (``LATER_FIELDS``) count only when set, so old hashes stay valid."""
        arm_free = {f.name for f in fields(self)} - set(ARM_FIELDS)
        keep = arm_free | set(ARMS[self.arm].fields)
        defaults = {f.name: f.default for f in fields(self)}
        return {k: v for k, v in dataclasses.asdict(self).items()
                if k in keep and not (k in LATER_FIELDS and v == defaults[k])}

    @property
    def run_hash(self) -> str:
        return _hash({k: v for k, v in self.relevant().items() if k != "seed"})

    @property
    def base_hash(self) -> str:
        """The hash of what all arms of one experiment share (task, data, training budget)."""
        return _hash({k: v for k, v in self.relevant().items() if k in EXPERIMENT_FIELDS})

    @property
    def variant(self) -> str:
        """A readable label of the arm and its own settings, e.g. ``lambda-harden[switch_at=0.1]``
        (settings equal to the defaults are left out)."""
        defaults = {f.name: f.default for f in fields(RunConfig)}
        own = [f"{k}={_label(getattr(self, k))}" for k in ARMS[self.arm].fields if getattr(self, k) != defaults[k]]
        return self.arm + (f"[{','.join(own)}]" if own else "")


# The settings all arms and seeds of one experiment share: what base_hash hashes (relevant() filters
# them further), and what the report names experiments by.
EXPERIMENT_FIELDS = frozenset(f.name for f in fields(RunConfig)) - {"seed", "arm", *ARM_FIELDS}


def _label(v) -> str:
    return f"{v:g}" if isinstance(v, (int, float)) else str(v)


def _hash(d: dict) -> str:
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


def parse_overrides(pairs: list[str]) -> dict:
    """``["lr=0.1", "optimizer=adamw"]`` → typed values, checked against RunConfig's fields."""
    types = {f.name: f.type for f in fields(RunConfig)}
    out = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep:
            raise ConfigError(f"--set takes key=value, got {pair!r}")
        if key in ("task", "arm", "seed"):
            raise ConfigError(f"{key} is chosen with its own option, not --set")
        if key not in types:
            raise ConfigError(f"unknown config key {key!r}; known: {', '.join(k for k in types if k not in ('task', 'arm', 'seed'))}")
        kind = types[key]
        try:
            if key == "switch_at" and raw.strip() == "auto":
                out[key] = "auto"
                continue
            out[key] = int(raw) if kind == "int" else float(raw) if kind.startswith("float") else raw
        except ValueError:
            raise ConfigError(f"{key} needs a {kind}, got {raw!r}") from None
    return out
