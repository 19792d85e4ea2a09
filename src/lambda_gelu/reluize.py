r"""ReLU-ize a pretrained GELU network while it distils from its original: anneal its gates to the
step, swap them at once, or reconstruct block by block.

    result = lambda_gelu.reluize(model, batches, steps=300)     # model is now an exact-ReLU network

Which schedule. The default is ``"swap"``, the one recipe never far from the best measured: at equal
steps the anneal has not beaten it anywhere — on the real all-MiniLM-L6-v2 with the CLI's defaults
(refit, length batches, falling rate; 15-minute budget, 3 seeds) the swap kept more on every seed
(cosine 0.9927 against 0.9922, top-10 neighbours 0.923 against 0.915, both paired intervals above 0;
docs/minilm_schedules.md), as it did without the refit on shuffled batches at a constant rate (0.9899
against 0.9892); on the lab's trained networks the two are equivalent or the difference is not detected.
``"blockwise"`` was best on four of the five lab networks (not on mnist1d-mlp); on MiniLM (one seed,
measured before the default loss had its hidden-state term there) it matched the swap, not more.
``"anneal"`` is the one whose every step is a network between the original and the ReLU (step 0 is the
original bit for bit); its early checkpoints are far closer to the original than the swap's (0.997 at
λ ≈ 1.3), which it loses again crossing λ ≈ 2–4.

Annealing: every GELU-like module ``g`` (see :data:`lambda_gelu.GELU_LIKE`) becomes ``x ↦ g(λx)/λ``
for a hardness λ set by the schedule, not learned. At λ = 1 that *is* the original module, called as it
is, so step 0 reproduces the network bit for bit whatever its GELU form (exact, tanh as GPT-2's
``gelu_new``); as λ grows the gate g(λx)/(λx) tends to the step, and once it is within ``epsilon``
(L1 gap E(λ) = 2/(λ√(2π)), λ_target ≈ 160 for ε = 0.005) the module is replaced by an exact
``nn.ReLU``. The remaining steps repair what is left with the ReLU network itself.

Pacing. Damage to a pretrained network is not linear in λ: on all-MiniLM-L6-v2, without any
training, λ = 1.5 already moves the sentence embeddings to cosine 0.92 of the original, λ = 4 to
0.63, λ = 10 to 0.56 — as far as ReLU itself (0.55). A schedule linear in λ crosses that whole range
in its first few percent of steps. The schedule here is linear in the gate's distance to the step,
E(λ) ∝ 1/λ: 1/λ falls linearly from 1 to 1/λ_target over the first ``anneal`` fraction of steps.

Loss (default :func:`distillation_loss`): the model learns to match a frozen copy of itself taken
before conversion (the teacher) on the same batches — the pooled output for encoders (1 − cosine),
the output distribution for models with logits (KL), the relative error of every hidden state, of
plain tensor outputs otherwise. ``schedule="swap"`` is the baseline that all published conversions
use: exact ReLU from step 0, then the same loss for the same steps.

``schedule="blockwise"`` is the other published recipe (per-block reconstruction, as APHQ-ViT does
for fc1/fc2): block by block in forward order, the block's activations become ReLU and its own
parameters are trained to reproduce the teacher's block output from the input the (already
converted) network upstream gives it. A block is the module that calls the activation (a
transformer's FFN, a residual block, a conv-BN-act stem); where that is an ``nn.Sequential`` holding
several activations (a plain MLP), each stretch ending at an activation is a block, the last one
running to the end (the head). A block that ends at its activation cannot shape its own output, so
where the next parameters sit beside it in the same parent and belong to no block — BERT's
``intermediate`` holds the first projection, ``output`` the second — the block is that parent, the
whole layer (on all-MiniLM-L6-v2 this took blockwise from cosine 0.62 to 0.986). The steps are shared
equally by the blocks; a step runs the networks only up to the block, so it costs less than half an
anneal or swap step. ``repair`` spends a fraction of the steps after the blocks on the whole network,
end to end, with the swap's loss.

Refit. ``refit=N`` (with ``"swap"``) starts the steps from a better network at the cost of some forward
passes: right after the swap, the layers that read each activation (BERT's ``output.dense``, GPT-2's
``c_proj``, the second layer of an MLP, a ResNet block's next convolutions, over their patches) are
solved in closed form, in forward order, to give from the ReLU's output what they gave from the GELU's
on the first ``N`` batches (:func:`refit_after_swap_`; a ridge least squares). On all-MiniLM-L6-v2 it
takes the swap from cosine 0.56 to 0.986 (top-10 neighbours 0.56 → 0.90) in one minute of 1024 sentences
(2048: 0.987 in two, 4096: 0.988 in four), about where 12 minutes of distillation bring the plain swap;
the distillation then goes on from there. With a 15-minute budget both end near cosine 0.990 (3 seeds,
shuffled batches at a constant rate: 0.9901 with the refit, 0.9896 without; overlap 0.911 against 0.904,
differences not detected): the refit is the CLI's default because it gets there several times sooner.

Learning rate. AdamW's falls linearly to 0 over the steps (``lr_schedule="linear"``), because at a
constant rate the network kept is whichever the last few batches pulled it to: on all-MiniLM-L6-v2
distilled on batches of sentences of nearly one length (the CLI's), the top-10 overlap swung by ±0.01
between checkpoints and the last one fell from 0.918 to 0.898 (seed 0); falling, every seed climbed to
the end, 0.9926 cosine / 0.922 overlap over 3 seeds in 13 minutes (docs/minilm_length.md). On the lab's
fmnist-resnet it made no detectable difference (+0.05 points, docs/posthoc_resnet_recipes.md).

BatchNorm. The swap shifts the statistics of every later layer, while eval mode keeps normalising with
the GELU network's running statistics: on the lab's fmnist-resnet the swap alone falls from 87% to 46%
(5 seeds). ``recalibrate=N`` re-estimates them over N batches once the network is ReLU (forward passes,
no step; :func:`recalibrate_batchnorm_`) — the swap: before the first step; the anneal: when its GELUs
become ReLU — and the distillation goes on from there. With 50 batches (paid for by 17 fewer steps) and
lr 3e-4 the lab's 10% budget loses 0.34 points there instead of 0.82 (docs/posthoc_batchnorm.md). Hence
the default, ``recalibrate=None``: :data:`RECALIBRATE` batches for a model with BatchNorm (swap, anneal),
none otherwise; ``recalibrate=0`` keeps the GELU network's statistics.

Batches are tensors (one positional argument), tuples (positional arguments) or dicts (keyword
arguments, as a Hugging Face tokenizer returns them — or the one argument a forward requires when the
dict does not name it, as a ``SentenceTransformer`` takes its features); they are cycled if there are
fewer than ``steps``. The model is converted in place; the config of every Hugging Face model in it
names ReLU (see :mod:`lambda_gelu.convert`), so that ``save_pretrained`` writes a checkpoint that plain
``transformers`` loads as the ReLU network — and where a config cannot say so, ``reluize`` warns
before its first step.

Sparsity. ``sparsity=`` adds :class:`lambda_gelu.SparsityRegularizer`'s L1 penalty on the converted
activations' outputs, its factor rising to the given peak along the anneal (three sine-shaped
stages), then held during the repair: more exact zeros in the ReLU network, for the sparse path.
"""
from __future__ import annotations

