"""The text a conversion trains and measures on: English every machine has (the sentences of the standard
library's docstrings), the user's own files, the further held-out sets it is measured on at the end (Python's
reference documentation, the user's held-out lines), and the batchings of it."""
from __future__ import annotations

import ast
import functools
import hashlib
import itertools
import random
import re
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import CheckpointError

__all__ = ["stdlib_sentences", "prose_sentences", "reference_sentences", "unseen_prose", "held_out_sets", "read_texts",
           "length_grouped", "in_order", "padding_tokenizer", "teacher_forced", "decoder_inputs", "Corpus", "corpus",
           "GROUP", "HELD_OUT", "EVAL_LINES"]

GROUP = 50  # batches' worth of sentences sorted together by length (the "length" batching)
HELD_OUT, HELD_BATCH = 256, 64  # the held-out sentences a conversion is measured on, and how many a batch
EVAL_LINES = 1024  # the most of the user's held-out lines measured, taken evenly over them
NEIGHBOURS = 10  # a set's sentences are compared by their 10 nearest neighbours: it needs more than that
LINE_CHARS = 1 << 14  # a line of the user's text is cut here: sentences are cut at --max-tokens tokens anyway
TEXT_CHARS, TEXT_LINES = 1 << 28, 1 << 21  # the most a --text or --eval-text file holds: 256 Mi characters, 2 Mi lines


def stdlib_sentences(held_out: float = 0.1) -> tuple[list[str], list[str]]:
    """English text that every machine has: the sentences of the standard library's docstrings.

    Every ``*.py`` file of the stdlib (site-packages excluded) is parsed, not imported; the docstrings
    of its module, classes and functions are cut into sentences, and those of 6 to 60 words that are
    prose (mostly letters) are kept, each once. Files are split by a hash of their relative path, so
    the ``held_out`` share of files gives sentences never seen in training. Returns (train, held-out), new lists
    on every call (the parse, seconds long, is done once per process).
    """
    train, held = _stdlib_sentences(held_out)
    return list(train), list(held)


@functools.lru_cache(maxsize=4)
def _stdlib_sentences(held_out: float) -> tuple[tuple[str, ...], tuple[str, ...]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and "dist-packages" not in p.parts
                   and "test" not in p.parts and "tests" not in p.parts)
    if not files:
        raise CheckpointError(f"no standard-library sources under {root}")
    seen: set[str] = set()
    train, held = [], []
    for p in files:
        try:
            tree = ast.parse(p.read_bytes())
        except (SyntaxError, ValueError):
            continue
        rel = p.relative_to(root).as_posix()
        out = held if int(hashlib.sha1(rel.encode()).hexdigest(), 16) % 1000 < held_out * 1000 else train
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for s in prose_sentences(ast.get_docstring(node) or ""):
                if s not in seen:
                    seen.add(s)
                    out.append(s)
    return tuple(train), tuple(held)


_CUT = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")  # a sentence ends where the next one starts with a capital


def prose_sentences(text: str) -> list[str]:
    """The sentences of ``text``'s paragraphs (split at blank lines, white space folded) that are prose: 6 to 60
    words, at least 85% letters and spaces."""
    out = []
    for para in text.split("\n\n"):
        for s in _CUT.split(" ".join(para.split())):
            if 6 <= len(s.split()) <= 60 and sum(c.isalpha() or c == " " for c in s) >= 0.85 * len(s):
                out.append(s)
    return out


