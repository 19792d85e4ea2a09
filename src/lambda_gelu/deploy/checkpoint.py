"""What a converted checkpoint buys in the runtime it ships in (``lambda-gelu deploy DIR`` calls
:func:`deploy_checkpoint`).

The ReLU checkpoint in ``DIR`` and its original (the model ``DIR/reluize_report.json`` names, or ``original=``)
are exported to ONNX, each export checked against torch on a batch of another shape than it was traced with, and
quantized to int8 with ONNX Runtime (dynamic: int8 weights with a scale per output channel, activations quantized
at run time, as ONNX Runtime does for transformers). For each of the four graphs the report gives the latency at
batch 1 and at a serving batch (rounds that run every graph once in turn, so that ratios hold where absolute times
drift), the file size, and the quality against the original in float32 on held-out text (the sentences
``reluize`` measures on: mean cosine and top-10 overlap of the sentence embeddings; for causal LMs the perplexity
ratio; for a head, the predictions kept), with the ReLU model's exact zeros. ONNX Runtime's kernels are dense:
where the zeros buy no time, the report says so. For a causal LM it then times greedy decoding at batch 1 in torch,
where they do: the original's ``generate`` against the ReLU model's, dense and sparsified, and ``LeanDecoder``
(:mod:`lambda_gelu.deploy.decoding`).

``DIR/deploy_report.md`` and ``.json`` and the ReLU model's graphs (``DIR/onnx/model.onnx``, ``model.int8.onnx``)
are written once everything is measured, each file complete or not at all.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..errors import CheckpointError
from ..hf.config import _help, _whole
from ..hf.evaluate import evaluate, hidden_states, relu_zeros, scores, summarise
from ..hf.load import OFFLINE_MODELS, _first_line, fingerprint, load, model_directory, quiet_transformers
from ..hf.save import DEPLOY_REPORT, REPORT, listed_files
from ..hf.text import decoder_inputs, padding_tokenizer, stdlib_sentences, teacher_forced
from .decoding import decoding_speed
from .decoding import markdown_lines as decoding_lines

__all__ = ["DeployConfig", "deploy_checkpoint", "DEPLOY_REPORT", "ONNX_FILES"]

ONNX_FILES = ("onnx/model.onnx", "onnx/model.int8.onnx")  # the ReLU model's graphs, relative to DIR
GRAPHS = ("original fp32", "original int8", "ReLU fp32", "ReLU int8")
_MARK = ".deploy-partial"  # inside the staging directory: removable by the next deploy if this one dies
_JOURNAL = ".deploy-moving.json"  # in DIR while a deploy moves its files in: the files it is moving
NO_GAIN = 0.97  # a ReLU graph this close to its original's time (median of the rounds' ratios) gains nothing


@dataclass(frozen=True)
class DeployConfig:
    """``lambda-gelu deploy DIR``'s settings (its options are these fields, with their defaults and help)."""
    original: str | None = field(default=None, metadata=_help(
        "the model DIR was converted from: a directory or an offline model's name (default: the one DIR's "
        "reluize_report.json names)"))
    batch_sizes: tuple[int, ...] = field(default=(1, 32), metadata=_help("batch sizes to time: batch 1 and a serving "
                                                                         "batch"))
    rounds: int = field(default=30, metadata=_help("timed rounds, each running every graph once in turn"))
    sentences: int = field(default=256, metadata=_help("held-out sentences the quality is measured on"))
    max_tokens: int | None = field(default=None, metadata=_help(
        "tokens per sentence at most (default: the conversion's, else 64)"))
    threads: int | None = field(default=None, metadata=_help("ONNX Runtime's threads (default: torch's)"))
    decode_tokens: int = field(default=32, metadata=_help(
        "a causal LM: greedy tokens decoded in torch at batch 1 by its original, the ReLU model and the ReLU model "
        "sparsified (generate, LeanDecoder), timed side by side; 0: not measured"))
    decode_rounds: int = field(default=10, metadata=_help("timed rounds of that decoding"))

    def __post_init__(self):
        whole = _whole
        problems = [
            (isinstance(self.batch_sizes, tuple) and self.batch_sizes and all(whole(b, 1) for b in self.batch_sizes),
             f"--batch-sizes must be whole numbers from 1 to 2^31, got {self.batch_sizes!r}"),
            (whole(self.rounds, 1), f"--rounds must be a whole number from 1 to 2^31, got {self.rounds!r}"),
            (whole(self.sentences, 11), f"--sentences must be a whole number from 11 to 2^31 (each one's 10 nearest "
                                        f"neighbours are compared), got {self.sentences!r}"),
            (self.max_tokens is None or whole(self.max_tokens, 2),
             f"--max-tokens must be a whole number from 2 to 2^31, got {self.max_tokens!r}"),
            (self.threads is None or whole(self.threads, 1), f"--threads must be a whole number from 1 to 2^31, got {self.threads!r}"),
            (whole(self.decode_tokens, 0), f"--decode-tokens must be a whole number from 0 to 2^31, got {self.decode_tokens!r}"),
            (whole(self.decode_rounds, 1), f"--decode-rounds must be a whole number from 1 to 2^31, got {self.decode_rounds!r}")]
        for ok, message in problems:
            if not ok:
                raise CheckpointError(message)