import collections
import contextlib
import copy
import functools
import inspect
import itertools
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .config import DEFAULTS
from .convert import (GELU_LIKE, _is_conv1d, _name_relu_in_configs_, eval_mode, is_gelu_like, relu_config_problem,
                      replace_modules_)
from .functional import lambda_target as _lambda_target
from .regularize import SparsityRegularizer

__all__ = ["reluize", "distillation_loss", "mean_pool", "reconstruction_blocks", "ReconstructionBlock", "AnnealedGELU",
           "ReluizeResult", "SCHEDULES", "LR_SCHEDULES", "refit_after_swap_", "refit_consumers",
           "recalibrate_batchnorm_", "RECALIBRATE"]

SCHEDULES = ("anneal", "swap", "blockwise")
LR_SCHEDULES = ("constant", "linear")
RIDGE = 1e-3  # the refit's ridge factor; all-MiniLM-L6-v2 (2048 sentences) keeps cosine 0.987 at 1e-4 and 1e-3,
# 0.985 at 1e-2
RECALIBRATE = 50  # batches re-estimating BatchNorm by default (fmnist-resnet, lr 3e-4: the swap's drop 0.88 → 0.34)
_NO_BATCHNORM = "recalibrate: the model has no BatchNorm with running statistics; leave it out"


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


@dataclass
class ReluizeResult:
    """What :func:`reluize` did: the modules it replaced, the layers it refit, the BatchNorms it
    re-estimated, one log entry per step (with ``refit`` or ``recalibrate`` on the swap, a first one for
    step 0: that work, no loss), the time it took, and whether the callback ended it before its steps."""
    replaced: list[str]
    log: list[dict] = field(default_factory=list)  # {"step", "lam", "loss", "seconds"[, "penalty"]}
    seconds: float = 0.0
    refit: list[str] = field(default_factory=list)
    recalibrated: list[str] = field(default_factory=list)
    stopped: bool = False

    @property
    def final_loss(self) -> float:
        return self.log[-1]["loss"] if self.log else float("nan")


