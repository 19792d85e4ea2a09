"""What a converted causal LM gains when it decodes in torch at batch 1 (``lambda-gelu deploy``'s decoding section).

ONNX Runtime's kernels are dense, so there the exact zeros buy nothing; in torch they do. From one held-out prompt,
greedy tokens are decoded by the original's ``generate``, the ReLU model's, and the ReLU model with its FFNs
sparsified (:func:`~lambda_gelu.inference.sparse.sparsify_`, its defaults) by ``generate`` and by
:class:`~lambda_gelu.inference.decoder.LeanDecoder` — each a fixed number of tokens (no end token), timed in interleaved
rounds so that ratios hold where the machine's speed drifts — and the ReLU decoders' tokens are compared: sparsified,
they are the dense model's. What cannot run (a layout LeanDecoder refuses, layers too small for ``sparsify_``) is
said, not timed.
"""
from __future__ import annotations

import copy
import statistics

import torch

from ..inference.decoder import LeanDecoder
from ..inference.sparse import sparsify_
from ..timing import time_interleaved

__all__ = ["decoding_speed", "markdown_lines", "DECODERS"]

DECODERS = ("original, generate", "ReLU, generate", "ReLU sparsified, generate", "ReLU sparsified, LeanDecoder")


def decoding_speed(original, relu, input_ids: torch.Tensor, new_tokens: int, rounds: int) -> dict:
    """Tokens/s of each of :data:`DECODERS` that runs here (median over ``rounds``), its speed-up over the original's
    ``generate`` (the median of the rounds' ratios), whether a ReLU decoder gave the dense ReLU model's tokens, and
    notes on what did not run. ``input_ids``: the prompt, (1, T)."""
    shared = {id(t): t for t in (*relu.parameters(), *relu.buffers())}  # its modules copied, its weights shared
    sparse, notes = copy.deepcopy(relu, memo=shared), []
    try:
        replaced = sparsify_(sparse)
    except ValueError as e:  # gated FFNs it cannot take, said by name
        replaced, notes = [], [f"{e}: nothing sparse to time"]
    calls = {DECODERS[0]: _generate(original, input_ids, new_tokens),
             DECODERS[1]: _generate(relu, input_ids, new_tokens)}
    if replaced:
        calls[DECODERS[2]] = _generate(sparse, input_ids, new_tokens)
        try:
            lean = LeanDecoder(sparse, max_length=input_ids.shape[1] + new_tokens)
        except ValueError as e:
            notes.append(str(e))
        else:
            calls[DECODERS[3]] = lambda: lean.generate(input_ids, new_tokens)
    elif not notes:
        notes.append("sparsify_ found no layer fed by a ReLU that it takes: nothing sparse to time")
    with torch.inference_mode():
        tokens = {name: call() for name, call in calls.items()}  # also the untimed round
        times = time_interleaved(calls, rounds, warmup=0)
    base = times[DECODERS[0]]
    return {"prompt_tokens": int(input_ids.shape[1]), "new_tokens": new_tokens, "rounds": rounds,
            "replaced": len(replaced), "notes": notes,
            "decoders": {name: {"tokens_per_s": new_tokens / statistics.median(t),
                                "speedup": statistics.median(b / x for b, x in zip(base, t)),
                                "same_tokens": None if name == DECODERS[0] else bool(
                                    torch.equal(tokens[name], tokens[DECODERS[1]]))}
                         for name, t in times.items()}}


def _generate(model, input_ids: torch.Tensor, new_tokens: int):
    """``model.generate`` greedy for exactly ``new_tokens`` tokens, as LeanDecoder decodes them (no end token)."""
    config = copy.deepcopy(model.generation_config)
    config.update(max_new_tokens=new_tokens, min_new_tokens=None, do_sample=False, eos_token_id=None,
                  pad_token_id=config.pad_token_id if config.pad_token_id is not None else 0)
    mask = torch.ones_like(input_ids)
    return lambda: model.generate(input_ids, attention_mask=mask, generation_config=config)


def markdown_lines(r: dict) -> list[str]:
    """The report's section for :func:`decoding_speed`'s result ``r``."""
    lines = ["", "## Decoding in torch at batch 1", "",
             f"Greedy, {r['new_tokens']} new tokens after a held-out prompt of {r['prompt_tokens']}, no end token; "
             f"medians of {r['rounds']} round{'s' if r['rounds'] > 1 else ''} that run every decoder once in turn. "
             f"`sparsify_` replaced {r['replaced']} layer{'s' if r['replaced'] != 1 else ''}.", "",
             "| decoder | tokens/s | × the original's `generate` | the dense ReLU model's tokens |",
             "|---|---|---|---|"]
    lines += [f"| {name} | {d['tokens_per_s']:.1f} | {d['speedup']:.2f} | "
              f"{'—' if d['same_tokens'] is None else 'yes' if d['same_tokens'] else 'no'} |"
              for name, d in r["decoders"].items()]
    for note in r["notes"]:
        lines += ["", note]
    return lines
