"""reluize's loop over the :class:`~lambda_gelu.reluize.reluizer.Reluizer`'s steps: the swap and the anneal,
the whole network trained end to end to match its frozen original (the teacher), with a log entry per step, a
progress bar, the caller's callback, and the BatchNorms re-estimated when an anneal ends."""
from __future__ import annotations

import time
from collections.abc import Callable

from .batchnorm import recalibrate_batchnorm_
from .budget import next_eighth
from .reluizer import Reluizer, check_steps
from .result import ReluizeResult
from .stream import take_and_keep
from .training import lr_decay, progress_bar

__all__ = ["distill"]


def distill(reluizer: Reluizer, stream, steps: range, optimizer, lr_schedule: str, result: ReluizeResult,
            progress, callback, *, recalibrate: int = 0, replan: Callable[[float, int], int] | None = None) -> None:
    """Train the whole model of ``reluizer`` to match its teacher for ``steps`` (numbered from their start): the
    :class:`Reluizer`'s steps in a loop of reluize's own; when annealed gates become ReLU, the BatchNorms are
    re-estimated over the next ``recalibrate`` batches. ``replan(seconds, taken)``, where given, is asked again
    at each eighth of the steps planned, 1/8 to 7/8 of its last answer, for the total, given the seconds spent so
    far and the steps taken: a time budget that corrects its plan from the steps' real pace (the lr's fall and the
    anneal follow)."""
    first = steps.start
    decay = lr_decay(optimizer, lambda: reluizer.total_steps, lr_schedule)
    reluizer.model.eval()
    bar = progress_bar(len(steps), progress)
    eighth, check = next_eighth(len(steps), 1, 0) if replan is not None else (8, None)
    t0 = time.perf_counter() - result.seconds
    try:
        while reluizer.step_count < reluizer.total_steps:
            value = reluizer.loss(next(stream))
            optimizer.zero_grad(set_to_none=True)
            value.backward()
            optimizer.step()
            if decay is not None:
                decay.step()
            last = reluizer.last
            entry = {"step": first + reluizer.step_count + 1, "lam": last["lam"], "loss": last["loss"].item(),
                     "seconds": time.perf_counter() - t0}
            if "penalty" in last:
                entry["penalty"] = last["penalty"].item()
            if reluizer.step() and recalibrate:  # the anneal ended: exact ReLU from the next step on
                stream = _recalibrate(reluizer, stream, recalibrate, result)
            if result.record(entry, bar, f"λ {entry['lam']:.3g} loss {entry['loss']:.4g}", callback):
                break
            if reluizer.step_count == check:
                _replan(reluizer, replan(time.perf_counter() - t0, reluizer.step_count), result, bar)
                eighth, check = next_eighth(reluizer.total_steps, eighth + 1, reluizer.step_count)
        if reluizer.finish() and recalibrate:
            _recalibrate(reluizer, stream, recalibrate, result)
    finally:
        reluizer.close()
        bar.close()
    result.seconds = time.perf_counter() - t0


def _replan(reluizer: Reluizer, total, result: ReluizeResult, bar) -> None:
    """The plan's new total; at or below the steps taken, the steps end here."""
    check_steps(total, "the steps planned")
    total = max(total, reluizer.step_count)
    reluizer.replan(total)
    result.steps = total
    bar.total = total
    bar.refresh()


def _recalibrate(reluizer: Reluizer, stream, batches: int, result: ReluizeResult):
    """The BatchNorms re-estimated over the next ``batches`` batches; returns the stream with them back in front."""
    calibration, stream = take_and_keep(stream, batches)
    result.recalibrated = recalibrate_batchnorm_(reluizer.model, calibration)
    return stream