def reluize(model: nn.Module, batches: Iterable, steps: int, *, teacher: nn.Module | None = None,
            loss: Callable | None = None, schedule: str = "swap", anneal: float = 0.5,
            repair: float = 0.0, epsilon: float | None = None, lr: float = 5e-5, weight_decay: float = 0.0,
            lr_schedule: str = "linear", optimizer: torch.optim.Optimizer | None = None, sparsity: float = 0.0,
            refit: int = 0, ridge: float = RIDGE, recalibrate: int | None = None, progress: bool = False,
            callback: Callable[[dict], None] | None = None) -> ReluizeResult:
    """Turn ``model``'s GELU-like activations into exact ``nn.ReLU``, in place, training it for
    ``steps`` optimizer steps to keep its function.

    Args:
        model: any module whose activations are GELU-like modules.
        batches: an iterable of inputs (tensors, tuples of positional arguments, dicts of keyword
            arguments); cycled if shorter than ``steps``. A single tensor is one batch, used at
            every step. Nothing else is needed: the targets are the teacher's outputs.
        steps: optimizer steps in all (anneal and repair).
        teacher: the network to match; default: a frozen copy of ``model`` before conversion.
        loss: ``loss(student_output, teacher_output, batch) -> scalar``; default
            :func:`distillation_loss` (blockwise: used by its ``repair`` steps only).
        schedule: ``"swap"`` (exact ReLU from the start; the default), ``"anneal"`` (1/λ linear from
            1 to 1/λ_target over the first ``anneal`` fraction of the steps, then exact ReLU) or ``"blockwise"``
            (block by block: ReLU, then reconstruct the block's output; see the module's docstring).
        anneal: the fraction of ``steps`` spent annealing, in (0, 1].
        repair: with ``"blockwise"``, the fraction of ``steps`` that, once every block is
            reconstructed, train the whole network end to end with ``loss`` as the swap does; in [0, 1).
        epsilon: the gate's L1 distance to the step at which λ-GELU becomes ReLU
            (default :data:`lambda_gelu.DEFAULTS`'s 0.005, λ_target ≈ 160).
        lr, weight_decay: for the default optimizer, AdamW over every trainable parameter.
        lr_schedule: ``"linear"`` (the default): every optimizer's learning rate falls linearly over the
            n steps it takes (the distillation's, each block's, the repair's; yours too, if you give one),
            step i at (1 − i/n) of its start; ``"constant"`` leaves it as it is.
        optimizer: your own, built over ``model``'s parameters (``lr``/``weight_decay`` then unused).
        sparsity: the final factor of an L1 penalty on the converted activations (0: none); it rises
            over the first ``anneal`` fraction of the steps (see :class:`lambda_gelu.SparsityRegularizer`).
        refit: with ``"swap"``, the number of batches (the first of ``batches``; the steps use them
            again) over which, right after the swap and before any step, the layers that read each
            activation are solved by least squares to give what they gave the GELU's output
            (see :func:`refit_after_swap_`); 0: none.
        ridge: the refit's ridge factor, relative to the mean diagonal of its Gram matrix.
        recalibrate: with ``"swap"`` or ``"anneal"``, the number of batches (the next ones; the steps use
            them again) over which every BatchNorm's running statistics are re-estimated once the network
            is exact ReLU — the swap: before the first step, after the refit; the anneal: when its GELUs
            become ReLU (see :func:`recalibrate_batchnorm_`); forward passes only. 0: none; ``None`` (the
            default): :data:`RECALIBRATE` batches if the model has BatchNorm and the schedule is one of
            these, else none.
        progress: a progress bar (needs ``tqdm``).
        callback: called after every step with its log entry. If it returns True, the conversion ends
            there (a time budget, say): the remaining steps are skipped, and what is not exact ReLU yet
            (an unfinished anneal, blocks not reached) becomes ReLU at once, BatchNorm re-estimated as
            the schedule does; ``result.stopped`` says so.

    The model is put in eval mode (no dropout, normalisation statistics kept) and trained in it.
    Raises ``ValueError`` before changing anything if the model has no GELU-like module, or applies
    gelu as a function somewhere in its forward (that GELU would survive the conversion).
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if lr_schedule not in LR_SCHEDULES:
        raise ValueError(f"lr_schedule must be one of {', '.join(LR_SCHEDULES)}, got {lr_schedule!r}")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if not 0.0 < anneal <= 1.0:
        raise ValueError(f"anneal is the fraction of steps spent annealing, in (0, 1]; got {anneal!r}")
    if not isinstance(sparsity, (int, float)) or isinstance(sparsity, bool) or not 0.0 <= sparsity < float("inf"):
        raise ValueError(f"sparsity is the activation penalty's final factor, a finite number ≥ 0; got {sparsity!r}")
    lam_target = _lambda_target(DEFAULTS.epsilon if epsilon is None else epsilon)
    stream = itertools.cycle(batches) if not isinstance(batches, torch.Tensor) else itertools.repeat(batches)
    try:
        first = next(stream)
    except StopIteration:
        raise ValueError("reluize got no batches") from None
    stream = itertools.chain([first], stream)
    if not any(is_gelu_like(m) for m in model.modules()):
        raise ValueError("reluize found no GELU module to replace (looked for: " + ", ".join(GELU_LIKE) + ")")
    if not isinstance(repair, (int, float)) or isinstance(repair, bool) or not 0.0 <= repair < 1.0:
        raise ValueError("repair is the fraction of steps spent end to end after the blocks, in [0, 1); "
                         f"got {repair!r}")
    if isinstance(refit, bool) or not isinstance(refit, int) or refit < 0:
        raise ValueError(f"refit is a number of batches ≥ 0, got {refit!r}")
    if refit and schedule != "swap":
        raise ValueError(f"refit: used by schedule='swap' only (it refits the layers after an exact ReLU before "
                         f"the first step; schedule={schedule!r} has none yet); leave it out")
    if not isinstance(ridge, (int, float)) or isinstance(ridge, bool) or not 0.0 <= ridge < float("inf"):
        raise ValueError(f"ridge is a finite factor ≥ 0, got {ridge!r}")
    norms = _batchnorms(model)
    if recalibrate is None:  # the default: BatchNorm re-estimated wherever it can be
        recalibrate = RECALIBRATE if schedule != "blockwise" and norms else 0
    if isinstance(recalibrate, bool) or not isinstance(recalibrate, int) or recalibrate < 0:
        raise ValueError(f"recalibrate is a number of batches ≥ 0 (or None: the default), got {recalibrate!r}")
    if recalibrate and schedule == "blockwise":
        raise ValueError("recalibrate: used by schedule='swap' or 'anneal' only (blockwise trains each block, "
                         "BatchNorm's affine parameters included, against its teacher block); leave it out")
    if recalibrate and not norms:
        raise ValueError(_NO_BATCHNORM)
    if repair and schedule != "blockwise":
        raise ValueError(f"repair: used by schedule='blockwise' only (schedule={schedule!r} repairs after its "
                         "swap or anneal anyway); leave it out")
    if schedule == "blockwise":
        given = [name for name, value in (("loss", loss), ("optimizer", optimizer), ("sparsity", sparsity)) if value
                 and (name == "sparsity" or not repair)]
        if given:
            raise ValueError(f"{', '.join(given)}: not used by schedule='blockwise', which reconstructs each block's "
                             "output (relative squared error) with an AdamW of its own per block"
                             f"{'' if 'sparsity' in given else ' (give repair > 0 for end-to-end steps that use it)'}; "
                             "leave them out")
    # Probe forwards, after every argument check: the one that looks for gelu applied as a function also checks
    # that the first batch gives the recalibration statistics it can estimate.
    with _two_values_per_channel(model, norms if recalibrate else []):
        functional = _functional_gelu_calls(model, first)
    if functional:
        raise ValueError(f"{functional[0]} applies gelu as a function, which no module replacement can make "
                         "ReLU; make it an nn.GELU module (or give reluize a model without it)")
    consumers = refit_consumers(model, first) if refit else {}
    low = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()
                  if p.requires_grad and p.dtype in (torch.bfloat16, torch.float16)})
    if low and optimizer is None:  # AdamW's step is ~lr per weight, below their resolution near 1
        warnings.warn(f"reluize trains the model's {' and '.join(low)} weights as they are, where AdamW's steps of "
                      f"lr={lr:g} mostly round away; convert a float32 copy (model.float()) and cast it back after, "
                      "or give an optimizer that keeps float32 weights", stacklevel=2)
    unsaveable = relu_config_problem(model)
    if unsaveable:  # the conversion is right in memory; say now, not after the steps, what a checkpoint would lose
        warnings.warn(f"{unsaveable}: the converted model will be exact ReLU, but save_pretrained would write a "
                      "checkpoint that does not load as it", stacklevel=2)
    if teacher is None:
        teacher = copy.deepcopy(model)
    teacher.eval().requires_grad_(False)
    if schedule == "blockwise":
        blocks_steps = steps - round(repair * steps)
        result = _blockwise(model, teacher, stream, blocks_steps, first, lr, weight_decay, lr_schedule, progress,
                            callback)
        if blocks_steps < steps and not result.stopped:
            _distill(model, teacher, stream, range(blocks_steps, steps), loss or distillation_loss,
                     optimizer or _adamw(model, lr, weight_decay), lr_schedule, result, progress, callback)
        _name_relu_in_configs_(model, warn=not unsaveable)
        return result
    t0 = time.perf_counter()
    if refit:
        calibration, stream = _take_and_keep(stream, refit)
        replaced = _refit_after_swap(model, calibration, ridge, consumers)
    elif schedule == "swap":
        replaced = replace_modules_(model, lambda m, fqn: is_gelu_like(m), lambda old: nn.ReLU(), "GELU")
    else:
        replaced = replace_modules_(model, lambda m, fqn: is_gelu_like(m), AnnealedGELU, "GELU")
    result = ReluizeResult(replaced, refit=[layer for layers in consumers.values() for layer in layers])
    if recalibrate and schedule == "swap":
        calibration, stream = _take_and_keep(stream, recalibrate)
        result.recalibrated = recalibrate_batchnorm_(model, calibration)
    if refit or result.recalibrated:  # conversion time, logged as step 0
        result.seconds = time.perf_counter() - t0
        result.log.append({"step": 0, "lam": float("inf"), "loss": float("nan"), "seconds": result.seconds})
        result.stopped = callback is not None and bool(callback(result.log[-1]))
    if not result.stopped:  # the callback may end it at step 0, after the refit or the re-estimation
        converted = set(replaced)  # the same names hold the annealed GELUs, then their ReLUs
        regularizer = SparsityRegularizer(model, steps, sparsity, end=anneal, stages=3,
                                          filter_fn=lambda m, fqn: fqn in converted) if sparsity else None
        _distill(model, teacher, stream, range(steps), loss or distillation_loss,
                 optimizer or _adamw(model, lr, weight_decay), lr_schedule, result, progress, callback,
                 anneal_steps=max(1, round(anneal * steps)), lam_target=lam_target, regularizer=regularizer,
                 recalibrate=recalibrate if schedule == "anneal" else 0)
    _name_relu_in_configs_(model, warn=not unsaveable)
    return result


def _adamw(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=weight_decay)


def _lr_decay(optimizer: torch.optim.Optimizer | None, steps: int, lr_schedule: str):
    """The scheduler of ``lr_schedule="linear"`` over ``steps`` optimizer steps (None: constant)."""
    if optimizer is None or lr_schedule == "constant":
        return None
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1 - i / steps)


def _distill(model, teacher, stream, steps: range, loss, optimizer, lr_schedule: str, result: ReluizeResult,
             progress, callback, *, anneal_steps: int = 0, lam_target: float = float("inf"), regularizer=None,
             recalibrate: int = 0) -> None:
    """Train the whole ``model`` to match ``teacher`` with ``loss`` for ``steps`` (numbered from their
    start); the annealed GELUs, if any, harden over the first ``anneal_steps`` and then become ReLU, their
    BatchNorms re-estimated over the next ``recalibrate`` batches."""
    annealed = [m for m in model.modules() if isinstance(m, AnnealedGELU)]
    decay = _lr_decay(optimizer, len(steps), lr_schedule)
    model.eval()
    bar = _progress(len(steps), progress)
    t0 = time.perf_counter() - result.seconds
    with regularizer if regularizer is not None else contextlib.nullcontext():  # its hooks go, whatever happens
        for step in steps:
            if annealed and step >= anneal_steps:  # within ε of the step: the exact ReLU from here on
                stream = _anneal_ends(model, stream, recalibrate, result)
                annealed = []
                if regularizer is not None:
                    regularizer.refresh()
            lam = _paced_lambda(step / anneal_steps, lam_target) if annealed else float("inf")
            for m in annealed:
                m.lam = lam
            batch = next(stream)
            with torch.no_grad():
                target = _call(teacher, batch)
            value = loss(_call(model, batch), target, batch)
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
            result.log.append(entry)
            bar.set_postfix_str(f"λ {entry['lam']:.3g} loss {entry['loss']:.4g}")
            bar.update()
            if callback is not None and callback(entry):
                result.stopped = True
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
        calibration, stream = _take_and_keep(stream, recalibrate)
        result.recalibrated = recalibrate_batchnorm_(model, calibration)
    return stream


def _take_and_keep(stream, n: int):
    """The next ``n`` batches of ``stream``, and the stream with them back in front (the steps use them again)."""
    batches = [next(stream) for _ in range(n)]
    return batches, itertools.chain(batches, stream)


@dataclass
class ReconstructionBlock:
    """A stretch of the network reconstructed as one: ``modules`` run in turn (one module, or a slice
    of an ``nn.Sequential``), holding the GELU-like ``activations``."""
    name: str
    modules: list[str]
    activations: list[str] = field(default_factory=list)


class _Stop(Exception):
    """Raised from a hook once what it came for is captured: the rest of the forward is not needed."""


def reconstruction_blocks(model: nn.Module, batch) -> list[ReconstructionBlock]:
    """The blocks of ``schedule="blockwise"``, in the order ``batch``'s forward reaches them."""
    start, end = _forward_order(model, batch)
    order = sorted((n for n in start if is_gelu_like(model.get_submodule(n))), key=start.get)
    blocks: dict[str, ReconstructionBlock] = {}
    for fqn in order:
        parent_name = fqn.rpartition(".")[0]
        parent = model.get_submodule(parent_name)
        siblings = [n for n in order if n.rpartition(".")[0] == parent_name]
        if isinstance(parent, nn.Sequential) and len(siblings) > 1:  # each stretch ending at an activation
            prefix = f"{parent_name}." if parent_name else ""
            children = [f"{prefix}{n}" for n, _ in parent.named_children()]
            ends = sorted(children.index(n) for n in siblings)
            i = ends.index(children.index(fqn))
            start_at, stop = (ends[i - 1] + 1 if i else 0), (ends[i] + 1 if i + 1 < len(ends) else len(children))
            name = f"{parent_name or '<root>'}[{start_at}:{stop}]"
            blocks.setdefault(name, ReconstructionBlock(name, children[start_at:stop])).activations.append(fqn)
        else:
            blocks.setdefault(parent_name, ReconstructionBlock(parent_name or "<root>", [parent_name])).activations.append(fqn)
    return _enclose_what_follows(model, list(blocks.values()), start, end)


