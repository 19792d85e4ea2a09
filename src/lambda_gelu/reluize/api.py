"""The one call: :func:`reluize` checks everything it can before changing the model, runs the configured
schedule, and leaves either the exact-ReLU network or, if anything fails part-way, the original."""
from __future__ import annotations

import copy
import time
import warnings
from collections.abc import Callable, Iterable

import torch
import torch.nn as nn

from ..core.convert import GELU_LIKE, SILU_LIKE, _name_relu_in_configs_, is_reluizable, relu_config_problem, replace_modules_
from .batchnorm import NO_BATCHNORM, batchnorms, recalibrate_batchnorm_, two_values_per_channel
from .blockwise import blockwise
from .config import RECALIBRATE, ReluizeConfig, configured
from .distill import distill
from .probes import functional_gelu_calls, never_reached
from .refit import refit_consumers, swap_and_refit
from .reluizer import AnnealedGELU, Reluizer, check_steps
from .result import ReluizeResult
from .stream import batch_stream, take_and_keep
from .threshold import gate_zeros_problem, shift_gates_
from .training import adamw

__all__ = ["reluize"]

def reluize(model: nn.Module, batches: Iterable, steps: int | Callable[[float, int], int],
            config: ReluizeConfig | None = None, *, teacher: nn.Module | None = None,
            loss: str | Callable | None = None, optimizer: torch.optim.Optimizer | None = None, progress: bool = False,
            callback: Callable[[dict], bool | None] | None = None, **settings) -> ReluizeResult:
    """Turn ``model``'s GELU-like activations into exact ``nn.ReLU``, in place, training it for ``steps``
    optimizer steps to keep what its frozen original (the teacher) computes.

    Args:
        model: any module whose activations are GELU-like or SiLU-like modules (:data:`lambda_gelu.GELU_LIKE`,
            :data:`lambda_gelu.SILU_LIKE`): encoders, GPT-2, and the SwiGLU/GeGLU gates of Llama- and Gemma-family
            language models.
        batches: tensors (one positional argument), tuples (positional arguments) or dicts (keyword
            arguments, as a tokenizer returns them); see :func:`lambda_gelu.core.batches.run_batch`. A list or
            DataLoader is iterated again when it runs out; a single tensor is one batch used at every step.
            No targets are needed: they are the teacher's outputs.
        steps: optimizer steps in all; or a plan, ``plan(seconds, taken) -> steps in all``: a time budget's.
            It is asked before the first step, given the seconds the conversion spent before it (the refit, the
            BatchNorm re-estimation; 0 with ``schedule="blockwise"``) and 0, and again at each eighth of the
            steps it last gave, with the seconds spent and the steps taken: its answer is the new total (at or
            below the steps taken, they end there), so the plan corrects itself from the steps' real pace; the
            lr's fall, the anneal, the penalty and the threshold follow the total (blockwise: asked once).
        config: a :class:`ReluizeConfig` (default: its defaults); ``**settings`` change single fields of it,
            as in ``reluize(model, batches, 300, schedule="anneal", lr=1e-4)``.
        teacher: the network to match; default: a frozen copy of ``model`` before conversion.
        loss: a loss's name (``"auto"``, the default, or one of :data:`~lambda_gelu.reluize.LOSSES`) or a
            ``loss(student_output, teacher_output, batch) -> scalar`` callable (blockwise: its repair steps only).
        optimizer: your own, built over ``model``'s parameters (``lr``/``weight_decay`` then unused).
        progress: a progress bar (needs ``tqdm``).
        callback: called after every step with its log entry. If it returns True, the conversion ends there
            (a time budget, say): what is not exact ReLU yet becomes ReLU at once; ``result.stopped`` says so.

    The model is put in eval mode (no dropout, normalisation statistics kept) and trained in it. Raises
    ``ValueError`` before changing anything if a setting is wrong or the model has no GELU- or SiLU-like module. A
    gate applied as a function inside some ``forward`` (``F.gelu(x)``; ``F.silu`` where the model has SiLU
    modules) has no module to replace: it is left as it is, with a warning, and ``result.functional`` says where
    (a Qwen3-Next's linear attention gates its norm so; RoBERTa's LM head applies gelu so). An error
    raised part-way (a batch the model cannot take, an interrupt) puts the original network back in ``model``
    before it propagates, and says so in a note on the exception.
    """
    config = configured(config, settings, loss)
    if not callable(steps):
        check_steps(steps)
    stream = batch_stream(batches)
    first = next(stream)
    stream_with_first = _prepend(first, stream)
    if not any(is_reluizable(m) for m in model.modules()):
        functional = functional_gelu_calls(model, first, silu=True)
        raise ValueError("reluize found no GELU module to replace, nor a SiLU one"
                         + (f" ({functional[0]} as a function, which no module replacement can make ReLU)"
                            if functional else "") + " (looked for: " + ", ".join(GELU_LIKE + SILU_LIKE) + ")")
    thresholded = gate_zeros_problem(model) if config.gate_zeros else None
    if thresholded:
        raise ValueError(f"gate_zeros: {thresholded}")
    norms = batchnorms(model)
    recalibrate = config.recalibrate
    if recalibrate is None:  # the default: BatchNorm re-estimated wherever it can be
        recalibrate = RECALIBRATE if config.schedule != "blockwise" and norms else 0
    if recalibrate and not norms:
        raise ValueError(NO_BATCHNORM)
    custom_loss = loss if callable(loss) else None
    if config.schedule == "blockwise" and not config.repair and (custom_loss or optimizer):
        given = [name for name, value in (("loss", custom_loss), ("optimizer", optimizer)) if value]
        raise ValueError(f"{', '.join(given)}: not used by schedule='blockwise', which reconstructs each block's "
                         "output (relative squared error) with an AdamW of its own per block (give repair > 0 for "
                         "end-to-end steps that use it); leave them out")
    # Probe forwards, after every argument check: the one that looks for gelu applied as a function also notes the
    # activation modules it runs, and checks that the first batch gives the recalibration statistics it can estimate.
    reached = set()
    with two_values_per_channel(model, norms if recalibrate else []):
        functional = functional_gelu_calls(model, first, reached=reached)
    if functional:  # no weight is lost: the call stays as it was, in the converted model as in its checkpoint
        warnings.warn(f"{'; '.join(functional)} as a function, which no module replacement can make ReLU: left as "
                      "it is, every activation module converted (make it a module, nn.GELU or nn.SiLU, to convert it "
                      "too)", stacklevel=2)
    unreached = never_reached(model, reached)
    if unreached:  # a multimodal model's vision tower, on text: converted as asked, but never trained
        warnings.warn(f"{len(unreached)} activation modules (at {unreached[0]!r}) are never reached by a forward of "
                      "the first batch, nor any of their kind: they become ReLU untrained; leave them out (with "
                      "lambda_gelu.core.keep.kept(model, names): reluize(...)) or convert on batches that reach them",
                      stacklevel=2)
    consumers = refit_consumers(model, first) if config.refit else {}
    low = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()
                  if p.requires_grad and p.dtype in (torch.bfloat16, torch.float16)})
    if low and optimizer is None:  # AdamW's step is ~lr per weight, below their resolution near 1
        warnings.warn(f"reluize trains the model's {' and '.join(low)} weights as they are, where AdamW's steps of "
                      f"lr={config.learning_rate:g} mostly round away; convert a float32 copy (model.float()) and cast "
                      "it back after, or give an optimizer that keeps float32 weights", stacklevel=2)
    unsaveable = relu_config_problem(model)
    if unsaveable:  # the conversion is right in memory; say now, not after the steps, what a checkpoint would lose
        warnings.warn(f"{unsaveable}: the converted model will be exact ReLU, but save_pretrained would write a "
                      "checkpoint that does not load as it", stacklevel=2)
    snapshot = _Snapshot(model, teacher)
    if teacher is None:
        teacher = snapshot.copy
    teacher.eval().requires_grad_(False)
    loss_fn = config.distillation_loss(loss)
    try:
        result = _convert(model, teacher, stream_with_first, first, steps, config, loss_fn, optimizer, recalibrate,
                          consumers, progress, callback)
    except BaseException as e:
        snapshot.restore(e)
        raise
    _name_relu_in_configs_(model, warn=not unsaveable)
    result.functional = functional
    result.loss = getattr(getattr(loss_fn, "picked", None) or loss_fn, "name", getattr(loss_fn, "__name__", "custom"))
    return result


