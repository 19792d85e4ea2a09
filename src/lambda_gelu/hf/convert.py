"""A pretrained Hugging Face GELU or SiLU model → a standard checkpoint of its exact-ReLU version, with a report of
what the conversion kept (``lambda-gelu reluize MODEL --out DIR`` calls :func:`reluize_checkpoint`).

The training text is English every machine has (the sentences of the standard library's docstrings), plus the
user's ``texts``; the report measures on held-out docstring sentences from files never used in training, for the
direct swap to ReLU too and along the conversion (the curve of metric vs minutes), and once it ends on text of
other kinds: Python's reference documentation, and the user's ``eval_texts``. The checkpoint loads with plain
transformers (and sentence-transformers, for such a directory) as the ReLU network.
"""
from __future__ import annotations

import copy
import dataclasses
import importlib.util
import itertools
import json
import math
import os
import re
import time
import warnings
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..core.convert import is_reluizable
from ..core.keep import keep_
from ..errors import CheckpointError
from ..reluize import ReluizeConfig, reluize
from ..reluize.budget import CHECKPOINTS, TimeBudget, eighths
from ..reluize.precision import autocast_dtype
from ..reluize.probes import functional_gelu_calls, never_reached, run_hooked
from ..reluize.refit import find_consumers
from ..reluize.threshold import gate_zeros_problem
from .attention import attention_of, set_attention_, training_attention_
from .config import BATCHINGS, EMBEDDINGS, ConversionConfig
from .costs import refit_seconds as _refit_seconds
from .costs import step_seconds as _step_seconds
from .evaluate import evaluate, hidden_states, markdown, relu_zeros, scores
from .load import _first_line, fingerprint, load, model_directory, progress_bars, quiet_transformers
from .save import REPORT, files_in, prepare_out, write_atomically
from .text import corpus, decoder_inputs, held_out_sets, padding_tokenizer, read_texts, teacher_forced

__all__ = ["ConversionConfig", "reluize_checkpoint", "BATCHINGS", "EMBEDDINGS"]  # the settings: .config's

REFIT_SHARE = 0.25  # of --minutes, the most the refit may take (estimated from a timed forward and a timed solve)
UNSAVEABLE = ", so its ReLU checkpoint would not load as the converted network"
CURVE_SHARE = 0.05  # of --minutes, the most the curve's points may take: beyond, they measure every few batches
BLOCKWISE_STEP_COST = 0.4  # a blockwise step runs the networks only up to its block: 0.45 s against 1.1 s (MiniLM)


def reluize_checkpoint(model_name: str, out: str | os.PathLike, config: ConversionConfig | None = None, *,
                       overwrite: bool = False, progress: bool = False, log=print) -> Path:
    """Convert the checkpoint ``model_name`` (a directory, or a name of :data:`OFFLINE_MODELS`) and write its
    exact-ReLU version, with ``reluize_report.md``/``.json``, to ``out``. Every input is checked before the
    conversion starts; a :class:`CheckpointError` says what was wrong in one line. Returns ``out``.

    The pipeline, one named stage each: load → check → measure the original → plan → reluize → measure → write."""
    start = time.perf_counter()  # --minutes is the whole command's, from here to the written checkpoint
    config = config or ConversionConfig()
    job = _load(model_name, out, config, overwrite, progress, log)
    _check(job, log)
    _measure_original(job)
    plan = _plan(job, start, log)
    result = _reluize(job, plan, progress, log)
    report = _measure(job, plan, result, start)
    _write(job, report, progress)
    return job.target