def _forward_order(model: nn.Module, batch) -> tuple[dict[str, int], dict[str, int]]:
    """When each submodule first starts and last ends in ``batch``'s forward, on one clock."""
    clock, start, end = itertools.count(), {}, {}

    def started(name):
        def hook(mod, args):  # returns None: a pre-hook's return value would replace the input
            start.setdefault(name, next(clock))
        return hook

    def ended(name):
        def hook(mod, args, out):
            end[name] = next(clock)
        return hook

    handles = [h for name, m in model.named_modules() if name
               for h in (m.register_forward_pre_hook(started(name)), m.register_forward_hook(ended(name)))]
    try:
        with torch.no_grad():
            _call(model, batch)
    finally:
        for h in handles:
            h.remove()
    return start, end


def _enclose_what_follows(model, blocks, start, end) -> list[ReconstructionBlock]:
    """A block that ends at its activation cannot shape its own output: the projection reading it must
    learn too. Where the next module with parameters belongs to no block but sits in the block's own
    parent (BERT's ``output.dense`` beside ``intermediate``), the block becomes that parent (the layer)."""
    def inside(name, root):
        return name == root or name.startswith(root + ".")

    def owned(name):
        return any(inside(name, m) for b in blocks for m in b.modules)

    out: dict[str, ReconstructionBlock] = {}
    for b in blocks:
        parent = b.modules[0].rpartition(".")[0]
        if len(b.modules) == 1 and parent:
            after = [n for n in start if start[n] > end[b.modules[0]]
                     and next(model.get_submodule(n).parameters(recurse=False), None) is not None]
            follower = min(after, key=start.get, default=None)
            if follower is not None and not owned(follower) and inside(follower, parent):
                b = ReconstructionBlock(parent, [parent], b.activations)
        if b.name in out:
            out[b.name].activations += b.activations
        else:
            out[b.name] = b
    return list(out.values())


