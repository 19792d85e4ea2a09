"""``ReluizeConfig``: every setting of a conversion and its rules, in one place, checked when it is built.

The library's :func:`~lambda_gelu.reluize.reluize`, the ``lambda-gelu reluize`` command (which builds its
options, defaults and choices from these fields), the lab's post-hoc arms and the experiment scripts all take
one. Which recipe when, and the measurements behind each default: docs/findings.md.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field

from ..core.config import DEFAULTS
from ..core.functional import lambda_target
from ..errors import need
from .losses import LOSSES, get_loss
from .precision import PRECISIONS

__all__ = ["ReluizeConfig", "SCHEDULES", "LR_SCHEDULES", "LR", "GATE_ZEROS_LR", "CAUSAL_LR", "HIDDEN_WEIGHT",
           "GATE_ZEROS_HIDDEN_WEIGHT", "RIDGE", "RECALIBRATE", "configured"]

SCHEDULES = ("anneal", "swap", "blockwise")
LR_SCHEDULES = ("constant", "linear")
LOSS_NAMES = ("auto", *LOSSES)
LR = 5e-5  # AdamW's learning rate for the distillation (MiniLM: docs/findings.md)
# ... for a causal LM in `lambda-gelu reluize` (SmolLM2, 30 minutes: perplexity ×0.948 ± 0.003 against ×1.070 ± 0.011
# at 5e-5, three seeds paired; lower on every held-out text; studies/smollm2_lr.md, studies/smollm2_prose.md)
CAUSAL_LR = 5e-4
# ... when gate_zeros shifts the gates: the distillation must repair more, faster (SmolLM2 at 0.87 zeros, 347 steps:
# perplexity ×1.87 at 5e-5, ×1.44 at 1.5e-4, ×1.26 at 3e-4, ×1.17 at 5e-4 over two seeds; studies/smollm2_sparsity.md),
# and not faster still: at 85% in 30 minutes 1e-3 keeps less on every held-out set (studies/smollm2_budget_lr1e-3.md)
GATE_ZEROS_LR = 5e-4
HIDDEN_WEIGHT = 1.0  # the hidden-state term's weight beside the loss's own (SmolLM2 at its ReLU gates' own zeros, 30
# minutes: 4 keeps no more, English outside Python ×1.201 against ×1.187; studies/smollm2_hidden_states_default.md)
# ... when gate_zeros shifts the gates: SmolLM2 at 85% in 30 minutes, English outside Python ×1.668 ± 0.033 against
# ×1.824 ± 0.008 at 1, better on every held-out set in both seeds (studies/smollm2_hidden_states_seeds.md); 16 no better
GATE_ZEROS_HIDDEN_WEIGHT = 4.0
RIDGE = 1e-3       # the refit's ridge factor, relative to the mean diagonal of its Gram matrix
RECALIBRATE = 50   # batches re-estimating BatchNorm when the model has it and ``recalibrate`` is left at None


def _help(text: str, **more) -> dict:
    return {"help": text, **more}


@dataclass(frozen=True)
class ReluizeConfig:
    """How :func:`~lambda_gelu.reluize.reluize` turns a GELU network into an exact-ReLU one.

    Every field's ``metadata["help"]`` says what it does (the CLI shows it); the rules between fields
    (``refit`` needs the swap, ``repair`` the blockwise schedule, ...) are checked here, once.
    """
    schedule: str = field(default="swap", metadata=_help(
        "swap: exact ReLU at once, then distil; anneal: the gates harden to ReLU while distilling; "
        "blockwise: block by block, each reconstructs its teacher block's output", choices=SCHEDULES))
    anneal: float = field(default=0.5, metadata=_help(
        "with the anneal: the fraction of the steps over which 1/λ falls linearly from 1 to 1/λ_target"))
    repair: float = field(default=0.0, metadata=_help(
        "with blockwise: the fraction of the steps that then train the whole network end to end"))
    epsilon: float = field(default=DEFAULTS.epsilon, metadata=_help(
        "the gate's L1 distance to the step at which an annealed GELU becomes ReLU (λ_target = 2/(ε√(2π)))"))
    loss: str = field(default="auto", metadata=_help(
        "what the network is trained to keep: auto picks by the output's type (logits: KL; sentence embeddings, "
        "pooled hidden states: cosine; a tensor: relative error) and the result says which", choices=LOSS_NAMES))
    hidden_weight: float | None = field(default=None, metadata=_help(
        "the weight, beside the loss's own term, of the mean over the hidden states (the embeddings' and each "
        "layer's) of their relative squared error to the teacher's, which the named losses add when the model "
        f"gives hidden states (default {HIDDEN_WEIGHT:g}, or {GATE_ZEROS_HIDDEN_WEIGHT:g} with gate_zeros; 0: none)"))
    lr: float | None = field(default=None, metadata=_help(
        f"AdamW's learning rate, the default optimizer's (default {LR:g}, or {GATE_ZEROS_LR:g} with gate_zeros; "
        f"{CAUSAL_LR:g} for a causal language model in `lambda-gelu reluize`)"))
    weight_decay: float = field(default=0.0, metadata=_help("AdamW's weight decay"))
    lr_schedule: str = field(default="linear", metadata=_help(
        "linear: the learning rate falls linearly to 0 over the steps; constant: it stays at lr",
        choices=LR_SCHEDULES))
    precision: str | None = field(default=None, metadata=_help(
        "the matrix products of the swap's and the anneal's steps (teacher and student): float32; bfloat16 under "
        "torch.autocast (the weights, the optimizer, the normalisations and the loss stay float32); auto: bfloat16 "
        "where the device multiplies it natively (CPUs with AMX or AVX512-BF16, CUDA), float32 elsewhere "
        "(default float32; auto for a causal language model's swap or anneal in `lambda-gelu reluize`, whose "
        "student trains with eager attention under bfloat16 on a CPU: lambda_gelu.hf.attention)",
        choices=PRECISIONS))
    sparsity: float = field(default=0.0, metadata=_help(
        "the final factor of an L1 penalty on the converted activations' outputs, rising over the anneal "
        "fraction of the steps (0: none)"))
    gate_zeros: float = field(default=0.0, metadata=_help(
        "gated FFNs (SwiGLU, GeGLU): the share of the ReLU gates' outputs, averaged over the layers, to make exact "
        "zeros by lowering one bias of every gate (mlp_bias), reached linearly over the anneal fraction of the "
        "steps and held (0: none)"))
    gate_zeros_at_once: bool = field(default=False, metadata=_help(
        "with gate_zeros: the share reached at once, before the first step: the gates lowered to it on the refit's "
        "batches (the first batch without a refit) before the refit, which then solves each gated FFN's output "
        "projection for the shifted gates; the steps hold the share. Measured on SmolLM2 at 85%: it keeps far less "
        "than the ramp (studies/smollm2_budget_atonce.md)", experimental=True))
    refit: int = field(default=0, metadata=_help(
        "with the swap: batches over which the layers reading each activation are solved by least squares "
        "before the first step (0: none)"))
    ridge: float = field(default=RIDGE, metadata=_help("the refit's ridge factor, relative to its Gram diagonal"))
    recalibrate: int | None = field(default=None, metadata=_help(
        "with the swap or the anneal: batches over which BatchNorm's running statistics are re-estimated once the "
        f"network is ReLU (None: {RECALIBRATE} where the model has BatchNorm; 0: none)"))

    def __post_init__(self):
        def number(name, low=0.0, high=math.inf, *, low_open=False, high_open=True):
            v = getattr(self, name)
            ok = isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
            return ok and (v > low if low_open else v >= low) and (v < high if high_open else v <= high)

        def count(name):
            v = getattr(self, name)
            return isinstance(v, int) and not isinstance(v, bool) and v >= 0

        schedule = self.schedule
        need(schedule in SCHEDULES, f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
        need(self.lr_schedule in LR_SCHEDULES,
             f"lr_schedule must be one of {', '.join(LR_SCHEDULES)}, got {self.lr_schedule!r}")
        need(self.loss in LOSS_NAMES, f"loss must be one of {', '.join(LOSS_NAMES)}, got {self.loss!r}")
        need(self.hidden_weight is None or number("hidden_weight"),
             f"hidden_weight is a finite weight ≥ 0, got {self.hidden_weight!r}")
        need(number("anneal", 0.0, 1.0, low_open=True, high_open=False),
             f"anneal is the fraction of steps spent annealing, in (0, 1]; got {self.anneal!r}")
        need(number("repair", 0.0, 1.0),
             f"repair is the fraction of steps spent end to end after the blocks, in [0, 1); got {self.repair!r}")
        lambda_target(self.epsilon)  # "epsilon must be in (0, 0.7979) ..."
        need(self.lr is None or number("lr"), f"lr is a finite number ≥ 0, got {self.lr!r}")
        need(number("weight_decay"), f"weight_decay is a finite number ≥ 0, got {self.weight_decay!r}")
        need(self.precision is None or self.precision in PRECISIONS,
             f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        need(self.precision in (None, "float32") or schedule != "blockwise", f"precision={self.precision!r}: used "
             "by schedule='swap' or 'anneal' only (blockwise reconstructs each block in float32); leave it out")
        need(number("sparsity"),
             f"sparsity is the activation penalty's final factor, a finite number ≥ 0; got {self.sparsity!r}")
        need(number("gate_zeros", 0.0, 1.0),
             f"gate_zeros is a share of zeros to reach, in [0, 1); got {self.gate_zeros!r}")
        need(count("refit"), f"refit is a number of batches ≥ 0, got {self.refit!r}")
        need(isinstance(self.gate_zeros_at_once, bool),
             f"gate_zeros_at_once is True or False, got {self.gate_zeros_at_once!r}")
        need(not self.gate_zeros_at_once or self.gate_zeros,
             "gate_zeros_at_once: lowers the gates to gate_zeros at once; give gate_zeros > 0 with it, or leave it out")
        need(number("ridge"), f"ridge is a finite factor ≥ 0, got {self.ridge!r}")
        need(self.recalibrate is None or count("recalibrate"),
             f"recalibrate is a number of batches ≥ 0 (or None: the default), got {self.recalibrate!r}")
        need(not self.refit or schedule == "swap", "refit: used by schedule='swap' only (it refits the layers after "
             f"an exact ReLU before the first step; schedule={schedule!r} has none yet); leave it out")
        need(not self.repair or schedule == "blockwise", f"repair: used by schedule='blockwise' only "
             f"(schedule={schedule!r} repairs after its swap or anneal anyway); leave it out")
        need(not self.recalibrate or schedule != "blockwise", "recalibrate: used by schedule='swap' or 'anneal' only "
             "(blockwise trains each block, BatchNorm's affine parameters included, against its teacher block); "
             "leave it out")
        end_to_end = ("loss", "hidden_weight")  # used by blockwise's repair steps
        given = [name for name in (*end_to_end, "sparsity", "gate_zeros")
                 if getattr(self, name) != _DEFAULTS[name] and (name not in end_to_end or not self.repair)]
        hint = " (give repair > 0 for end-to-end steps that use it)" if set(given) <= set(end_to_end) else ""
        need(schedule != "blockwise" or not given, f"{', '.join(given)}: not used by schedule='blockwise', which "
             f"reconstructs each block's output (relative squared error) with an AdamW of its own per block{hint}; "
             "leave them out")

    @property
    def learning_rate(self) -> float:
        """``lr``, or its default: :data:`GATE_ZEROS_LR` with ``gate_zeros``, :data:`LR` otherwise."""
        return self.lr if self.lr is not None else GATE_ZEROS_LR if self.gate_zeros else LR

    @property
    def hidden_state_weight(self) -> float:
        """``hidden_weight``, or its default: :data:`GATE_ZEROS_HIDDEN_WEIGHT` with ``gate_zeros``,
        :data:`HIDDEN_WEIGHT` otherwise."""
        if self.hidden_weight is not None:
            return self.hidden_weight
        return GATE_ZEROS_HIDDEN_WEIGHT if self.gate_zeros else HIDDEN_WEIGHT

    @property
    def lambda_target(self) -> float:
        """The λ at which an annealed gate is within ``epsilon`` of the step."""
        return lambda_target(self.epsilon)

    def distillation_loss(self, loss=None):
        """The loss of the steps: ``loss`` if it is a callable, else the one ``loss`` (default: :attr:`loss`)
        names, its hidden-state term weighed by :attr:`hidden_state_weight`."""
        return get_loss(loss if loss is not None else self.loss, self.hidden_state_weight)

    def replace(self, **changes) -> "ReluizeConfig":
        """A copy with ``changes``, checked again; an unknown name is a TypeError naming it."""
        return dataclasses.replace(self, **changes)


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ReluizeConfig)}
_SETTINGS = frozenset(_DEFAULTS)


def configured(config: ReluizeConfig | None, settings: dict, loss=None) -> ReluizeConfig:
    """``config`` (default: the defaults) with single fields changed by ``settings`` and a loss's name."""
    config = config or ReluizeConfig()
    if not isinstance(config, ReluizeConfig):
        raise TypeError(f"config must be a ReluizeConfig, got {type(config).__name__}")
    unknown = sorted(set(settings) - _SETTINGS)
    if unknown:
        raise TypeError(f"reluize got unknown setting(s) {', '.join(unknown)}; ReluizeConfig has "
                        f"{', '.join(sorted(_SETTINGS))}")
    if isinstance(loss, str):
        settings = {**settings, "loss": loss}
    elif loss is not None and not callable(loss):
        raise TypeError(f"loss must be a name or a callable, got {type(loss).__name__}")
    config = config.replace(**settings) if settings else config
    if callable(loss) and config.hidden_weight is not None:
        raise ValueError(f"hidden_weight={config.hidden_weight!r} weighs the named losses' hidden-state term; a "
                         "loss= callable weighs its own terms: leave hidden_weight out, or give the loss by name")
    return config
