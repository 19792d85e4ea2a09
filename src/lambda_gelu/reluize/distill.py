"""The swap and the anneal: the whole network trained end to end to match its frozen original (the teacher).

``"swap"`` is the baseline every published conversion uses: exact ReLU from step 0, then the distillation.
``"anneal"`` makes every GELU-like module ``g`` an :class:`AnnealedGELU`, ``x ↦ g(λx)/λ`` for a λ the schedule
sets: at λ = 1 that *is* the original module, called as it is, so step 0 reproduces the network bit for bit
whatever its GELU form (exact, tanh as GPT-2's ``gelu_new``); as λ grows the gate g(λx)/(λx) tends to the step,
and once it is within ``epsilon`` (L1 gap E(λ) = 2/(λ√(2π)), λ_target ≈ 160 for ε = 0.005) the module becomes an
exact ``nn.ReLU``. The remaining steps repair what is left with the ReLU network itself.

Pacing. Damage to a pretrained network is not linear in λ (a pretrained encoder is about as far from its original
at λ = 10 as at ReLU), so a schedule linear in λ would cross that whole range in its first few percent of steps.
The schedule here is linear in the gate's distance to the step, E(λ) ∝ 1/λ: 1/λ falls linearly from 1 to
1/λ_target over the first ``anneal`` fraction of the steps.
"""
from __future__ import annotations

import contextlib
import time

import torch
import torch.nn as nn

from ..batches import run_batch
from ..convert import replace_modules_
from .batchnorm import recalibrate_batchnorm_
from .result import ReluizeResult
from .stream import take_and_keep
from .training import lr_decay, progress_bar

__all__ = ["AnnealedGELU", "distill", "paced_lambda"]


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



def distill(model, teacher, stream, steps: range, loss, optimizer, lr_schedule: str, result: ReluizeResult,
             progress, callback, *, anneal_steps: int = 0, lam_target: float = float("inf"), regularizer=None,
             recalibrate: int = 0) -> None:
    """Train the whole ``model`` to match ``teacher`` with ``loss`` for ``steps`` (numbered from their
    start); the annealed GELUs, if any, harden over the first ``anneal_steps`` and then become ReLU, their
    BatchNorms re-estimated over the next ``recalibrate`` batches."""
    annealed = [m for m in model.modules() if isinstance(m, AnnealedGELU)]
    decay = lr_decay(optimizer, len(steps), lr_schedule)
    model.eval()
    bar = progress_bar(len(steps), progress)
    t0 = time.perf_counter() - result.seconds
    with regularizer if regularizer is not None else contextlib.nullcontext():  # its hooks go, whatever happens
        for step in steps:
            if annealed and step >= anneal_steps:  # within ε of the step: the exact ReLU from here on
                stream = _anneal_ends(model, stream, recalibrate, result)
                annealed = []
                if regularizer is not None:
                    regularizer.refresh()
            lam = paced_lambda(step / anneal_steps, lam_target) if annealed else float("inf")
            for m in annealed:
                m.lam = lam
            batch = next(stream)
            with torch.no_grad():
                target = run_batch(teacher, batch, hidden_states=True)
            value = loss(run_batch(model, batch, hidden_states=True), target, batch)
            penalty = regularizer.penalty() if regularizer is not None else None
            optimizer.zero_grad(set_to_none=True)
            (value if penalty is None else value + penalty).backward()
            optimizer.step()
            if decay is not None:
                decay.step()
            entry = {"step": step + 1, "lam": lam, "loss": value.item(), "seconds": time.perf_counter() - t0}
            if penalty is not None:
                entry["penalty"] = penalty.item()
                regularizer.step()
            if result.record(entry, bar, f"λ {entry['lam']:.3g} loss {entry['loss']:.4g}", callback):
                break
    bar.close()
    if annealed:
        _anneal_ends(model, stream, recalibrate, result)
    result.seconds = time.perf_counter() - t0


def _anneal_ends(model: nn.Module, stream, recalibrate: int, result: ReluizeResult):
    """The annealed GELUs → exact ReLU, then the BatchNorms re-estimated over the next ``recalibrate``
    batches; returns the stream with those batches back in front."""
    replace_modules_(model, lambda m, fqn: isinstance(m, AnnealedGELU), lambda old: nn.ReLU(), "annealed GELU")
    if recalibrate:
        calibration, stream = take_and_keep(stream, recalibrate)
        result.recalibrated = recalibrate_batchnorm_(model, calibration)
    return stream