@dataclass
class _Job:
    """What the stages hand on: the model loaded and its text, the settings it runs at (a causal LM's defaults
    settled), and, as the stages fill them, the original's measurements."""
    name: str
    config: ConversionConfig
    source: Path
    target: Path
    loaded: object
    origin: str  # the original's fingerprint, taken before anything changes it
    extra: list
    text: object
    decoder: object
    others: dict
    log: object
    held: list = field(default_factory=list)  # the held-out batches every measurement runs
    unreached: list = field(default_factory=list)
    put_back: object = None
    original: object = None
    reference: dict | None = None
    swap_scores: dict | None = None
    attention: tuple = ()  # the attention as loaded, and the one the student trains with
    autocast: object = None  # the distillation's autocast dtype (None: float32)
    point_seconds: float = 0.0  # one measurement of the curve, timed on the original
    final_seconds: float = 0.0  # the final measurement, from the original's timed ones
    originals: dict = field(default_factory=dict)  # the original on the other held-out sets

    @property
    def model(self):
        return self.loaded.model

    @property
    def causal(self) -> bool:
        return self.loaded.causal


@dataclass
class _Plan:
    """What the conversion runs: its steps (a number, or the budget that plans them), refit, settings, and where its
    curve is measured."""
    steps: object
    budget: TimeBudget | None
    refit: int
    refit_note: str | None
    settings: ReluizeConfig
    autocast: object
    planning: float
    marks: set = field(default_factory=set)
    curve: list = field(default_factory=list)  # the held-out batches the curve is measured on ...
    curve_reference: dict | None = None  # ... and the original on them