def _prepend(first, stream):
    yield first
    yield from stream


def _convert(model, teacher, stream, first, steps, config: ReluizeConfig, loss, optimizer, recalibrate, consumers,
             progress, callback) -> ReluizeResult:
    if config.schedule == "blockwise":
        steps = _planned(steps, 0.0)
        blocks_steps = steps - round(config.repair * steps)
        result = blockwise(model, teacher, stream, blocks_steps, first, config.learning_rate, config.weight_decay,
                           config.lr_schedule, progress, callback)
        if blocks_steps < steps and not result.stopped:
            repair = Reluizer.converted(model, teacher, steps - blocks_steps, config, loss, [], sparsity=False)
            distill(repair, stream, range(blocks_steps, steps), optimizer or adamw(model, config.learning_rate,
                    config.weight_decay), config.lr_schedule, result, progress, callback)
        result.steps = steps
        return result
    t0 = time.perf_counter()
    calibration = []
    if config.refit:
        calibration, stream = take_and_keep(stream, config.refit)
    if config.gate_zeros_at_once:  # on the batches the refit then solves over, for the shifted gates
        shift_gates_(model, calibration or [first], config.gate_zeros)
    if config.refit:
        replaced = swap_and_refit(model, calibration, config.ridge, consumers)
    elif config.schedule == "swap":
        replaced = replace_modules_(model, lambda m, fqn: is_reluizable(m), lambda old: nn.ReLU(), "GELU")
    else:
        replaced = replace_modules_(model, lambda m, fqn: is_reluizable(m), AnnealedGELU, "GELU")
    result = ReluizeResult(replaced, refit=[layer for layers in consumers.values() for layer in layers])
    if recalibrate and config.schedule == "swap":
        calibration, stream = take_and_keep(stream, recalibrate)
        result.recalibrated = recalibrate_batchnorm_(model, calibration)
    if config.refit or result.recalibrated:  # conversion time, logged as step 0
        result.seconds = time.perf_counter() - t0
        result.log.append({"step": 0, "lam": float("inf"), "loss": float("nan"), "seconds": result.seconds})
        result.stopped = callback is not None and bool(callback(result.log[-1]))
    if not result.stopped:  # the callback may end it at step 0, after the refit or the re-estimation
        plan, result.steps = steps, _planned(steps, result.seconds)
        reluizer = Reluizer.converted(model, teacher, result.steps, config, loss, replaced)
        distill(reluizer, stream, range(result.steps), optimizer or adamw(model, config.learning_rate,
                config.weight_decay), config.lr_schedule, result, progress, callback,
                recalibrate=recalibrate if config.schedule == "anneal" else 0,
                replan=plan if callable(plan) else None)
    return result


