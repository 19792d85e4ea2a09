"""``reluize`` one optimizer step at a time, inside a training loop that is yours:

    reluizer = Reluizer(model, total_steps=1000)          # the swap (or schedule="anneal"); a frozen teacher copy
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
    for batch in batches:                                 # your loop: DDP, FSDP, gradient accumulation, AMP...
        loss = reluizer.loss(batch, ddp_model)            # distillation from the teacher (+ the sparsity penalty)
        loss.backward(); optimizer.step(); optimizer.zero_grad()
        reluizer.step()                                   # after each optimizer step: λ moves, the anneal ends
    reluizer.finish()                                     # exact nn.ReLU everywhere; configs name ReLU

:func:`~lambda_gelu.reluize.reluize` runs the same steps with a loop of its own (its swap and anneal are this
class), and adds what needs batches before the first step: the refit, the BatchNorm re-estimation, the blockwise
schedule. The Hugging Face ``Trainer`` runs it through
:class:`lambda_gelu.integrations.transformers.ReluizeTrainer`, and with it ``accelerate``/``torchrun``.

The swap and the anneal: the whole network trained end to end to match its frozen original (the teacher).

``"swap"`` is the baseline every published conversion uses: exact ReLU from step 0, then the distillation.
``"anneal"`` makes every GELU-like module ``g`` an :class:`AnnealedGELU`, ``x ↦ g(λx)/λ`` for a λ the schedule
sets: at λ = 1 that *is* the original module, called as it is, so step 0 reproduces the network bit for bit
whatever its GELU form (exact, tanh as GPT-2's ``gelu_new``); as λ grows the gate g(λx)/(λx) tends to the step,
and once it is within ``epsilon`` (L1 gap E(λ) = 2/(λ√(2π)), λ_target ≈ 160 for ε = 0.005) the module becomes
an exact ``nn.ReLU``. The remaining steps repair what is left with the ReLU network itself.

Pacing. Damage to a pretrained network is not linear in λ (a pretrained encoder is about as far from its original
at λ = 10 as at ReLU), so a schedule linear in λ would cross that whole range in its first few percent of steps.
The schedule here is linear in the gate's distance to the step, E(λ) ∝ 1/λ: 1/λ falls linearly from 1 to
1/λ_target over the first ``anneal`` fraction of the steps.
"""
from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torch.nn as nn

from ..core.batches import run_batch
from ..core.convert import (GELU_LIKE, SILU_LIKE, _name_relu_in_configs_, _warn_functional_gelu, is_reluizable,
                       replace_modules_)
from ..core.regularize import SparsityRegularizer
from .config import ReluizeConfig, configured
from .precision import autocast_dtype, precision_context
from .threshold import GateThreshold

__all__ = ["Reluizer", "AnnealedGELU", "paced_lambda"]

class AnnealedGELU(nn.Module):
    """``gelu(λx)/λ`` for the original GELU module ``gelu`` and a λ set from outside (``.lam``, a
    number, not learned). λ = 1 calls the original unchanged."""

    def __init__(self, gelu: nn.Module):
        super().__init__()
        self.gelu = gelu
        self.lam = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lam = self.lam
        return self.gelu(x) if lam == 1.0 else self.gelu(x * lam) / lam

    def extra_repr(self) -> str:
        return f"lam={self.lam:.4g}"


def paced_lambda(a: float, lam_target: float) -> float:
    """λ at anneal progress a ∈ [0, 1]: 1/λ linear from 1 to 1/λ_target (the gap E(λ) ∝ 1/λ linear)."""
    return 1.0 / ((1.0 - a) + a / lam_target)