def _load(model_name: str, out, config: ConversionConfig, overwrite: bool, progress: bool, log) -> _Job:
    """The checkpoint loaded as its own library loads it, the output prepared, the text read and batched."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing downloads at run time
    if importlib.util.find_spec("transformers") is None:
        raise CheckpointError("reluize needs transformers: pip install 'lambda-gelu[hf]'")
    quiet_transformers()
    source = model_directory(model_name)
    target = prepare_out(out, overwrite)
    extra = read_texts(list(config.texts))
    eval_lines = read_texts(list(config.eval_texts), "--eval-text")
    loaded = load(source, model_name, progress=progress)
    origin = fingerprint(loaded.model)  # before anything changes it: deploy checks its original against it
    if loaded.note:
        log(f"note: {loaded.note}")
    config = config.settled(loaded.causal)
    try:
        decoder = decoder_inputs(loaded.model)  # an encoder-decoder's decoder reads the sentence too
    except CheckpointError as e:
        raise CheckpointError(f"{model_name}: {e}") from None
    text = corpus(loaded.tokenizer, seed=config.seed, batch_size=config.batch_size, max_tokens=config.max_tokens,
                  batching=config.batching, extra=extra, decoder=decoder)
    others = held_out_sets(text.train, eval_lines, config.eval_texts)
    return _Job(model_name, config, source, target, loaded, origin, extra, text, decoder, others, log,
                text.held_batches())


def _check(job: _Job, log) -> None:
    """Every refusal before anything changes: nothing to convert, a ReLU checkpoint that would not load as the
    network, gates that cannot be thresholded, a forward that fails on text or never reaches an activation. Leaves
    the activations text never reaches kept as they are (``job.put_back`` restores them)."""
    import lambda_gelu as lg
    model, name, config = job.model, job.name, job.config
    if not any(lg.is_reluizable(m) for m in model.modules()):
        kinds = _activation_kinds(model)
        found = [f"its activations are {', '.join(kinds)}" + (", nothing to convert" if kinds == ["ReLU"] else "")
                 ] if kinds else []
        found += [f"{call} as a function, which no module replacement can make ReLU"
                  for call in _functional_gates(model, job.loaded.tokenizer)[:1]]  # a gate its code applies itself
        raise CheckpointError(f"{name} has no GELU- or SiLU-like activation module to convert"
                              + (f": {'; '.join(found)}" if found else "")
                              + f" (looked for: {', '.join(lg.GELU_LIKE + lg.SILU_LIKE)})")
    unsaveable = lg.relu_config_problem(model)  # of every module; again below, with those text never reaches kept
    thresholded = gate_zeros_problem(model) if config.reluize.gate_zeros else None
    if thresholded:
        raise CheckpointError(f"--gate-zeros: {name}: {thresholded}")
    if config.embeddings == "freeze":  # before the step is timed: a frozen output layer has no gradient to compute
        freeze_embeddings_(model)
    problem, unreached = _forward_problem(model, job.held[0])  # a vision tower text never trains
    if problem:  # a model that cannot be saved as ReLU is told so first, whatever its forward does
        raise CheckpointError(f"{name}: {unsaveable or problem}" + (UNSAVEABLE if unsaveable else ""))
    if len(unreached) == sum(lg.is_reluizable(m) for m in model.modules()):
        kinds = _activation_kinds(model, leave=set(unreached))  # what text does reach: ReLU², a gate as a function
        found = [f"its other activations are {', '.join(kinds)}"] if kinds else []
        found += [f"{call} as a function" for call in _functional_gates(model, job.loaded.tokenizer)[:1]]
        raise CheckpointError(f"{name}: none of its activation modules is reached by a forward on text (from "
                              f"'{unreached[0]}'): nothing a conversion on text can train"
                              + (f" ({'; '.join(found)})" if found else ""))
    job.unreached, job.put_back = unreached, keep_(model, unreached)
    kept_note = (f"activation modules text never reaches left as they were ({len(unreached)}, from "
                 f"'{unreached[0]}'): training on text would make them ReLU untrained") if unreached else None
    if unreached:  # of what converts, the kept modules as they are: one may share a field with the text model's
        unsaveable = lg.relu_config_problem(model)
    if unsaveable:
        raise CheckpointError(f"{name}: {unsaveable}" + (f" (with the {kept_note})" if kept_note else "")
                              + UNSAVEABLE)
    if kept_note:
        log(f"note: {kept_note}")


def _measure_original(job: _Job) -> None:
    """The original measured on the held-out sets (what the checkpoint is scored against) and the direct swap to
    ReLU; the measurements timed, so that the plan sets aside what measuring the checkpoint will take."""
    import lambda_gelu as lg
    model, causal, held = job.model, job.causal, job.held
    job.original = copy.deepcopy(model)
    t = time.perf_counter()
    job.reference = evaluate(job.original, held, causal)
    job.point_seconds = time.perf_counter() - t
    final = 2 * job.point_seconds  # the checkpoint scored, its zeros counted: a forward each
    for name, other in job.others.items():
        t = time.perf_counter()
        job.originals[name] = evaluate(job.original, job.text.held_batches(other["sentences"]), causal)
        final += 2 * (time.perf_counter() - t)
    job.final_seconds = final
    direct = copy.deepcopy(model)
    lg.to_relu_(direct, include_gelu=True)
    job.swap_scores = scores(evaluate(direct, held, causal), job.reference)
    del direct
    device = next(model.parameters()).device
    job.autocast = autocast_dtype(job.config.reluize.precision, device)  # None: float32
    job.attention = (training_attention_(model, job.autocast, device), attention_of(model))


def _plan(job: _Job, start: float, log) -> _Plan:
    """The refit's size and the steps: a number given, or a :class:`TimeBudget` from a timed refit batch and step,
    what measuring will take set aside; said before anything runs."""
    config, model, text = job.config, job.model, job.text
    batch_size, schedule, autocast = config.batch_size, config.reluize.schedule, job.autocast
    torch.manual_seed(config.seed)
    refit, refit_note = config.refit_sentences, None
    refit_batches = -(-refit // batch_size)
    if refit and config.refit is None and not find_consumers(model, text.encode(text.train[:batch_size])):
        refit_note = ("the refit left out: no layer reads an activation's output, nor is a gated FFN's output "
                      "projection a layer of its own, as in a mixture of experts that keeps its experts' weights as "
                      "one tensor, or in a model whose layers share one activation module (the original GPT)")
        refit, refit_batches = 0, 0  # the default's refit left out; a --refit given is refused by reluize
        log(f"note: {refit_note}")
    settings = config.reluize.replace(refit=refit_batches, hidden_weight=config.reluize.hidden_state_weight)
    measuring = (CHECKPOINTS - 1) * job.point_seconds + job.final_seconds
    if config.steps is not None:
        log(f"plan: {config.steps} steps" + (f" after a refit of {refit} sentences" if refit else "")
            + f", then about {_duration(measuring)} measuring the checkpoint")
        plan = _Plan(config.steps, None, refit, refit_note, settings, autocast, 0.0, curve=job.held,
                     curve_reference=job.reference)
        plan.marks = ({0} if refit else set()) | set(eighths(config.steps))
        return plan
    minutes = config.minutes
    curve, curve_reference, point = job.held, job.reference, job.point_seconds
    if (CHECKPOINTS - 1) * point > CURVE_SHARE * minutes * 60:  # the curve on every stride-th batch: proportionate
        stride = math.ceil((CHECKPOINTS - 1) * point / (CURVE_SHARE * minutes * 60))
        curve = job.held[::stride]
        curve_reference = evaluate(job.original, curve, job.causal)
        point *= len(curve) / len(job.held)
        measuring = (CHECKPOINTS - 1) * point + job.final_seconds
    started = time.perf_counter()  # timing the refit and a step, before the conversion's clock starts
    typical = _typical_batch(text, batch_size)
    refit_seconds = 0.0
    if refit_batches:  # the refit gets at most REFIT_SHARE of the budget, whatever the model's size
        fixed, one = _refit_seconds(model, typical)
        fits = int((REFIT_SHARE * minutes * 60 - fixed) / one)
        if fits < refit_batches:
            refit_note = (f"the refit of {refit} sentences would take more than {REFIT_SHARE:.0%} of --minutes "
                          f"{minutes:g} on this model (about {fixed:.0f} s to solve its layers and {one:.1f} s a "
                          f"batch): refit over {max(fits, 0) * batch_size} sentences instead")
            refit, refit_batches = max(fits, 0) * batch_size, max(fits, 0)
            settings = settings.replace(refit=refit_batches)
            log(f"note: {refit_note}")
        refit_seconds = fixed + one * refit_batches
    repair = config.reluize.repair
    step_cost = 1.0 if schedule != "blockwise" else (1 - repair) * BLOCKWISE_STEP_COST + repair
    step_seconds = _step_seconds(model, job.original, typical, config.reluize.distillation_loss(), autocast) * step_cost
    budget = TimeBudget(minutes, start, step_seconds, point, job.final_seconds)
    fit = max(0, int((budget.left(CHECKPOINTS - 1) - refit_seconds) / step_seconds))
    log(f"plan: about {fit} steps of {step_seconds:.2f} s" + (f" after a refit of {refit} sentences "
                                                               f"(about {_duration(refit_seconds)})" if refit else "")
        + f", {_duration(measuring)} measuring: about {budget.estimate(refit_seconds, fit) / 60:.1f} minutes in all "
        f"(--minutes {minutes:g}; planned again from the steps' own pace as they run)")
    if measuring > minutes * 60 / 2:
        log(f"note: measuring the checkpoint on the held-out sets takes about {measuring:.0f} s, more than half of "
            f"--minutes {minutes:g}: the steps get what is left")
    plan = _Plan(budget, budget, refit, refit_note, settings, autocast, time.perf_counter() - started, curve=curve,
                 curve_reference=curve_reference)
    plan.marks = {0} if refit else set()
    return plan


def _duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _typical_batch(text, batch_size: int) -> dict:
    """A batch of the mean padded length of a pass over the text, which a step is timed on (its time varies with
    the length, by batch)."""
    epoch = list(itertools.islice(text.order(), -(-len(text.train) // batch_size)))
    padded = [max(text.lengths[j] for j in b) for b in epoch]
    mean = sum(padded) / len(padded)
    return text.encode([text.train[j] for j in epoch[min(range(len(epoch)), key=lambda i: abs(padded[i] - mean))]])


def _reluize(job: _Job, plan: _Plan, progress: bool, log):
    """The conversion itself: :func:`~lambda_gelu.reluize.reluize` distilling from the original, its curve measured
    at the refit's end and each eighth of the steps (time not counted as conversion), ended by the budget before a
    step would overrun it."""
    model, causal, budget = job.model, job.causal, plan.budget
    curve, measuring = [], [0.0]

    def measure(entry):  # True ends the conversion: before a step would overrun --minutes
        if budget is not None:
            budget.measuring = measuring[0]
            if budget.overruns(entry["seconds"], entry["step"]):
                return True
            if budget.plans:  # the eighths of the plan in force, from the one it was asked at
                plan.marks.difference_update([m for m in plan.marks if m > budget.plans[-1]["step"]])
                plan.marks.update(eighths(budget.plans[-1]["steps"], budget.plans[-1]["step"], len(budget.plans)))
        if entry["step"] in plan.marks:
            t = time.perf_counter()
            lam = entry["lam"] if entry["lam"] != float("inf") else None  # None: exact ReLU already
            curve.append({"step": entry["step"], "minutes": (entry["seconds"] - measuring[0]) / 60, "lam": lam,
                          **scores(evaluate(model, plan.curve, causal), plan.curve_reference)})
            if entry["step"]:  # the steps' clock starts after step 0's measurement: it never counted it
                measuring[0] += time.perf_counter() - t
        return False

    with warnings.catch_warnings():  # reluize's warnings (a gate applied as a function, left as it is) as notes
        warnings.showwarning = lambda message, *_: log(f"note: {message}")
        result = reluize(model, job.text.batches(job.config.steps), plan.steps, plan.settings, teacher=job.original,
                         progress=progress, callback=measure)
    result.curve, result.measuring = curve, measuring[0]
    return result


def _measure(job: _Job, plan: _Plan, result, start: float) -> dict:
    """The checkpoint measured against the original on every held-out set, and the report of the whole run."""
    model, causal, config, loaded = job.model, job.causal, job.config, job.loaded
    seconds = result.seconds - result.measuring
    set_attention_(model, job.attention[0])  # measured and saved as it was loaded
    job.put_back()
    model.to(loaded.dtype).float()  # what is written, measured in float32 arithmetic as the original was
    held = job.held
    taken = result.log[-1]["step"] if result.stopped else result.steps
    final = scores(evaluate(model, held, causal), job.reference)
    zeros = relu_zeros(model, held)
    curve = result.curve + [{"step": taken, "minutes": seconds / 60, "lam": None, **final}]
    further = {}  # the checkpoint on text of other kinds, measured as on the docstrings
    for name, other in job.others.items():
        batches = job.text.held_batches(other["sentences"])
        further[name] = {"sentences": len(other["sentences"]), "source": other["source"],
                         **scores(evaluate(model, batches, causal), job.originals[name]),
                         "zeros": relu_zeros(model, batches)}
    settings, budget = plan.settings, plan.budget
    report = {"model": job.name, "source": str(job.source.resolve()), "fingerprint": job.origin,
              "schedule": settings.schedule, "repair": settings.repair, "seed": config.seed,
              "dtype": str(loaded.dtype).removeprefix("torch."), "steps": taken,
              "planned_steps": result.steps, "plans": budget.plans if budget else [],
              "budget_minutes": config.minutes, "refit_sentences": plan.refit,
              "refit": result.refit, "batch_size": config.batch_size, "batching": config.batching,
              "lr_schedule": settings.lr_schedule, "loss": result.loss, "embeddings": config.embeddings,
              "precision": str(plan.autocast or torch.float32).removeprefix("torch."),
              "training_attention": job.attention[1],
              "max_tokens": config.max_tokens, "train_sentences": len(job.text.train), "user_lines": len(job.extra),
              "held_out_sentences": len(job.text.held), "encoder_decoder": job.decoder is not None,
              "seconds": seconds, "planning_seconds": plan.planning,
              "wall_seconds": time.perf_counter() - start,  # the whole command but the write, measuring included
              "measuring_estimate": {"point_seconds": plan.budget.point_seconds if plan.budget else job.point_seconds,
                                     "final_seconds": job.final_seconds},
              "curve_sentences": sum(len(b["input_ids"]) for b in plan.curve),
              "replaced": result.replaced, "functional": result.functional, "kept": job.unreached,
              "direct_swap": job.swap_scores, "reluized": final, "curve": curve,
              "settings": dataclasses.asdict(settings), "refit_note": plan.refit_note,
              "zeros": zeros, "held_out_sets": further}
    model.to(loaded.dtype)
    return report


def _write(job: _Job, report: dict, progress: bool) -> None:
    """The checkpoint, its tokenizer, its pipeline's files and the report, written at once (all or nothing)."""
    model, loaded, source = job.model, job.loaded, job.source
    if getattr(model.config, "auto_map", None):  # loaded as transformers' own class, no code run: written as it
        del model.config.auto_map

    def fill(tmp: Path):
        model.save_pretrained(tmp / loaded.subfolder)  # safetensors, config naming ReLU
        loaded.tokenizer.save_pretrained(tmp / loaded.subfolder)
        for path in loaded.pipeline:  # sentence-transformers' files, as the original has them
            _copy(source / path, tmp / path)
        report["files"] = sorted(files_in(tmp) + [REPORT, "reluize_report.md"])
        (tmp / REPORT).write_text(json.dumps(report, indent=1) + "\n")
        (tmp / "reluize_report.md").write_text(markdown(report))

    with progress_bars(progress):
        write_atomically(job.target, fill)


