"""What :func:`~lambda_gelu.reluize.reluize` did, returned to the caller."""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ReluizeResult"]


@dataclass
class ReluizeResult:
    """What :func:`reluize` did: the modules it replaced, the layers it refit, the BatchNorms it
    re-estimated, one log entry per step (with ``refit`` or ``recalibrate`` on the swap, a first one for
    step 0: that work, no loss), the time it took, the steps it was to take (as last planned, where ``steps`` was a
    plan), whether the callback ended it before them, and the gates applied as a function inside some ``forward``,
    which no module replacement reaches (each as "Class at 'name' applies silu": left as they were)."""
    replaced: list[str]
    log: list[dict] = field(default_factory=list)  # {"step", "lam", "loss", "seconds"[, "penalty"]}
    seconds: float = 0.0
    refit: list[str] = field(default_factory=list)
    recalibrated: list[str] = field(default_factory=list)
    stopped: bool = False
    steps: int = 0
    loss: str = ""  # the loss's name; with "auto", the one it picked
    functional: list[str] = field(default_factory=list)  # gates applied as a function, left as they were

    def record(self, entry: dict, bar, label: str, callback) -> bool:
        """Log one step's ``entry``, show it on ``bar`` as ``label``, hand it to ``callback``; True if the callback
        ends the conversion there (``stopped`` is then set)."""
        self.log.append(entry)
        bar.set_postfix_str(label)
        bar.update()
        self.stopped = callback is not None and bool(callback(entry))
        return self.stopped

    @property
    def final_loss(self) -> float:
        return self.log[-1]["loss"] if self.log else float("nan")