def _block_input(model: nn.Module, block: ReconstructionBlock, batch):
    """The (args, kwargs) the first module of ``block`` receives when ``model`` runs ``batch``."""
    seen = {}

    def grab(mod, args, kwargs):
        seen["in"] = (args, kwargs)
        raise _Stop

    first = model.get_submodule(block.modules[0])
    _run_to_hook(model, batch, first.register_forward_pre_hook(grab, with_kwargs=True))
    return _reached(seen, "in", block)


def _block_output(model: nn.Module, block: ReconstructionBlock, batch) -> torch.Tensor:
    """What the last module of ``block`` returns when ``model`` runs ``batch``."""
    seen = {}

    def grab(mod, args, output):
        seen["out"] = output
        raise _Stop

    _run_to_hook(model, batch, model.get_submodule(block.modules[-1]).register_forward_hook(grab))
    return _tensor_output(_reached(seen, "out", block), block)


def _run_to_hook(model: nn.Module, batch, handle) -> None:
    """Run ``batch`` through ``model`` until the hook behind ``handle`` has what it came for; remove it."""
    try:
        _call(model, batch)
    except _Stop:
        pass
    finally:
        handle.remove()


def _reached(seen: dict, key: str, block: ReconstructionBlock):
    if key not in seen:
        raise RuntimeError(f"block {block.name} was not reached by the forward")
    return seen[key]


def _run_block(model: nn.Module, block: ReconstructionBlock, args, kwargs) -> torch.Tensor:
    modules = [model.get_submodule(n) for n in block.modules]
    out = modules[0](*args, **kwargs)
    for m in modules[1:]:
        out = m(out)
    return _tensor_output(out, block)


def _tensor_output(out, block: ReconstructionBlock) -> torch.Tensor:
    if isinstance(out, tuple) and out and isinstance(out[0], torch.Tensor):
        out = out[0]  # a Hugging Face layer's (hidden_states, attentions...)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"block {block.name} returns {type(out).__name__}, not a tensor: schedule='blockwise' "
                        "reconstructs tensor outputs; use schedule='anneal' or 'swap'")
    return out