def freeze_embeddings_(model) -> None:
    """Leaves the token embeddings and a language model's output layer of a Hugging Face model (of the first such
    module inside a sentence-transformers one) out of training: what ``embeddings="freeze"`` does."""
    inner = next((m for m in model.modules() if hasattr(m, "get_input_embeddings")), None)
    if inner is None:
        raise CheckpointError(f"--experimental-embeddings freeze: {type(model).__name__} has no token embeddings to find; "
                              "leave it out")
    for layer in (inner.get_input_embeddings(), getattr(inner, "get_output_embeddings", lambda: None)()):
        if layer is not None:
            layer.requires_grad_(False)


def _copy(src: Path, dst: Path) -> None:
    import shutil
    dst.parent.mkdir(parents=True, exist_ok=True)
    (shutil.copytree if src.is_dir() else shutil.copy2)(src, dst)


def _activation_kinds(model: torch.nn.Module, leave: Collection[str] = ()) -> list[str]:
    """The classes of ``model``'s activation modules but those named in ``leave``, by their names (``BloomGelu``,
    ``ReLUSquaredActivation``, ``ReLU``): what a refusal can name where none is one the conversion takes."""
    return sorted({type(m).__name__ for name, m in model.named_modules() if not list(m.children()) and name not in leave
                   and re.search(r"gelu|silu|swish|relu|act|elu$", type(m).__name__, re.IGNORECASE)})


