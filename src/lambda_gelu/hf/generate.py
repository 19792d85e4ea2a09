"""Text from a converted causal LM by the fast path, with its speed (``lambda-gelu generate DIR "prompt"``).

The checkpoint is loaded as transformers loads it, its FFNs sparsified (:func:`lambda_gelu.inference.sparse.sparsify_`: they
read only the rows of their active gate units; ``int8``: int8 rows with a scale per row; ``int4``: 4-bit rows, the
attention int8) and decoded at batch 1 by
:class:`~lambda_gelu.inference.decoder.LeanDecoder` — greedy, the tokens ``model.generate(..., do_sample=False)`` gives, or
sampled as ``generate`` samples. A layout LeanDecoder does not run decodes by the model's own ``generate`` (said).
The text can be handed on as it is decoded (``stream``: the CLI prints it so), up to the first end token.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..errors import CheckpointError
from ..inference.decoder import LeanDecoder
from ..inference.sparse import sparsify_
from .config import _whole
from .load import load, model_directory, quiet_transformers

__all__ = ["GenerateConfig", "Generated", "generate_text"]


@dataclass(frozen=True)
class GenerateConfig:
    max_new_tokens: int = 64       # tokens decoded at most (fewer where the model's end token comes)
    sample: bool = False           # draw tokens (temperature, top_k, top_p, or the model's settings) instead of greedy
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0                  # torch's generator before the first draw, with sample
    int8: bool = False             # the FFNs and the attention's projections read int8 rows, a scale each (not exact)
    int4: bool = False             # the FFNs read 4-bit rows (blocks of 32), the attention's projections int8 rows
    dense: bool = False            # the FFNs left dense: the reference for the sparse path
    chat: bool = False             # the prompt as a user's turn in the tokenizer's chat template

    def __post_init__(self):
        problems = [
            (_whole(self.max_new_tokens, 1), f"--max-new-tokens must be a whole number from 1 to 2^31, got "
                                             f"{self.max_new_tokens!r}"),
            (self.temperature is None or _real(self.temperature) and self.temperature > 0,
             f"--temperature must be a finite number > 0, got {self.temperature!r}"),
            (self.top_k is None or _whole(self.top_k, 1), f"--top-k must be a whole number ≥ 1, got {self.top_k!r}"),
            (self.top_p is None or _real(self.top_p) and 0 < self.top_p <= 1,
             f"--top-p must be in (0, 1], got {self.top_p!r}"),
            (_whole(self.seed, 0), f"--seed must be a whole number from 0 to 2^31, got {self.seed!r}"),
            (self.sample or (self.temperature, self.top_k, self.top_p) == (None, None, None),
             "--temperature, --top-k and --top-p set how --sample draws: add --sample"),
            (not ((self.int8 or self.int4) and self.dense), "--int8 and --int4 are for the sparse FFNs: leave out "
                                                             "--dense"),
            (not (self.int8 and self.int4), "--int8 or --int4, not both")]
        for ok, message in problems:
            if not ok:
                raise CheckpointError(message)


@dataclass
class Generated:
    text: str                      # the new tokens' text
    new_ids: list[int]
    prompt_tokens: int
    seconds: float                 # the decoding call, the prompt's forward included
    path: str                      # what decoded: "LeanDecoder, sparse FFNs", ...

    def summary(self) -> str:
        rate = len(self.new_ids) / self.seconds if self.seconds > 0 else math.inf
        return (f"{len(self.new_ids)} tokens in {self.seconds:.2f} s: {rate:.1f} tokens/s ({self.path}, "
                f"{torch.get_num_threads()} threads, the {self.prompt_tokens}-token prompt included)")


def generate_text(directory: str, prompt: str, config: GenerateConfig | None = None, *, log=print,
                  stream: Callable[[str], None] | None = None) -> Generated:
    """Decode ``prompt`` with the converted causal LM in ``directory`` as the module's docstring says; ``stream``, if
    given, gets the new text piece by piece as it is decoded (a word at a time, as transformers' ``TextStreamer``
    cuts it), the pieces together the returned ``text``."""
    config = config or GenerateConfig()
    quiet_transformers()
    loaded = load(model_directory(directory), directory, progress=False)
    if not loaded.causal:
        raise CheckpointError(f"{directory} holds a {type(loaded.model).__name__}, not a causal LM: generate decodes "
                              "text from a causal LM")
    model, tokenizer = loaded.model.float().eval(), loaded.tokenizer
    path = "dense FFNs"
    if not config.dense:
        try:
            sparsify_(model, int8=config.int8, int4=config.int4)
        except ValueError as e:
            raise CheckpointError(f"{directory}: {e}; --dense decodes it without the sparse path") from None
        path = ("int8 sparse FFNs and attention" if config.int8 else "4-bit sparse FFNs, int8 attention"
                if config.int4 else "sparse FFNs")
    ids = _encode(tokenizer, prompt, config.chat)
    eos = model.generation_config.eos_token_id
    ends = set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])
    sampling = {"do_sample": True, "temperature": config.temperature, "top_k": config.top_k, "top_p": config.top_p} \
        if config.sample else {}
    streamer = _pieces(tokenizer, ends, stream) if stream is not None else None
    try:
        decoder = LeanDecoder(model, max_length=ids.shape[1] + config.max_new_tokens,
                              int8_attention=config.int8 or config.int4)
        run = lambda: decoder.generate(ids, config.max_new_tokens, next(iter(ends)) if len(ends) == 1 else None,  # noqa: E731
                                       **sampling, streamer=streamer)
        path = f"LeanDecoder, {path}"
    except ValueError as e:
        log(f"note: {e}")
        run = lambda: model.generate(ids, max_new_tokens=config.max_new_tokens, do_sample=config.sample,  # noqa: E731
                                     streamer=streamer,
                                     **{k: v for k, v in sampling.items() if k != "do_sample" and v is not None})
        path = f"generate, {path}"
    torch.manual_seed(config.seed)
    with torch.inference_mode():
        start = time.perf_counter()
        out = run()
        seconds = time.perf_counter() - start
    new = out[0, ids.shape[1]:].tolist()
    cut = next((i + 1 for i, t in enumerate(new) if t in ends), len(new))  # the first end token ends the text
    new = new[:cut]
    return Generated(tokenizer.decode(new, skip_special_tokens=True), new, ids.shape[1], seconds, path)


def _pieces(tokenizer, ends: set[int], write: Callable[[str], None]):
    """A streamer (as ``generate`` and LeanDecoder feed one) that hands the new text to ``write`` a piece at a time,
    up to the first of the ``ends`` token ids: a decoder given several end tokens decodes past them, and its text is
    cut there. Made here, not at import: transformers is imported only when used."""
    from transformers import TextStreamer

    class Pieces(TextStreamer):
        def __init__(self):
            super().__init__(tokenizer, skip_prompt=True, skip_special_tokens=True)
            self.ended = False

        def put(self, value):
            if self.ended:
                return
            if not self.next_tokens_are_prompt:
                self.ended = int(value.reshape(-1)[0]) in ends
            super().put(value)

        def on_finalized_text(self, text: str, stream_end: bool = False):
            if text:
                write(text)

    return Pieces()


def _encode(tokenizer, prompt: str, chat: bool) -> torch.Tensor:
    if not prompt:
        raise CheckpointError("the prompt is empty: give the text to continue")
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise CheckpointError("--chat: the checkpoint's tokenizer has no chat template; leave --chat out")
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            return_tensors="pt")
        return ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
    return tokenizer(prompt, return_tensors="pt")["input_ids"]


def _real(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