def _blockwise(model, teacher, stream, steps, first, lr, weight_decay, lr_schedule, progress,
               callback) -> ReluizeResult:
    blocks = reconstruction_blocks(model, first)
    if steps < len(blocks):
        raise ValueError(f"schedule='blockwise' needs at least one step per block: {len(blocks)} blocks, {steps} "
                         "steps for them")
    for b in blocks:
        for name in b.modules:
            try:
                teacher.get_submodule(name)
            except AttributeError:
                raise ValueError(f"schedule='blockwise' matches blocks by name, and the teacher has no {name!r}: "
                                 "give a teacher with the model's structure (or none: a copy of the model)") from None
    result = ReluizeResult([])
    bar = _progress(steps, progress)
    t0, step = time.perf_counter(), 0
    model.eval()
    for i, block in enumerate(blocks):
        if result.stopped:
            break
        result.replaced += replace_modules_(model, lambda m, fqn: fqn in block.activations, lambda old: nn.ReLU(), "GELU")
        params = list({id(p): p for n in block.modules for p in model.get_submodule(n).parameters()
                       if p.requires_grad}.values())
        optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay) if params else None
        block_steps = steps // len(blocks) + (i < steps % len(blocks))
        decay = _lr_decay(optimizer, block_steps, lr_schedule)
        for _ in range(block_steps):
            batch = next(stream)
            with torch.no_grad():
                args, kwargs = _block_input(model, block, batch)
                target = _block_output(teacher, block, batch)
            mask = batch.get("attention_mask") if isinstance(batch, dict) else None
            value = _relative_error(_run_block(model, block, args, kwargs), target, mask)
            if optimizer is not None:
                optimizer.zero_grad(set_to_none=True)
                value.backward()
                optimizer.step()
                if decay is not None:
                    decay.step()
            step += 1
            entry = {"step": step, "lam": float("inf"), "loss": value.item(), "seconds": time.perf_counter() - t0,
                     "block": block.name}
            result.log.append(entry)
            bar.set_postfix_str(f"{block.name} loss {entry['loss']:.4g}")
            bar.update()
            if callback is not None and callback(entry):
                result.stopped = True
                break
    bar.close()
    # the activations of blocks not reached (the callback ended it) and of none (never called)
    result.replaced += replace_modules_(model, lambda m, fqn: is_gelu_like(m), lambda old: nn.ReLU(), "GELU")
    result.seconds = time.perf_counter() - t0
    return result


def refit_after_swap_(model: nn.Module, batches: Iterable, *, ridge: float = RIDGE,
                      consumers: dict[str, list[str]] | None = None) -> list[str]:
    """Swap every GELU-like module of ``model`` for an exact ``nn.ReLU``, then solve the layers that read
    each one's output (:func:`refit_consumers`), activation by activation in forward order, by least
    squares: on ``batches``, each is to give from the ReLU's output what it gave from the GELU's. For the
    rows a that reach the layer once the layers before are refit (a linear layer's positions, less those
    a batch's ``attention_mask`` masks out; a convolution's patches), W' and b' minimise
    Σ‖W'·relu(a) + b' − (W·gelu(a) + b)‖² + ridge·mean(diag)·‖W'‖². No gradient step; every module in
    eval mode, so BatchNorm normalises with its running statistics and keeps them. A closed-form start
    for the distillation (on all-MiniLM-L6-v2, cosine to the original 0.56 → 0.986 from 1024 sentences).
    Returns the names replaced; names ReLU in the Hugging Face configs as :func:`lambda_gelu.to_relu_` does."""
    batches = [batches] if isinstance(batches, torch.Tensor) else list(batches)
    if not batches:
        raise ValueError("refit_after_swap_ got no batches")
    replaced = _refit_after_swap(model, batches, ridge, refit_consumers(model, batches[0]) if consumers is None
                                 else consumers)
    _name_relu_in_configs_(model)
    return replaced


def _refit_after_swap(model: nn.Module, batches: list, ridge: float, consumers: dict[str, list[str]]) -> list[str]:
    originals = dict(model.named_modules())
    replaced = replace_modules_(model, lambda m, fqn: is_gelu_like(m), lambda old: nn.ReLU(), "GELU")
    with eval_mode(model):
        for act, layers in consumers.items():
            _refit(model, act, originals[act], [model.get_submodule(n) for n in layers], batches, ridge)
    return replaced


def _refittable(m: nn.Module) -> bool:
    """A layer the refit can solve: ``nn.Linear``, Hugging Face ``Conv1D``, or a plain ``nn.Conv2d`` that is
    one matrix product over its input's patches (no groups, zero padding given in numbers; not a subclass,
    whose forward may pad otherwise)."""
    return (isinstance(m, nn.Linear) or _is_conv1d(m) or type(m) is nn.Conv2d and m.groups == 1
            and m.padding_mode == "zeros" and not isinstance(m.padding, str))


def refit_consumers(model: nn.Module, batch) -> dict[str, list[str]]:
    """{GELU-like module: the layers that read its output}, in forward order, found by running ``batch``:
    each layer (``nn.Linear``, Hugging Face ``Conv1D``, a plain ``nn.Conv2d`` without groups) is called
    once, on exactly the tensor the activation, called once, returned — a ResNet block's output feeds the
    next block's first convolution and its projection shortcut. Raises ``ValueError`` if there is none."""
    outputs, inputs, calls = {}, {}, collections.Counter()

    def returned(name):
        def hook(mod, args, out):
            calls[name] += 1
            outputs[name] = out
        return hook

    def reads(name):
        def hook(mod, args):
            calls[name] += 1
            inputs[name] = args[0] if args else None
        return hook

    handles, modules = [], dict(model.named_modules())
    for name, m in modules.items():
        if is_gelu_like(m):
            handles.append(m.register_forward_hook(returned(name)))
        elif _refittable(m):
            handles.append(m.register_forward_pre_hook(reads(name)))
    try:
        with torch.no_grad(), eval_mode(model):
            _call(model, batch)
    finally:
        for h in handles:
            h.remove()
    by_tensor = {id(out): name for name, out in outputs.items() if calls[name] == 1}  # the tensors are alive
    found = collections.defaultdict(list)
    for layer, x in inputs.items():  # in the order the layers were called; a convolution on a batch of images
        if id(x) in by_tensor and calls[layer] == 1 and (x.dim() == 4 or not isinstance(modules[layer], nn.Conv2d)):
            found[by_tensor[id(x)]].append(layer)
    if not found:
        raise ValueError("refit found no layer reading a GELU's output directly (an nn.Linear, Hugging Face Conv1D "
                         "or plain nn.Conv2d without groups, called once on exactly the tensor a GELU module "
                         "returned); leave refit out")
    order = list(outputs)
    return dict(sorted(found.items(), key=lambda kv: order.index(kv[0])))