def _forward_problem(model: torch.nn.Module, batch: dict) -> tuple[str | None, list[str]]:
    """Why ``model`` cannot be converted on text, found by one forward of ``batch``: its own forward fails there (a
    model that reads tables or images), or it gives no hidden states; and, where it can, the activation modules that
    forward never reaches, none of their kind either (:func:`~lambda_gelu.reluize.probes.never_reached`)."""
    reached = set()
    try:
        out = run_hooked(model, batch, [m.register_forward_pre_hook(lambda mod, args: reached.add(mod))
                                        for m in model.modules() if is_reluizable(m)], hidden_states=True)
    except Exception as e:  # noqa: BLE001 - the model's own forward on its own tokenizer's text: said in one line
        return (f"its forward fails on a batch of its tokenizer's text ({type(e).__name__}: {_first_line(e)}), "
                "which is what reluize trains and measures on"), []
    if hidden_states(out) is None:
        return f"{type(model).__name__}'s output has no hidden_states, which reluize measures and distils", []
    return None, never_reached(model, reached)


def _functional_gates(model: torch.nn.Module, tokenizer) -> list[str]:
    """Where ``model`` applies gelu or silu as a function, found on one short sentence: what a refusal can name where
    a model has no module to convert. Empty if nothing is found, or if the model's forward fails on the sentence
    (the refusal stands either way; this only names)."""
    try:
        batch = dict(padding_tokenizer(tokenizer)(["The gates of a network, found by running it."],
                                                  return_tensors="pt"))
        return functional_gelu_calls(model, teacher_forced(batch, decoder_inputs(model)), silu=True)
    except Exception:  # noqa: BLE001 - a forward of the user's model, run only to name what is refused
        return []
