"""``ConversionConfig``: a checkpoint conversion's settings — its budget, text and batches, and the
:class:`~lambda_gelu.reluize.ReluizeConfig` it runs with — checked when built, with the defaults that depend on the
model settled in one place (:meth:`ConversionConfig.settled`). The ``lambda-gelu reluize`` options are its fields."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

from ..errors import CheckpointError
from ..errors import need as check
from ..reluize import ReluizeConfig
from ..reluize.config import CAUSAL_LR

__all__ = ["ConversionConfig", "BATCHINGS", "EMBEDDINGS"]

BATCHINGS = ("length", "shuffled")
EMBEDDINGS = ("train", "freeze")


def _help(text: str, **more) -> dict:
    return {"help": text, **more}


def _whole(v, low) -> bool:
    """A whole number (not a bool) from ``low`` to 2^31: a setting counted in steps, sentences, rounds..."""
    return isinstance(v, int) and not isinstance(v, bool) and low <= v <= 2 ** 31


@dataclass(frozen=True)
class ConversionConfig:
    """A checkpoint conversion: its budget, its text and batches, and the :class:`ReluizeConfig` it runs with
    (``reluize.refit`` is set from ``refit``, counted in sentences here). The ``lambda-gelu reluize`` options
    are these fields and ReluizeConfig's, with their defaults and help."""
    steps: int | None = field(default=None, metadata=_help("conversion steps (default: what fits --minutes)"))
    minutes: float | None = field(default=None, metadata=_help(
        "time budget in minutes (default when --steps is not given: 15, or 30 for a causal language model): the "
        "steps are planned to fit it after the refit, planned again at each eighth from their own pace, and end "
        "before they would overrun it"))
    refit: int | None = field(default=None, metadata=_help(
        "with the swap: training sentences over which the layer after each activation is solved by least squares "
        "before the first step (default 1024 with the swap; 0: none)"))
    batch_size: int = field(default=32, metadata=_help("sentences per step"))
    batching: str = field(default="length", metadata=_help(
        "length: random batches of sentences of nearly one length, so that little of each step is padding; "
        "shuffled: consecutive sentences of the shuffled text", choices=BATCHINGS))
    max_tokens: int = field(default=64, metadata=_help("tokens per sentence at most"))
    seed: int = field(default=0, metadata=_help("the seed of the sentences' order and of the steps"))
    texts: tuple[str, ...] = field(default=(), metadata=_help(
        "your own training text files, one sentence a line, drawn from with the docstrings (a file named twice is "
        "twice its share of the steps' sentences)"))
    eval_texts: tuple[str, ...] = field(default=(), metadata=_help(
        "your own held-out text files, one sentence a line, never trained on (a line that is also training text is "
        "left out): the report measures the checkpoint on them against the original"))
    embeddings: str = field(default="train", metadata=_help(
        "train: the steps update the token embeddings and a language model's output layer (its vocabulary's "
        "logits) too; freeze: they stay the original's and the steps update the rest (attention, MLPs, norms): a "
        "causal LM's step is cheaper, but SmolLM2 kept less in 30 minutes (studies/smollm2_budget_frozen.md)",
        choices=EMBEDDINGS, experimental=True))
    reluize: ReluizeConfig = field(default_factory=ReluizeConfig)

    DEFAULT_MINUTES = 15.0
    DEFAULT_MINUTES_CAUSAL = 30.0  # a causal LM's default budget: its steps cost more (a vocabulary-wide KL)
    DEFAULT_REFIT = 1024  # sentences, with the swap (MiniLM: cosine 0.986 in 1 minute; studies/minilm_refit.md)

    def __post_init__(self):
        def need(ok: bool, message: str):
            check(ok, message, CheckpointError)

        whole = _whole
        need(self.steps is None or self.minutes is None, "give --steps or --minutes, not both")
        need(self.steps is None or isinstance(self.steps, int) and not isinstance(self.steps, bool)
             and self.steps >= 1, f"--steps must be ≥ 1, got {self.steps!r}")
        need(self.steps is None or whole(self.steps, 1), f"--steps must be at most 2^31, got {self.steps!r}")
        need(self.minutes is None or isinstance(self.minutes, (int, float)) and 0 < self.minutes <= 60 * 24 * 365,
             f"--minutes must be > 0 and at most a year, got {self.minutes!r}")
        need(self.refit is None or whole(self.refit, 0), f"--refit is a number of sentences ≥ 0, got {self.refit!r}")
        need(not self.refit or self.reluize.schedule == "swap", f"--refit is for --schedule swap (--schedule "
             f"{self.reluize.schedule} has no ReLU to refit for before its first step); leave it out")
        need(whole(self.batch_size, 1), f"--batch-size must be ≥ 1, got {self.batch_size!r}")
        need(self.embeddings in EMBEDDINGS, f"--experimental-embeddings must be one of {', '.join(EMBEDDINGS)}, got "
             f"{self.embeddings!r}")
        need(self.batching in BATCHINGS, f"--batching must be one of {', '.join(BATCHINGS)}, got {self.batching!r}")
        need(whole(self.max_tokens, 2), f"--max-tokens must be ≥ 2, got {self.max_tokens!r}")
        need(whole(self.seed, 0), f"--seed must be a whole number from 0 to 2^31, got {self.seed!r}")
        for name, files in (("texts", self.texts), ("eval_texts", self.eval_texts)):
            need(isinstance(files, (tuple, list)) and all(isinstance(f, (str, os.PathLike)) for f in files),
                 f"{name} is a tuple of file names, got {files!r}")
        need(self.reluize.refit == 0, "ConversionConfig counts the refit in sentences: set refit, not reluize.refit")

    @property
    def budget_minutes(self) -> float | None:
        return self.DEFAULT_MINUTES if self.steps is None and self.minutes is None else self.minutes

    def settled(self, causal: bool) -> "ConversionConfig":
        """This conversion with every default that depends on the model settled, in this one place: the budget
        (``DEFAULT_MINUTES``, or ``DEFAULT_MINUTES_CAUSAL`` for a causal LM, unless steps are given), the learning
        rate (``CAUSAL_LR`` for a causal LM, else ReluizeConfig's own default) and the precision (``auto``: bfloat16
        where the CPU computes it fast, for a causal LM's swap or anneal; float32 otherwise)."""
        minutes = self.minutes
        if self.steps is None and minutes is None:
            minutes = self.DEFAULT_MINUTES_CAUSAL if causal else self.DEFAULT_MINUTES
        r = self.reluize
        lr = r.lr if r.lr is not None else CAUSAL_LR if causal else r.learning_rate
        precision = r.precision or ("auto" if causal and r.schedule != "blockwise" else "float32")
        return self.replace(minutes=minutes, reluize=r.replace(lr=lr, precision=precision))

    @property
    def refit_sentences(self) -> int:
        return self.refit if self.refit is not None else self.DEFAULT_REFIT if self.reluize.schedule == "swap" else 0

    def replace(self, **changes) -> "ConversionConfig":
        return dataclasses.replace(self, **changes)
