"""A conversion step of `lambda-gelu reluize` on a causal LM, float32 against bfloat16 (``precision``), and under
bfloat16 what the CLI does beside what it did: the chunked KL against the plain formula, eager attention against
SDPA, and the token embeddings and the output layer frozen (``--embeddings freeze``). The teacher's forward, the
student's forward, the KL and its backward, AdamW's update, timed in rounds interleaved over the variants on the same
batches of the CLI's training text (those of the first pass of its default seed nearest the pass's mean padded
length, as the CLI's plan times its step).

    python benchmarks/bench_distill.py                        # SmolLM2-135M-Instruct, the offline LLM
    python benchmarks/bench_distill.py --model DIR --steps 4

Reports each variant's median seconds a step and its ratio to float32, whether this CPU multiplies bfloat16 natively
(what ``precision="auto"`` asks), and how far the losses of a step lie apart: bfloat16 rounds each product's inputs to
8 significant bits, so the losses differ by rounding, not by a different computation, as do the two KLs' summation
orders and the two attentions'; freezing changes no loss, only which gradients are computed. AdamW runs at lr 0 (the
same work, the weights left as they are): every round times the same model on the same batches.
"""
from __future__ import annotations

import argparse
import copy
import itertools
import os

import torch

from _common import header, interleaved, positive_int, print_table, save

# name, precision, attention (None: the CLI's), plain KL, embeddings frozen
VARIANTS = (("float32", "float32", None, False, False),
            ("bfloat16, SDPA attention, plain KL", "bfloat16", "sdpa", True, False),
            ("bfloat16, SDPA attention", "bfloat16", "sdpa", False, False),
            ("bfloat16", "bfloat16", None, False, False),
            ("bfloat16, embeddings frozen", "bfloat16", None, False, True))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct", help="a causal LM directory, GGUF file or offline name")
    p.add_argument("--steps", type=positive_int, default=3,
                   help="batches, each a timed step of every precision in a round")
    p.add_argument("--rounds", type=positive_int, default=3)
    p.add_argument("--threads", type=positive_int, default=None)
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.threads:
        torch.set_num_threads(args.threads)
    from lambda_gelu.hf import ConversionConfig
    from lambda_gelu.hf.convert import freeze_embeddings_
    from lambda_gelu.hf.load import load, model_directory, quiet_transformers
    from lambda_gelu.hf.text import corpus
    from lambda_gelu.reluize import Reluizer
    from lambda_gelu.hf.attention import attention_of, training_attention_
    from lambda_gelu.reluize.kl import kl_reference
    from lambda_gelu.reluize.losses import LogitsKL
    from lambda_gelu.reluize.precision import autocast_dtype, native_bfloat16

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
    attention = {}
    for name, precision, given, plain, frozen in VARIANTS:
        model = copy.deepcopy(loaded.model)
        if frozen:
            freeze_embeddings_(model)  # as `--embeddings freeze` does
        if given is None:  # as the CLI: eager under bfloat16 on a CPU
            training_attention_(model, autocast_dtype(precision, torch.device("cpu")), torch.device("cpu"))
        else:
            model.set_attn_implementation(given)
        attention[name] = attention_of(model)
        reluizer = Reluizer(model, 10 ** 6, teacher=teacher, precision=precision,
                            loss=LogitsKL(kl_reference) if plain else "logits-kl")
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

    def gap(a, b):  # the largest relative difference of two variants' losses on the same batches
        return max(abs(x - y) / abs(x) for x, y in zip(first[a], first[b]))

    names = [v[0] for v in VARIANTS]
    d = {"header": header(), "model": args.model, "steps": args.steps, "rounds": args.rounds,
         "batch_size": defaults.batch_size, "tokens": tokens, "padded_tokens": padded,
         "native_bfloat16": native_bfloat16(torch.device("cpu")), "seconds": seconds, "attention": attention,
         "speedup": seconds["float32"] / seconds["bfloat16"], "loss_gap": gap("float32", "bfloat16"),
         "kl_loss_gap": gap(names[1], names[2]), "attention_loss_gap": gap(names[2], names[3]),
         "frozen_loss_gap": gap("bfloat16", names[-1]), "mean_padded_length": mean}
    print_table(f"a conversion step of {args.model}: {defaults.batch_size} sentences, {tokens:.0f} tokens "
                f"({padded:.0f} padded)", d["header"],
                [[k, attention[k], f"{v:.2f}", f"{seconds['float32'] / v:.2f}"] for k, v in seconds.items()],
                ["variant", "attention", "s a step", "× float32"])
    print(f"native bfloat16: {d['native_bfloat16']}; the losses of a step differ by at most {d['loss_gap']:.2%} "
          f"between the precisions, {d['kl_loss_gap']:.4%} between the KLs, {d['attention_loss_gap']:.2%} between "
          f"the attentions, {d['frozen_loss_gap']:.2%} with the embeddings frozen")
    print(f"saved {save('distill', d)}")


if __name__ == "__main__":
    main()