def _planned(steps, spent: float) -> int:
    """``steps``, or what the plan ``steps`` returns before the first step, ``spent`` seconds in."""
    if callable(steps):
        steps = steps(spent, 0)
        check_steps(steps, "the steps planned")
    return steps


class _Snapshot:
    """What it takes to put ``model`` back as it was if the conversion fails part-way: its modules as they are
    now (the teacher copy, when reluize makes one; else a copy of its own), each parameter's ``requires_grad``
    and each module's mode."""

    def __init__(self, model: nn.Module, teacher: nn.Module | None):
        self.model = model
        self.copy = copy.deepcopy(model)  # the teacher when none is given: the copy is made once either way
        self.owned = teacher is None
        self.grads = [p.requires_grad for p in self.copy.parameters()]
        self.modes = [m.training for m in self.copy.modules()]

    def restore(self, error: BaseException) -> None:
        original = self.copy
        for p, flag in zip(original.parameters(), self.grads):
            p.requires_grad_(flag)
        for m, training in zip(original.modules(), self.modes):
            m.training = training
        self.model.__dict__.update(original.__dict__)  # the original's modules, parameters and buffers, in place
        if hasattr(error, "add_note"):
            error.add_note("reluize: the conversion failed part-way; the model holds the original network again "
                           "(GELU, weights as before)")