class Reluizer:
    """The swap or the anneal of :func:`~lambda_gelu.reluize.reluize`, step by step (see the module's docstring).

    Building it converts ``model`` in place (the swap: exact ``nn.ReLU`` now; the anneal: each GELU-like module
    becomes an :class:`AnnealedGELU` at λ = 1, the original bit for bit) after a frozen copy is taken as the
    teacher (unless ``teacher`` is given). Settings as :func:`reluize`'s: a :class:`ReluizeConfig` and/or single
    fields; ``lr``, ``weight_decay`` and ``lr_schedule`` are your optimizer's business here, and ``refit``,
    ``recalibrate``, ``gate_zeros_at_once`` and ``schedule="blockwise"``, which need batches before the first step,
    are reluize's.

    Its state is the step count (:meth:`state_dict`), so a resumed run goes on where it stopped.
    """

    def __init__(self, model: nn.Module, total_steps: int, config: ReluizeConfig | None = None, *,
                 teacher: nn.Module | None = None, loss: str | Callable | None = None, **settings):
        config = configured(config, settings, loss)
        given = [f"{k}={getattr(config, k)!r}" for k in ("refit", "recalibrate", "gate_zeros_at_once")
                 if getattr(config, k)]
        if config.schedule == "blockwise" or given:
            raise ValueError(f"{', '.join(given) or 'schedule=blockwise'}: needs batches before the first step, "
                             "which only reluize(model, batches, steps) has; the step-wise Reluizer runs the swap "
                             "and the anneal")
        check_steps(total_steps)
        if not any(is_reluizable(m) for m in model.modules()):
            raise ValueError("Reluizer found no GELU module to replace, nor a SiLU one (looked for: "
                             + ", ".join(GELU_LIKE + SILU_LIKE) + ")")
        _warn_functional_gelu(model)  # from the source, as it has no batch to run: such a call stays GELU
        if teacher is None:
            teacher = copy.deepcopy(model)
        teacher.eval().requires_grad_(False)
        replaced = replace_modules_(model, lambda m, fqn: is_reluizable(m),
                                    (lambda old: nn.ReLU()) if config.schedule == "swap" else AnnealedGELU, "GELU")
        self._start(model, teacher, total_steps, config, config.distillation_loss(loss),
                    replaced, sparsity=True)

    @classmethod
    def converted(cls, model, teacher, total_steps: int, config: ReluizeConfig, loss_fn, replaced: list[str],
                  sparsity: bool = True) -> "Reluizer":
        """The steps over a ``model`` that :func:`reluize` has already converted (and refit, and checked)."""
        self = cls.__new__(cls)
        self._start(model, teacher, total_steps, config, loss_fn, replaced, sparsity)
        return self

    def _start(self, model, teacher, total_steps, config, loss_fn, replaced, sparsity) -> None:
        check_steps(total_steps)
        self.model, self.teacher, self.total_steps, self.config = model, teacher, total_steps, config
        self.loss_fn, self.replaced = loss_fn, list(replaced)
        self.step_count = 0
        self.device = next(iter(model.parameters()), torch.zeros(())).device
        self.autocast = autocast_dtype(config.precision, self.device)  # None: float32
        self._annealed = [m for m in model.modules() if isinstance(m, AnnealedGELU)]
        self.anneal_steps = max(1, round(config.anneal * total_steps))
        converted = set(replaced)  # the same names hold the annealed GELUs, then their ReLUs
        self.regularizer = None
        if sparsity and config.sparsity:
            self.regularizer = SparsityRegularizer(model, total_steps, config.sparsity, end=config.anneal, stages=3,
                                                   filter_fn=lambda m, fqn: fqn in converted)
        self.threshold = GateThreshold(model, total_steps, config.gate_zeros, end=config.anneal) \
            if sparsity and config.gate_zeros else None
        self.last: dict = {}

    @property
    def lam(self) -> float:
        """λ of this step's gates (``inf``: exact ReLU)."""
        if not self._annealed:
            return float("inf")
        return paced_lambda(self.step_count / self.anneal_steps, self.config.lambda_target)

    def loss(self, batch, model: nn.Module | None = None) -> torch.Tensor:
        """This step's loss on ``batch`` (what the model takes: a tensor, a tuple, a dict of keyword arguments):
        the distillation loss from the teacher's output, plus the sparsity penalty if configured. ``model`` is
        what to run, when it is a wrapper of the converted one (DDP, FSDP, ``torch.compile``)."""
        lam = self.lam
        for m in self._annealed:
            m.lam = lam
        value = teacher_student_loss(model if model is not None else self.model, self.teacher, batch, self.loss_fn,
                                     self.autocast, self.device)
        penalty = self.regularizer.penalty() if self.regularizer is not None else None
        self.last = {"lam": lam, "loss": value.detach(), **({"penalty": penalty.detach()} if penalty is not None
                                                           else {})}
        return value if penalty is None else value + penalty

    def step(self) -> bool:
        """After each optimizer step. True when this step ended the anneal (the gates are exact ReLU now)."""
        self.step_count += 1
        if self.regularizer is not None:
            self.regularizer.step()
        if self.threshold is not None:
            self.threshold.step()
        if self._annealed and self.step_count >= self.anneal_steps:
            return self._to_relu()
        return False

    def finish(self) -> bool:
        """Whatever is not exact ReLU yet becomes ``nn.ReLU`` (an anneal ended early); the sparsity penalty's
        hooks go; Hugging Face configs name ReLU. True if gates were still annealing."""
        ended = self._to_relu() if self._annealed else False
        self.close()
        _name_relu_in_configs_(self.model, warn=False)
        return ended

    def close(self) -> None:
        """Remove the sparsity penalty's and the threshold's hooks (also on an error part-way)."""
        if self.regularizer is not None:
            self.regularizer.remove()
            self.regularizer = None
        if self.threshold is not None:
            self.threshold.remove()
            self.threshold = None

    def replan(self, total_steps: int) -> None:
        """Make the run ``total_steps`` long from here on (a time budget re-planned from the steps' own pace): the
        anneal, the penalty and the threshold go on from the step taken, at the pace of the new total; what is past
        stays. A total at or below the steps taken ends an anneal at the next :meth:`step`."""
        check_steps(total_steps, "the steps planned")
        self.total_steps = total_steps
        self.anneal_steps = max(1, round(self.config.anneal * total_steps))
        for schedule in (self.regularizer, self.threshold):
            if schedule is not None:
                schedule.total_steps = total_steps

    def state_dict(self) -> dict:
        return {"step": self.step_count, **({"threshold": self.threshold.state_dict()} if self.threshold else {})}

    def load_state_dict(self, state: dict) -> None:
        """Resume at ``state["step"]``: the anneal's λ there (or the ReLU, past its end), the penalty's factor."""
        self.step_count = int(state["step"])
        if self.regularizer is not None:
            self.regularizer.step_count = self.step_count
        if self.threshold is not None and "threshold" in state:
            self.threshold.load_state_dict(state["threshold"])
        if self._annealed and self.step_count >= self.anneal_steps:
            self._to_relu()

    def _to_relu(self) -> bool:
        replace_modules_(self.model, lambda m, fqn: isinstance(m, AnnealedGELU), lambda old: nn.ReLU(),
                         "annealed GELU")
        self._annealed = []
        if self.regularizer is not None:
            self.regularizer.refresh()
        return True


def teacher_student_loss(model: nn.Module, teacher: nn.Module, batch, loss_fn, autocast: torch.dtype | None,
                         device: torch.device) -> torch.Tensor:
    """``loss_fn`` of ``model``'s output on ``batch`` against the frozen ``teacher``'s, both run under an ``autocast``
    to that dtype on ``device`` (None: as they are): a step's forward passes and loss, which the plan of a time
    budget also times (lambda_gelu.hf.convert)."""
    with precision_context(autocast, device):
        with torch.no_grad():
            target = run_batch(teacher, batch, hidden_states=True)
        output = run_batch(model, batch, hidden_states=True)
    return loss_fn(output, target, batch)  # out of the autocast: the losses compute in float32


def check_steps(steps, what: str = "steps") -> None:
    """``steps`` (what the error calls ``what``) must be a positive int: reluize's and the Reluizer's."""
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"{what} must be a positive int, got {steps!r}")