def evenly(items: list, n: int) -> list:
    """At most ``n`` of ``items``, every (len // n)-th from the first (all of them if there are no more)."""
    step = max(1, len(items) // n)
    return items[::step][:n]


def reference_sentences(trained=frozenset(), n: int = HELD_OUT) -> list[str]:
    """Prose of another kind than the docstrings, on every machine: the sentences of Python's language reference
    (the standard library's ``pydoc_data`` topics, which are not docstrings, so never trained on), less any in
    ``trained``, ``n`` of them taken evenly over the topics in order; none where the stdlib has no pydoc_data."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        return []
    return unseen_prose((topics[k] for k in sorted(topics)), trained, n)


def unseen_prose(texts, trained=frozenset(), n: int = HELD_OUT) -> list[str]:
    """The distinct prose sentences (:func:`prose_sentences`) of ``texts`` that are not in ``trained``, ``n`` of them
    taken evenly (:func:`evenly`): a held-out set cut from any text by the rule the training text is cut by."""
    return evenly(list(dict.fromkeys(s for t in texts for s in prose_sentences(t) if s not in trained)), n)


def held_out_sets(train: list[str], eval_lines: list[str] = (), files=()) -> dict[str, dict]:
    """The further held-out sets a conversion is measured on once it ends, beside its held-out docstrings:
    {name: {"sentences": [...], "source": what they are}}. *Python reference docs* (:func:`reference_sentences`),
    and where the user gave ``eval_lines`` (read from ``files`` by :func:`read_texts`) *your held-out text*: at most
    :data:`EVAL_LINES` of them, taken evenly, less any line the conversion trains on (``train``), which the source
    counts. Raises a :class:`CheckpointError` where too few of the user's lines are left to compare."""
    trained = set(train)
    sets = {}
    reference = reference_sentences(trained)
    if len(reference) > NEIGHBOURS:
        sets["Python reference docs"] = {"sentences": reference, "source": f"{len(reference)} sentences of Python's "
                                         "language reference (the standard library's pydoc_data topics)"}
    if eval_lines:
        named = " ".join(map(str, files))
        unique = list(dict.fromkeys(eval_lines))
        fresh = [s for s in unique if s not in trained]
        if len(fresh) <= NEIGHBOURS:
            raise CheckpointError(f"--eval-text {named}: {len(fresh)} of its {len(unique)} distinct lines "
                                  f"are not training text; measuring needs at least {NEIGHBOURS + 1}: give more lines")
        kept = evenly(fresh, EVAL_LINES)
        notes = ([f"taken evenly from {len(fresh)}"] if len(kept) < len(fresh) else []) + (
            [f"{len(unique) - len(fresh)} left out: the conversion trains on them"] if len(fresh) < len(unique) else [])
        sets["your held-out text"] = {"sentences": kept, "source": f"{len(kept)} distinct lines of --eval-text "
                                      f"{named}" + (f" ({'; '.join(notes)})" if notes else "")}
    return sets


def read_texts(files: list[str], option: str = "--text") -> list[str]:
    """The non-empty lines of the user's UTF-8 text files, white space folded, each cut at LINE_CHARS characters
    (``option``: what the error names). Read a line at a time within TEXT_CHARS and TEXT_LINES, so an endless or
    binary file (a device, a NUL byte) ends in one CheckpointError, never in memory without bound."""
    lines = []
    for name in files:
        found, read = [], 0
        try:
            with open(name, encoding="utf-8") as f:
                while line := f.readline(LINE_CHARS):
                    read, binary, tail = read + len(line), "\x00" in line, line
                    while not tail.endswith("\n") and not binary and read <= TEXT_CHARS and (
                            tail := f.readline(LINE_CHARS)):  # the rest of a line cut at LINE_CHARS: passed over
                        read, binary = read + len(tail), "\x00" in tail
                    if binary or read > TEXT_CHARS:
                        raise CheckpointError(f"{option} {name}: " + ("a NUL character: not a text file" if binary
                                                                      else f"more than {TEXT_CHARS:,} characters"))
                    if line.strip():
                        found.append(" ".join(line.split()))
                        if len(found) > TEXT_LINES:
                            raise CheckpointError(f"{option} {name}: more than {TEXT_LINES:,} lines of text")
        except (OSError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{option} {name}: cannot read it as UTF-8 text ({e})") from None
        if not found:
            raise CheckpointError(f"{option} {name} has no text (every line is empty)")
        lines += found
    return lines


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


def padding_tokenizer(tokenizer, decoder=None):
    """``tokenizer``, or a copy of it that pads with its end-of-text token where it has no padding token (GPT-2 and
    others), and on the right for an encoder-decoder (``decoder``, :func:`decoder_inputs`' answer: its shift needs
    it): batching needs one, and the tokenizer a checkpoint is saved with keeps its own."""
    right = decoder is not None and tokenizer.padding_side != "right"
    if tokenizer.pad_token is not None and not right:
        return tokenizer
    import copy
    pad = copy.copy(tokenizer)
    if pad.pad_token is None:
        pad.pad_token = pad.eos_token
    if right:
        pad.padding_side = "right"
    return pad


def token_lengths(tokenizer, sentences: list[str], max_tokens: int) -> list[int]:
    """Each sentence's length in tokens, cut at ``max_tokens`` as its batch will cut it."""
    return [len(ids) for ids in tokenizer(sentences, truncation=True, max_length=max_tokens)["input_ids"]]


def teacher_forced(batch: dict, decoder) -> dict:
    """``batch`` with, for an encoder-decoder (``decoder``: :func:`decoder_inputs`' answer; None: not one), the
    decoder's inputs: the sentence itself shifted right after the decoder's first token, as ``labels=input_ids``
    would make them and as BART's pretraining reconstructs its input. With right padding the decoder's real positions
    are then the encoder's, so ``decoder_attention_mask`` is the ``attention_mask``, and everything that masks
    positions by the attention mask (the losses, the refit, the zeros counted) masks the decoder's alike."""
    if decoder is None:
        return batch
    ids, mask = batch["input_ids"], batch["attention_mask"]
    if not bool(mask[:, 0].all()):  # left padding: the shift would move a sentence's first token out of its mask
        raise ValueError("teacher_forced: the batch is padded on the left; an encoder-decoder's must be on the right")
    return {**batch, "decoder_input_ids": decoder(ids), "decoder_attention_mask": mask}


def decoder_inputs(model):
    """For an encoder-decoder, what makes its decoder's inputs from a batch's ``input_ids`` (None for a model that is
    not one): the model's own shift where it has one (``prepare_decoder_input_ids_from_labels``, as a generation
    head's training does; T5's ``_shift_right``), else the sentence after its config's ``decoder_start_token_id``
    (or its generation config's). Raises a :class:`CheckpointError` where none of these makes them."""
    if not getattr(model.config, "is_encoder_decoder", False):
        return None
    own = getattr(model, "prepare_decoder_input_ids_from_labels", None)
    shift = (lambda ids: own(labels=ids)) if own is not None else getattr(model, "_shift_right", None)
    if shift is None:
        start = next((s for c in (model.config, getattr(model, "generation_config", None))
                      if isinstance(s := getattr(c, "decoder_start_token_id", None), int)), None)
        shift = None if start is None else functools.partial(_shift_right, start=start)
    try:
        pad = getattr(model.config, "pad_token_id", None)
        probe = torch.arange(1, 7).view(2, 3) + (pad if isinstance(pad, int) else 0)  # two sentences, no padding
        made = shift(probe) if shift is not None else None
    except Exception:  # noqa: BLE001 - the model's own shift, which raises where its config lacks the start token
        made = None
    if made is None or made.shape != probe.shape:
        raise CheckpointError(f"{type(model).__name__} is an encoder-decoder whose config names no "
                              "decoder_start_token_id, the token its decoder starts from: set it in config.json")
    return shift


def _shift_right(ids: torch.Tensor, start: int) -> torch.Tensor:
    return torch.cat([ids.new_full((len(ids), 1), start), ids[:, :-1]], 1)


@dataclass(frozen=True)
class Corpus:
    """A conversion's text and its batches: ``train`` (the user's lines, then the standard library's training
    sentences shuffled by ``seed``), ``held`` (the first :data:`HELD_OUT` held-out sentences), each sentence's
    length in tokens, and how both become padded batches of at most ``max_tokens`` tokens (with an encoder-decoder's
    decoder inputs, made by ``decoder``: :func:`teacher_forced`)."""
    train: list[str]
    held: list[str]
    lengths: list[int]
    tokenizer: object  # one that pads (:func:`padding_tokenizer`)
    max_tokens: int
    batch_size: int
    batching: str  # "length" (:func:`length_grouped`) or "shuffled" (:func:`in_order`)
    seed: int
    decoder: Callable[[torch.Tensor], torch.Tensor] | None = None  # an encoder-decoder's shift (decoder_inputs)

    def encode(self, sentences: list[str]) -> dict:
        return teacher_forced(dict(self.tokenizer(sentences, padding=True, truncation=True,
                                                  max_length=self.max_tokens, return_tensors="pt")),
                              self.decoder)

    def order(self):
        """A fresh copy of the training batches' order, as lists of sentence indices: the same on every call."""
        if self.batching == "length":
            return length_grouped(self.lengths, self.batch_size, self.seed)
        return in_order(len(self.train), self.batch_size)

    def batches(self, steps: int):
        """The first ``steps`` training batches, encoded as they are drawn."""
        return (self.encode([self.train[j] for j in b]) for b in itertools.islice(self.order(), steps))

    def held_batches(self, sentences: list[str] | None = None) -> list[dict]:
        """The held-out sentences (or ``sentences``) in encoded batches of :data:`HELD_BATCH`, taken in order of
        length (shortest first, ties in order) so that a batch is little padding: every measure is a sum or a mean
        over sentences or tokens, which the order leaves as it is."""
        sentences = self.held if sentences is None else sentences
        lengths = token_lengths(self.tokenizer, sentences, self.max_tokens)
        ordered = [sentences[i] for i in sorted(range(len(sentences)), key=lengths.__getitem__)]
        return [self.encode(ordered[i:i + HELD_BATCH]) for i in range(0, len(ordered), HELD_BATCH)]


def corpus(tokenizer, *, seed: int, batch_size: int, max_tokens: int, batching: str = "length",
           extra: list[str] = (), decoder=None) -> Corpus:
    """The text ``lambda-gelu reluize`` trains and measures on, for ``tokenizer``, with the user's lines ``extra``
    (:func:`read_texts`) first: a script that needs the CLI's batches calls this with the settings of its report
    (``decoder``: an encoder-decoder's shift, :func:`decoder_inputs`)."""
    train, held = stdlib_sentences()
    random.Random(seed).shuffle(train)
    train = list(extra) + train
    pad = padding_tokenizer(tokenizer, decoder)
    lengths = token_lengths(pad, train, max_tokens)
    return Corpus(train, held[:HELD_OUT], lengths, pad, max_tokens, batch_size, batching, seed, decoder)
