"""A conversion's time budget: how many steps fit, planned before the first from a step's timed cost, planned again
at each eighth of the steps from the pace they really keep, and ended before a step would overrun it. The budget is
the whole command's wall clock: what measuring will still take (the curve's points, the final measurement) is
set aside from the steps' share, so that ``--minutes 30`` is thirty minutes from start to written checkpoint.

:func:`~lambda_gelu.reluize.reluize` takes a :class:`TimeBudget` as its ``steps`` (any ``plan(seconds, taken)``
does) and asks it at the eighths :func:`eighths` names; the checkpoint pipeline measures its curve there too.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

__all__ = ["TimeBudget", "eighths", "next_eighth", "CHECKPOINTS", "BUDGET_SHARE"]

CHECKPOINTS = 8  # a plan is asked again, and the curve measured, at each eighth of the steps planned
BUDGET_SHARE = 0.97  # of the budget, what is planned for: a MiniLM step's time varied by ±3% between runs


def eighths(total: int, taken: int = 0, first: int = 1) -> list[int]:
    """The steps at the eighths ``first``/8 to 7/8 of ``total`` that lie past ``taken`` and before ``total``."""
    return sorted({m for m in (max(1, round(total * k / CHECKPOINTS)) for k in range(first, CHECKPOINTS))
                   if taken < m < total})


def next_eighth(total: int, k: int, taken: int) -> tuple[int, int | None]:
    """The first of ``total``'s eighths from its ``k``-th (k/8 of its steps; 7 at most) that lies past ``taken``,
    and where: when the plan is asked next. A plan is asked at most seven times after its first answer."""
    for j in range(k, CHECKPOINTS):
        step = max(1, round(total * j / CHECKPOINTS))
        if step > taken:
            return j, step
    return CHECKPOINTS, None


@dataclass
class TimeBudget:
    """``minutes`` of wall clock from ``start`` (a ``time.perf_counter()`` reading), of which the steps get what is
    left once measuring is set aside: ``point_seconds`` for each point of the curve still to come, ``final_seconds``
    for the measurement after the steps and the write. ``step_seconds``: one step, as timed before the steps.

    Called as ``budget(seconds, taken)`` (reluize's plan: ``seconds`` of conversion so far, ``taken`` steps), it
    returns the steps in all: at the first call, as many as fit at the timed step's cost; at later ones, as many as
    fit at the pace the steps kept (their own seconds, measuring left out). Each plan is kept in :attr:`plans`.
    """
    minutes: float
    start: float
    step_seconds: float
    point_seconds: float = 0.0
    final_seconds: float = 0.0
    plans: list[dict] = field(default_factory=list)
    measuring: float = 0.0  # seconds spent measuring since the steps' clock started: not conversion time
    longest: float = 0.0  # the longest step so far, and the conversion seconds at the last one
    last: float = 0.0

    @property
    def deadline(self) -> float:
        return self.start + BUDGET_SHARE * self.minutes * 60

    def left(self, points: int) -> float:
        """Seconds left for steps now, with ``points`` of the curve still to measure and the final measurement."""
        return self.deadline - time.perf_counter() - points * self.point_seconds - self.final_seconds

    def __call__(self, seconds: float, taken: int) -> int:
        spent = seconds - self.measuring
        points = CHECKPOINTS - 1 - len(self.plans)  # the eighths still to come, each one point of the curve
        left = self.left(points)
        if not taken:
            pace = self.step_seconds
            total = max(1, int(left / pace))
        else:
            pace = max(spent - self.plans[0]["seconds"], 1e-9) / taken
            total = max(taken, taken + int(left / pace))
        self.plans.append({"step": taken, "seconds": spent, "steps": total, "step_seconds": pace, "left": left})
        return total

    def overruns(self, seconds: float, step: int) -> bool:
        """Whether another step, as long as the longest so far, would end past the time left for steps (``seconds``:
        conversion seconds at the end of step ``step``, measuring included, as reluize's log counts them)."""
        spent = seconds - self.measuring
        self.longest = max(self.longest, spent - self.last) if step else 0.0
        self.last = spent
        return time.perf_counter() + self.longest + self.final_seconds > self.start + self.minutes * 60

    def estimate(self, refit_seconds: float, steps: int) -> float:
        """Seconds from ``start`` to the written checkpoint, as planned now: what has passed, the refit, ``steps``
        steps, the curve and the final measurement."""
        passed = time.perf_counter() - self.start
        measuring = (CHECKPOINTS - 1) * self.point_seconds + self.final_seconds
        return passed + refit_seconds + steps * self.step_seconds + measuring