def _rows(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``x`` as the rows ``layer``'s weight multiplies: a convolution's patches, or the last dimension."""
    if isinstance(layer, nn.Conv2d):
        patches = F.unfold(x, layer.kernel_size, layer.dilation, layer.padding, layer.stride)  # (N, C·kh·kw, L)
        return patches.transpose(1, 2).reshape(-1, patches.shape[1])
    return x.reshape(-1, x.shape[-1])


@torch.no_grad()
def _refit(model: nn.Module, act: str, original: nn.Module, layers: list[nn.Module], batches: list,
           ridge: float) -> None:
    relu = model.get_submodule(act)
    sums = [None] * len(layers)
    for batch in batches:
        seen = {}

        def grab(mod, args):
            seen["h"] = args[0]
            raise _Stop

        _run_to_hook(model, batch, relu.register_forward_pre_hook(grab))
        if "h" not in seen:
            raise RuntimeError(f"refit: {act} was not reached by the forward")
        h, mask = seen["h"], batch.get("attention_mask") if isinstance(batch, dict) else None
        if mask is not None and mask.shape == h.shape[:-1]:  # positions: only the attended ones
            h = h[mask.bool()]
        relu_h = torch.relu(h) if h.dtype in (torch.float32, torch.float64) else torch.relu(h).float()  # no half Gram
        gelu_h = original(h)
        for i, layer in enumerate(layers):
            target = layer(gelu_h)
            target = target.movedim(1, -1) if isinstance(layer, nn.Conv2d) else target  # channels last, as rows
            target = target.reshape(-1, target.shape[-1]).double()
            a = _rows(layer, relu_h)
            if layer.bias is not None:
                a = torch.cat([a, a.new_ones(len(a), 1)], 1)
            g, r = (a.T @ a).double(), a.T.double() @ target  # each batch's Gram in float32 at least, summed in float64
            sums[i] = (g, r) if sums[i] is None else (sums[i][0] + g, sums[i][1] + r)
    for layer, (gram, rhs) in zip(layers, sums):
        n_in = len(gram) - (layer.bias is not None)
        penalty = torch.zeros(len(gram), dtype=gram.dtype)
        penalty[:n_in] = ridge * gram.diagonal()[:n_in].mean()  # the bias, if any, is not shrunk
        solution = torch.linalg.lstsq(gram + torch.diag(penalty), rhs, driver="gelsd").solution  # rank-deficient too
        # Conv1D stores (in, out); nn.Linear (out, in); nn.Conv2d (out, in, kh, kw), in unfold's order
        weight = solution[:n_in] if _is_conv1d(layer) else solution[:n_in].T.reshape(layer.weight.shape)
        layer.weight.copy_(weight.to(layer.weight.dtype))
        if layer.bias is not None:
            layer.bias.copy_(solution[n_in].to(layer.bias.dtype))


def _batchnorms(model: nn.Module) -> list[str]:
    """The names of ``model``'s BatchNorms that keep running statistics (what eval mode normalises with)."""
    return [name for name, m in model.named_modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is not None]


@torch.no_grad()
def recalibrate_batchnorm_(model: nn.Module, batches: Iterable) -> list[str]:
    """Re-estimate the running statistics of every BatchNorm in ``model`` from ``batches``: reset, then the
    plain average over all of them (momentum ``None``), each BatchNorm in train mode and every other module
    in eval mode (no dropout); no gradient, no parameter changes. Each module's mode and momentum are
    restored. A swap to ReLU shifts every later layer's statistics while eval mode keeps normalising with the
    GELU network's (see the module's docstring). Returns the names re-estimated; ``ValueError`` if there are
    none, or if a batch gives a BatchNorm one value per channel (no variance to estimate)."""
    names = _batchnorms(model)
    if not names:
        raise ValueError(_NO_BATCHNORM)
    batches = [batches] if isinstance(batches, torch.Tensor) else list(batches)
    if not batches:
        raise ValueError("recalibrate_batchnorm_ got no batches")
    norms = [model.get_submodule(n) for n in names]
    momenta = [m.momentum for m in norms]
    try:
        with eval_mode(model), _two_values_per_channel(model, names):
            for m in norms:
                m.reset_running_stats()
                m.momentum = None
                m.train()
            for batch in batches:
                _call(model, batch)
    finally:
        for m, momentum in zip(norms, momenta):
            m.momentum = momentum
    return names


@contextlib.contextmanager
def _two_values_per_channel(model: nn.Module, names: list[str]):
    """Within: a forward that gives one of these BatchNorms a single value per channel is a ValueError
    (a variance needs two; BatchNorm itself would fail deep inside the network, or not at all in eval mode)."""
    def check(name, module, args):
        x = args[0]
        if x.dim() < 2 or x.numel() <= x.shape[1]:
            raise ValueError(f"recalibrate: BatchNorm {name!r} got one value per channel (input of shape "
                             f"{tuple(x.shape)}), no variance to estimate: give batches of at least 2 samples, "
                             "or recalibrate=0")
    handles = [model.get_submodule(n).register_forward_pre_hook(functools.partial(check, n)) for n in names]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _paced_lambda(a: float, lam_target: float) -> float:
    """λ at anneal progress a ∈ [0, 1]: 1/λ linear from 1 to 1/λ_target (the gap E(λ) ∝ 1/λ linear)."""
    return 1.0 / ((1.0 - a) + a / lam_target)


def _call(model: nn.Module, batch):
    if isinstance(batch, dict):
        first = _first_required(type(model))
        if first is not None and first not in batch:  # the dict is that argument: sentence-transformers' features
            return model(batch)
        kwargs = dict(batch)
        if _takes_hidden_states(model):
            kwargs.setdefault("output_hidden_states", True)
        return model(**kwargs)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def _takes_hidden_states(model: nn.Module) -> bool:
    """Whether ``model`` can be asked for its hidden states: its forward names ``output_hidden_states``,
    or it is a Hugging Face model (its config has the field), whose forward may take it through
    ``**kwargs`` (BERT, RoBERTa, GPT-2 in transformers 5)."""
    return ("output_hidden_states" in _forward_parameters(type(model))
            or hasattr(getattr(model, "config", None), "output_hidden_states"))


@functools.lru_cache(maxsize=None)
def _first_required(cls: type) -> str | None:
    """The name of the first argument a module class's forward cannot do without (None: it has defaults for all)."""
    try:
        parameters = list(inspect.signature(cls.forward).parameters.values())[1:]  # after self
    except (TypeError, ValueError):
        return None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return next((p.name for p in parameters if p.kind in positional and p.default is p.empty), None)


@functools.lru_cache(maxsize=None)
def _forward_parameters(cls: type) -> frozenset[str]:
    """The argument names of a module class's forward, read once per class (``_call`` runs every step)."""
    try:
        return frozenset(inspect.signature(cls.forward).parameters)
    except (TypeError, ValueError):
        return frozenset()


def distillation_loss(student, teacher, batch=None) -> torch.Tensor:
    """How far the student's outputs are from the teacher's, for the usual output types.

    - outputs with ``logits`` (language models, classifiers): KL(teacher ‖ student) of the softmax over
      the last dimension, averaged over positions (the attention mask's, if the batch has one);
    - outputs with ``last_hidden_state`` (encoders): 1 − cosine of the mean-pooled embeddings;
    - sentence-transformers' outputs (``sentence_embedding``): 1 − cosine of those, plus the relative squared
      error of the ``token_embeddings`` under their ``attention_mask``;
    - either way, plus the mean over layers of each hidden state's relative squared error
      ‖h_s − h_t‖² / ‖h_t‖² when the outputs carry ``hidden_states``;
    - a plain tensor: its relative squared error.
    """
    mask = batch.get("attention_mask") if isinstance(batch, dict) else None
    if isinstance(student, torch.Tensor):
        return _relative_error(student, teacher, None)
    logits = _field(student, "logits")
    if logits is not None:
        log_p_s = F.log_softmax(logits.float(), -1)
        log_p_t = F.log_softmax(_field(teacher, "logits").float(), -1)
        kl = (log_p_t.exp() * (log_p_t - log_p_s)).sum(-1)
        value = _masked_mean(kl, mask)
    elif _field(student, "sentence_embedding") is not None:
        value = 1.0 - F.cosine_similarity(_field(student, "sentence_embedding"), _field(teacher, "sentence_embedding"),
                                          dim=-1).mean()
        tokens = _field(student, "token_embeddings")
        if tokens is not None:
            value = value + _relative_error(tokens, _field(teacher, "token_embeddings"),
                                            _field(student, "attention_mask") if mask is None else mask)
    else:
        h_s, h_t = _field(student, "last_hidden_state"), _field(teacher, "last_hidden_state")
        if h_s is None:
            raise TypeError(f"distillation_loss does not know outputs of type {type(student).__name__}: "
                            "give reluize a loss=(student_output, teacher_output, batch) callable")
        value = 1.0 - F.cosine_similarity(mean_pool(h_s, mask), mean_pool(h_t, mask), dim=-1).mean()
    hidden_s, hidden_t = _field(student, "hidden_states"), _field(teacher, "hidden_states")
    if hidden_s:
        value = value + sum(_relative_error(s, t, mask) for s, t in zip(hidden_s, hidden_t)) / len(hidden_s)
    return value


def _field(output, name: str):
    if isinstance(output, dict):
        return output.get(name)
    return getattr(output, name, None)


def _masked_mean(v: torch.Tensor, mask) -> torch.Tensor:
    if mask is None or mask.shape != v.shape:
        return v.mean()
    mask = mask.to(v.dtype)
    return (v * mask).sum() / mask.sum().clamp(min=1)


def mean_pool(h: torch.Tensor, mask) -> torch.Tensor:
    """Mean over positions (the sentence-transformers pooling), padding left out."""
    if mask is None or mask.shape != h.shape[:-1]:
        return h.float().mean(-2)
    m = mask.unsqueeze(-1).to(torch.float32)
    return (h.float() * m).sum(-2) / m.sum(-2).clamp(min=1)


def _relative_error(s: torch.Tensor, t: torch.Tensor, mask) -> torch.Tensor:
    se, norm = (s.float() - t.float()).pow(2), t.float().pow(2)
    if mask is not None and mask.shape == s.shape[:-1]:
        m = mask.unsqueeze(-1).to(torch.float32)
        se, norm = se * m, norm * m
    return se.sum() / norm.sum().clamp(min=torch.finfo(torch.float32).tiny)


class _GeluCallsOutsideModules(TorchFunctionMode):
    """Records calls of ``F.gelu`` made while no GELU-like module is running."""

    def __init__(self):
        super().__init__()
        self.depth, self.calls = 0, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.gelu and self.depth == 0:
            self.calls += 1
        return func(*args, **(kwargs or {}))


def _functional_gelu_calls(model: nn.Module, batch) -> list[str]:
    """The modules whose forward applies gelu as a function (found by running ``batch`` once)."""
    mode, found, stack = _GeluCallsOutsideModules(), [], []

    def enter(name, m):
        def hook(*_):
            if is_gelu_like(m):
                mode.depth += 1
            stack.append((name, mode.calls))
        return hook

    def leave(name, m):
        def hook(*_):
            if is_gelu_like(m):
                mode.depth -= 1
            _, before = stack.pop()
            if mode.calls > before and not found:  # the innermost module that called it
                found.append(f"{type(m).__qualname__} at {name or '<root>'!r}")
        return hook

    handles = []
    for name, m in model.named_modules():
        handles.append(m.register_forward_pre_hook(enter(name, m)))
        handles.append(m.register_forward_hook(leave(name, m)))
    try:
        with torch.no_grad(), mode, eval_mode(model):
            _call(model, batch)
    finally:
        for h in handles:
            h.remove()
    return found


def _progress(total: int, enabled: bool):
    if enabled:
        try:
            from tqdm import tqdm
            return tqdm(total=total, desc="reluize", unit="step")
        except ImportError:
            pass
    return _Quiet()


class _Quiet:
    def set_postfix_str(self, *_): ...
    def update(self, *_): ...
    def close(self): ...