class _Graph(torch.nn.Module):
    """The model as its ONNX graph computes it: the tokenizer's tensors in (and an encoder-decoder's decoder inputs),
    the last hidden state (the decoder's) and the logits, where there is a head, out; no cache."""

    def __init__(self, model, names: list[str], causal: bool):
        super().__init__()
        self.model, self.names, self.causal = model, names, causal

    def forward(self, *inputs):
        out = self.model(**dict(zip(self.names, inputs)), output_hidden_states=True,
                         **({"use_cache": False} if self.causal else {}))
        logits = getattr(out, "logits", None)
        last = hidden_states(out)[-1]
        return (last,) if logits is None else (last, logits)


def deploy_checkpoint(directory: str | os.PathLike, config: DeployConfig | None = None, *, log=print) -> Path:
    """Measure the ReLU checkpoint ``directory`` against its original in ONNX Runtime, fp32 and int8, as the
    module's docstring says; write the report and the ReLU model's graphs into it. Returns the report's path."""
    config = config or DeployConfig()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    for module in ("transformers", "onnx", "onnxruntime"):
        try:
            __import__(module)
        except ImportError:
            raise CheckpointError(f"deploy needs {module}: pip install 'lambda-gelu[hf,deploy]'") from None
    quiet_transformers()
    from . import onnx as onnx_deploy

    target = Path(directory)
    if not target.is_dir():
        raise CheckpointError(f"{directory} is not a directory: give the --out directory of `lambda-gelu reluize`")
    if not (target / "config.json").is_file() and not (target / "modules.json").is_file():
        raise CheckpointError(f"{directory} holds no checkpoint (no config.json): give the --out directory of "
                              "`lambda-gelu reluize`")
    conversion = _conversion_report(target)
    _remove_stale(target, log)
    _check_ours(target)
    _check_writable(target)
    relu = load(model_directory(str(target)), str(directory))
    if not any(isinstance(m, torch.nn.ReLU) for m in relu.model.modules()):
        raise CheckpointError(f"{directory} has no ReLU activation: it is not a converted checkpoint; convert it first "
                              f"(lambda-gelu reluize MODEL --out DIR)")
    name = config.original or _recorded_original(target, conversion)
    try:
        original = load(model_directory(name), name)
    except CheckpointError as e:
        raise CheckpointError(f"the original of {directory}: {e}"
                              + ("" if config.original else " (give --original MODEL)")) from None
    if relu.causal != original.causal or type(relu.model) is not type(original.model):
        raise CheckpointError(f"{directory} ({type(relu.model).__name__}) is not a conversion of {name} "
                              f"({type(original.model).__name__}): give its original with --original")
    if conversion.get("fingerprint") and fingerprint(original.model) != conversion["fingerprint"]:
        raise CheckpointError(f"{name} is not the model {directory} was converted from (its weights differ from the "
                              f"fingerprint {REPORT} keeps): give that model with --original")

    try:
        decoder = decoder_inputs(relu.model)  # an encoder-decoder: one graph of its forward over the sentence
    except CheckpointError as e:
        raise CheckpointError(f"{directory}: {e}") from None
    max_tokens = config.max_tokens or conversion.get("max_tokens") or 64
    sentences = stdlib_sentences()[1][:config.sentences]
    tokenizers = {"ReLU": padding_tokenizer(relu.tokenizer, decoder), "original": padding_tokenizer(
        original.tokenizer, decoder)}

    def encode(batch, kind="ReLU"):
        return teacher_forced(dict(tokenizers[kind](batch, padding=True, truncation=True, max_length=max_tokens,
                                                    return_tensors="pt")), decoder)

    if not torch.equal(encode(sentences[:8])["input_ids"], encode(sentences[:8], "original")["input_ids"]):
        raise CheckpointError(f"{directory} and {name} tokenize text differently: give its original with --original")
    held = [encode(sentences[i:i + 32]) for i in range(0, len(sentences), 32)]
    names = list(held[0])
    threads = config.threads or torch.get_num_threads()

    models = {"original": original.model.float().eval(), "ReLU": relu.model.float().eval()}
    reference = evaluate(models["original"], held, relu.causal)
    zeros = relu_zeros(models["ReLU"], held)
    staging = Path(tempfile.mkdtemp(prefix=".deploy-", dir=target))
    (staging / _MARK).touch()
    scratch = staging / "original"  # the original's graphs, as large as the model: removed with the staging
    try:
        paths = {}
        for kind, model in models.items():
            home = staging if kind == "ReLU" else scratch
            fp32, int8 = home / ONNX_FILES[0], home / ONNX_FILES[1]
            fp32.parent.mkdir(parents=True, exist_ok=True)
            _export(model, names, relu.causal, fp32, trace=encode(sentences[:2]), check=held[0], name=kind)
            onnx_deploy.quantize_dynamic_int8(fp32, int8)
            paths[f"{kind} fp32"], paths[f"{kind} int8"] = fp32, int8
            log(f"{kind}: exported and quantized")
        runners = {g: onnx_deploy.OnnxRunner(paths[g], threads) for g in GRAPHS}
        summaries = {g: _summary(runners[g], held, relu.causal) for g in GRAPHS}
        quality = {g: scores(summaries[g], reference) for g in GRAPHS}
        for kind in ("original", "ReLU"):  # int8 against its own fp32 graph: what the quantization alone costs
            quality[f"{kind} int8"]["cosine_to_fp32"] = scores(summaries[f"{kind} int8"],
                                                               summaries[f"{kind} fp32"])["cosine"]
        latency = {}
        for b in config.batch_sizes:
            feeds = _feeds(encode(_batch_of(sentences, b)))
            times = onnx_deploy.time_interleaved({g: (lambda r=runners[g]: r(feeds)) for g in GRAPHS}, config.rounds)
            latency[str(b)] = {"tokens": int(feeds["input_ids"].shape[1]),
                               **{g: _timing(times[g], times["original fp32"], times[_base(g)]) for g in GRAPHS}}
            log(f"batch {b}: timed")
        del runners
        decoding = None
        if relu.causal and decoder is None and config.decode_tokens:
            prompt = tokenizers["ReLU"](sentences[0], return_tensors="pt", truncation=True,
                                        max_length=max_tokens)["input_ids"]
            decoding = decoding_speed(models["original"], models["ReLU"], prompt, config.decode_tokens,
                                      config.decode_rounds)
            log("decoding in torch: timed")
        report = {"checkpoint": str(directory), "original": name, "causal": relu.causal,
                  "encoder_decoder": decoder is not None, "threads": threads,
                  "max_tokens": max_tokens, "sentences": len(sentences), "rounds": config.rounds,
                  "quantization": "dynamic int8 (ONNX Runtime): int8 weights per output channel, activations "
                                  "quantized per tensor at run time",
                  "onnxruntime": __import__("onnxruntime").__version__, "torch": torch.__version__,
                  "size_mb": {g: os.path.getsize(paths[g]) / 2 ** 20 for g in GRAPHS},
                  "quality": quality, "latency": latency, "zeros": zeros, "decoding": decoding,
                  "files": sorted([*ONNX_FILES, DEPLOY_REPORT, "deploy_report.md"]),
                  "settings": dataclasses.asdict(config)}
        (staging / DEPLOY_REPORT).write_text(json.dumps(report, indent=1) + "\n")
        (staging / "deploy_report.md").write_text(markdown(report))
        _move_in(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target / "deploy_report.md"


def _conversion_report(target: Path) -> dict:
    try:
        report = json.loads((target / REPORT).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{target / REPORT} cannot be read ({e}): restore it, or give --original") from None
    return report if isinstance(report, dict) else {}


def _recorded_original(target: Path, conversion: dict) -> str:
    """The original a conversion's report names, found from any directory: the absolute path it keeps; an offline
    model's name; a relative path (reports before the absolute one) only where a fingerprint can check it."""
    if not conversion.get("model"):
        raise CheckpointError(f"{target} has no {REPORT} naming the model it was converted from: give --original")
    source, model = conversion.get("source") or "", conversion["model"]
    if Path(source).is_absolute():
        return source
    if model.lower() in OFFLINE_MODELS or conversion.get("fingerprint"):
        return model
    raise CheckpointError(f"{target / REPORT} names its original as {model!r}, relative to wherever the conversion ran, "
                          "and keeps no fingerprint to check it by: give the original with --original")


def _remove_stale(target: Path, log) -> None:
    """What a deploy killed part-way left in ``target``: its staging directories (marked as its own) and an
    unfinished move, whose files count as the earlier deploy's (:func:`_check_ours`)."""
    for stale in target.glob(".deploy-*"):
        if stale.is_dir() and not stale.is_symlink() and (stale / _MARK).is_file():
            shutil.rmtree(stale, ignore_errors=True)
            log(f"note: removed {stale.name}, left in {target} by a deploy that did not finish")


def _check_ours(target: Path) -> None:
    """What deploy writes (its reports, ``DIR/onnx``) is replaced only where an earlier deploy wrote it: listed in its
    report, or in the journal of a move a kill interrupted; anything else there is the user's, and named."""
    ours = set(listed_files(target / DEPLOY_REPORT) or []) | set(listed_files(target / _JOURNAL) or [])
    onnx_dir = target / "onnx"
    theirs = [p.relative_to(target).as_posix() for p in onnx_dir.rglob("*") if not p.is_dir()] \
        if onnx_dir.is_dir() else ["onnx"] if onnx_dir.exists() else []
    theirs += [name for name in (DEPLOY_REPORT, "deploy_report.md") if (target / name).exists()]
    extra = [p for p in theirs if p not in ours]
    if extra:
        raise CheckpointError(f"{target} holds {', '.join(extra[:3])}, which no earlier deploy wrote: move them out, "
                              "deploy would replace them")


def _check_writable(target: Path) -> None:
    try:
        Path(tempfile.mkdtemp(prefix=".deploy-", dir=target)).rmdir()
    except OSError as e:
        raise CheckpointError(f"cannot write into {target} ({e.strerror or e}): deploy writes its report and graphs "
                              "there") from None


def _export(model, names, causal, path: Path, trace: dict, check: dict, name: str) -> None:
    """``model`` to ONNX, traced on ``trace`` with the batch and token dimensions left free, then run by ONNX
    Runtime on ``check`` (another batch size and length, with padding) against torch."""
    from .onnx import EXPORT_TOLERANCE, export_mismatch
    graph = _Graph(model, names, causal).eval()
    with torch.no_grad():
        outputs = graph(*trace.values())
    out_names = ["hidden", "logits"][:len(outputs)]
    axes = {k: {0: "batch", 1: "tokens"} for k in names}
    axes["hidden"] = {0: "batch", 1: "tokens"}
    if len(outputs) > 1:
        axes["logits"] = {0: "batch", 1: "tokens"} if outputs[1].dim() == 3 else {0: "batch"}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer notices
            torch.onnx.export(graph, tuple(trace.values()), str(path), input_names=names, output_names=out_names,
                              dynamic_axes=axes, opset_version=17, dynamo=False)
    except Exception as e:  # noqa: BLE001 - torch's exporter on the user's model class: said in one line
        raise CheckpointError(f"torch cannot export the {name} model ({type(model).__name__}) to ONNX "
                              f"({type(e).__name__}: {_first_line(e)}): it cannot be deployed in ONNX Runtime; "
                              "the checkpoint itself is not affected") from None
    with torch.no_grad():
        expected = [o.numpy() for o in graph(*check.values())]
    real = check["attention_mask"].bool().numpy()
    where = [real if e.shape[:2] == real.shape else None for e in expected]
    off = export_mismatch(path, _feeds(check), expected, where)
    if not off <= EXPORT_TOLERANCE:
        raise CheckpointError(f"the ONNX export of the {name} model computes something else than torch ({off:.2g} of "
                              f"the output's scale away, tolerance {EXPORT_TOLERANCE:g}): it cannot be deployed as is")


def _feeds(batch: dict) -> dict:
    return {k: v.numpy() for k, v in batch.items()}


def _summary(runner, held, causal) -> dict:
    """:func:`summarise` of a graph's outputs on the held-out batches, one batch at a time (a causal LM's logits over
    the whole text would not fit in memory at once)."""
    def outputs():
        for b in held:
            o = [torch.from_numpy(a) for a in runner(_feeds(b))]
            yield b, o[0], o[1] if len(o) > 1 else None
    return summarise(outputs(), causal)


def _batch_of(sentences: list[str], size: int) -> list[str]:
    """``size`` held-out sentences of typical length: the ones around the median length."""
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
    start = max(0, min(len(order) - size, len(order) // 2 - size // 2))
    chosen = [sentences[i] for i in order[start:start + size]]
    return (chosen * -(-size // len(chosen)))[:size]


def _base(graph: str) -> str:
    return "original int8" if graph.endswith("int8") else "original fp32"


def _timing(times, fp32, base) -> dict:
    """Median ms, and the medians of the rounds' ratios to the original in fp32 and to the original in the same
    precision (with their quartiles)."""
    ratio = np.asarray(times) / np.asarray(base)
    return {"ms": 1e3 * float(np.median(times)), "vs_original_fp32": float(np.median(np.asarray(times) / fp32)),
            "vs_original_same": float(np.median(ratio)),
            "vs_original_same_quartiles": [float(q) for q in np.quantile(ratio, [0.25, 0.75])]}


def _move_in(staging: Path, target: Path) -> None:
    """Each file of ``staging`` into ``target`` in one rename (the graphs first, the report last), the list of them
    written first to a journal: a deploy killed between two renames leaves files the next one knows as its own."""
    files = [*ONNX_FILES, DEPLOY_REPORT, "deploy_report.md"]
    journal = staging / _JOURNAL
    journal.write_text(json.dumps({"files": files}) + "\n")
    os.replace(journal, target / _JOURNAL)
    (target / "onnx").mkdir(exist_ok=True)
    for rel in files:
        os.replace(staging / rel, target / rel)
    (target / _JOURNAL).unlink()


def markdown(r: dict) -> str:
    q, lat = r["quality"], r["latency"]
    metrics = [("cosine", "cosine", "{:.4f}"), ("top10_overlap", "top-10 overlap", "{:.3f}")]
    if "perplexity_ratio" in q["ReLU fp32"]:
        metrics.append(("perplexity_ratio", "perplexity ÷ original", "{:.3f}"))
    if "agreement" in q["ReLU fp32"]:
        metrics.append(("agreement", "predictions kept", "{:.3f}"))
    sizes = list(lat)
    head = " | ".join([f"batch {b} ms ({lat[b]['tokens']} tokens) | ×" for b in sizes]
                      + ["MB"] + [label for _, label, _ in metrics] + ["int8 vs own fp32 (cosine)"])
    rule = "|".join(["---"] * (2 * len(sizes) + 2 + len(metrics)))
    rows = []
    for g in GRAPHS:
        cells = [f"{lat[b][g]['ms']:.2f} | {lat[b][g]['vs_original_fp32']:.2f}" for b in sizes]
        cells += [f"{r['size_mb'][g]:.1f}"] + [fmt.format(q[g][k]) for k, _, fmt in metrics]
        cells += [f"{q[g]['cosine_to_fp32']:.4f}" if "cosine_to_fp32" in q[g] else "—"]
        rows.append(f"| {g} | " + " | ".join(cells) + " |")
    zeros = r["zeros"]
    mean_zeros = 100 * sum(zeros.values()) / len(zeros)
    verdicts = []
    for b in sizes:
        for precision in ("fp32", "int8"):
            t = lat[b][f"ReLU {precision}"]
            lo, hi = t["vs_original_same_quartiles"]
            verdict = ("faster." if hi < 1 and t["vs_original_same"] < NO_GAIN else
                       "slower." if lo > 1 else "**no measurable gain** in this runtime.")
            verdicts.append(f"- batch {b}, {precision}: the ReLU model takes ×{t['vs_original_same']:.3f} the "
                            f"original's time (quartiles of the rounds' ratios {lo:.3f}–{hi:.3f}): {verdict}")
    no_gain = not all(v.endswith("faster.") for v in verdicts)
    lines = [f"# {r['checkpoint']} in ONNX Runtime", "",
             f"Written by `lambda-gelu deploy {r['checkpoint']}`; do not edit by hand.", "",
             f"The ReLU checkpoint and its original ({r['original']}), exported to ONNX (each export checked against "
             f"torch on another batch shape) and quantized with {r['quantization']}; ONNX Runtime "
             f"{r['onnxruntime']}, {r['threads']} thread{'s' if r['threads'] > 1 else ''}. Latency: the median of "
             f"{r['rounds']} rounds that run each graph once in turn, on held-out sentences of typical length; × is "
             f"the time relative to the original in fp32. Quality against the original in fp32 (torch) on "
             f"{r['sentences']} held-out standard-library docstring sentences (≤ {r['max_tokens']} tokens) never "
             "used in training: mean cosine of the mean-pooled sentence embeddings, the share of each sentence's 10 "
             "nearest neighbours kept"
             + ("; the perplexity ratio" if r["causal"] else "")
             + ("; the predictions kept" if "agreement" in q["ReLU fp32"] else "")
             + "; int8 against its own fp32 graph."
             + (" An encoder-decoder is one graph of its whole forward, the encoder and the decoder over the "
                "sentence (the decoder reading it after its start token, as the conversion measured it): what "
                "generation costs token by token, with a cache, is not measured here" if r.get("encoder_decoder")
                else ""), "",
             f"| graph | {head} |", f"|---|{rule}|", *rows, "",
             "## Does ReLU pay here?", "", *verdicts, "",
             f"The ReLU model's activations are exactly zero for {mean_zeros:.1f}% of the held-out tokens' units "
             f"(from {100 * min(zeros.values()):.1f}% to {100 * max(zeros.values()):.1f}% by layer; each in the "
             f"JSON report). "
             + ("ONNX Runtime's kernels are dense: they multiply the zeros like any other value, so what ReLU "
                "saves in this runtime is at most the cost of the smooth activation itself. The zeros pay where a "
                "kernel skips them: `lambda_gelu.inference.sparse.sparsify_(model)` in torch at small batches "
                + ("(below)" if r.get("decoding") else "(lambda-gelu's docs/performance.md)") + ", or a sparse "
                "runtime."
                if no_gain else "ONNX Runtime's kernels are dense; the gain is what the smooth activation cost."),
             "", f"The ReLU graphs are in `{ONNX_FILES[0]}` and `{ONNX_FILES[1]}`; the numbers in "
             f"`{DEPLOY_REPORT}`."]
    lines += decoding_lines(r["decoding"]) if r.get("decoding") else []
    return "\n".join(lines + [""])
