"""A conversion step of `lambda-gelu reluize` on a causal LM, float32 against bfloat16 (``precision``), and bfloat16
with the token embeddings and the output layer frozen (``--embeddings freeze``): the teacher's forward, the student's
forward, the KL and its backward, AdamW's update, timed in rounds interleaved over the variants on the same batches of
the CLI's training text (those of the first pass of its default seed nearest the pass's mean padded length, as the
CLI's plan times its step).

    python benchmarks/bench_distill.py                        # SmolLM2-135M-Instruct, the offline LLM
    python benchmarks/bench_distill.py --model DIR --steps 4

Reports each variant's median seconds a step and its ratio to float32, whether this CPU multiplies bfloat16 natively
(what ``precision="auto"`` asks), and how far the losses of a step lie apart: bfloat16 rounds each product's inputs to
8 significant bits, so the losses differ by rounding, not by a different computation; freezing changes no loss, only
which gradients are computed. AdamW runs at lr 0 (the same work, the weights left as they are): every round times the
same model on the same batches.
"""
from __future__ import annotations

import argparse
import copy
import itertools
import os

import torch

from _common import header, interleaved, print_table, save

VARIANTS = (("float32", "float32", False), ("bfloat16", "bfloat16", False),
            ("bfloat16, embeddings frozen", "bfloat16", True))  # name, precision, embeddings frozen


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct", help="a causal LM directory, GGUF file or offline name")
    p.add_argument("--steps", type=int, default=3, help="batches, each a timed step of every precision in a round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.threads:
        torch.set_num_threads(args.threads)
    from lambda_gelu.hf import ConversionConfig
    from lambda_gelu.hf.convert import freeze_embeddings_
    from lambda_gelu.hf.load import load, model_directory, quiet_transformers
    from lambda_gelu.hf.text import corpus
    from lambda_gelu.reluize import Reluizer
    from lambda_gelu.reluize.precision import native_bfloat16

    quiet_transformers()
    loaded = load(model_directory(args.model), args.model)
    if not loaded.causal:
        p.error(f"{args.model} is not a causal language model: the step measured here is a causal LM's")
    defaults = ConversionConfig()
    text = corpus(loaded.tokenizer, seed=defaults.seed, batch_size=defaults.batch_size,
                  max_tokens=defaults.max_tokens, batching=defaults.batching)
    epoch = list(itertools.islice(text.order(), -(-len(text.train) // defaults.batch_size)))
    padded = [max(text.lengths[j] for j in b) for b in epoch]
    mean = sum(padded) / len(padded)
    typical = sorted(range(len(epoch)), key=lambda i: abs(padded[i] - mean))[:args.steps]
    batches = [text.encode([text.train[j] for j in epoch[i]]) for i in typical]
    teacher = copy.deepcopy(loaded.model).eval().requires_grad_(False)
    steps = {}
    for name, precision, frozen in VARIANTS:
        model = copy.deepcopy(loaded.model)
        if frozen:
            freeze_embeddings_(model)  # as `--embeddings freeze` does
        reluizer = Reluizer(model, 10 ** 6, teacher=teacher, precision=precision)
        optimizer = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=0.0)
        model.eval()
        steps[name] = (reluizer, optimizer)

    losses = {precision: [] for precision in steps}

    def step(precision):
        reluizer, optimizer = steps[precision]
        for batch in batches:
            loss = reluizer.loss(batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses[precision].append(loss.item())

    seconds = interleaved({precision: (lambda precision=precision: step(precision)) for precision in steps},
                          args.rounds, 1)
    seconds = {k: v / len(batches) for k, v in seconds.items()}
    tokens = sum(int(b["attention_mask"].sum()) for b in batches) / len(batches)
    padded = sum(b["input_ids"].numel() for b in batches) / len(batches)
    first = {k: v[:len(batches)] for k, v in losses.items()}
    gap = max(abs(a - b) / abs(a) for a, b in zip(first["float32"], first["bfloat16"]))
    frozen_gap = max(abs(a - b) / abs(a) for a, b in zip(first["bfloat16"], first[VARIANTS[-1][0]]))
    d = {"header": header(), "model": args.model, "steps": args.steps, "rounds": args.rounds,
         "batch_size": defaults.batch_size, "tokens": tokens, "padded_tokens": padded,
         "native_bfloat16": native_bfloat16(torch.device("cpu")), "seconds": seconds,
         "speedup": seconds["float32"] / seconds["bfloat16"], "loss_gap": gap, "frozen_loss_gap": frozen_gap,
         "mean_padded_length": mean}
    print_table(f"a conversion step of {args.model}: {defaults.batch_size} sentences, {tokens:.0f} tokens "
                f"({padded:.0f} padded)", d["header"],
                [[k, f"{v:.2f}", f"{seconds['float32'] / v:.2f}"] for k, v in seconds.items()],
                ["variant", "s a step", "× float32"])
    print(f"native bfloat16: {d['native_bfloat16']}; the losses of a step differ by at most {gap:.2%} between the "
          f"precisions, {frozen_gap:.2%} with the embeddings frozen")
    print(f"saved {save('distill', d)}")


if __name__ == "__main__":
    main()
