"""A mixture's experts at real models' sizes, decoding one token at a time: transformers' dense experts against
SparseExperts (float32 and int8) at set shares of exact gate zeros.

    python benchmarks/bench_experts.py                  # OLMoE-1B-7B's and Qwen3-30B-A3B's experts, one layer each

One decoder layer's experts module as transformers builds it (its own initialisation, ReLU gates), in float32. Each
call is one token routed to k experts drawn at random, a new token and new experts each call, so that their weights
are not in cache, as when decoding a model whose experts far exceed the last-level cache. The gates' share of exact
zeros is set by one direction v (entries ±1/√H): every gate row less the same multiple of v, each token's x with its
component along v set, which shifts every unit's gate alike (a bias by another name, spread over all inputs so that
no weight stands out of its row, as a bias column would in an int8 row's scale): the sparse experts' time follows how
many units are active, not which. Variants: transformers' experts under its default
implementation (``grouped_mm``) and its ``eager`` loop, SparseExperts, SparseExperts with ``int8=True``; interleaved
rounds. Reports per share the median µs a token, the speed-ups over the default's middle half over the rounds, and the
largest gap of each sparse variant's output to the dense one's, relative to its largest value.
"""
from __future__ import annotations

import argparse
import copy
import statistics

import torch

from _common import header, positive_int, print_table, save, speedup_quartiles
from lambda_gelu.timing import time_interleaved

SIZES = {  # hidden size, expert width, experts, experts a token
    "OLMoE-1B-7B": (2048, 1024, 64, 8),
    "Qwen3-30B-A3B": (2048, 768, 128, 8),
}


def _experts(hidden: int, width: int, experts: int, k: int, implementation: str):
    import transformers
    config = transformers.Qwen3MoeConfig(hidden_size=hidden, moe_intermediate_size=width, num_experts=experts,
                                         num_experts_per_tok=k, hidden_act="relu", num_hidden_layers=1)
    config._experts_implementation = implementation
    module = transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeExperts(config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():  # transformers' initialisation of a linear layer's weight
            p.copy_(torch.randn(p.shape, generator=generator) * config.initializer_range)
    return module.eval()


@torch.inference_mode()
def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(SIZES), choices=list(SIZES))
    p.add_argument("--zeros", type=float, nargs="+", default=[0.5, 0.65, 0.85, 0.95])
    p.add_argument("--tokens", type=positive_int, default=32, help="calls (tokens) a round")
    p.add_argument("--rounds", type=positive_int, default=10)
    args = p.parse_args()
    from lambda_gelu.inference.experts import SparseExperts

    results = []
    for name in args.models:
        hidden, width, n_experts, k = SIZES[name]
        dense = _experts(hidden, width, n_experts, k, "grouped_mm")
        eager = copy.copy(dense)  # the same parameters, transformers' eager loop
        eager.config = copy.copy(dense.config)
        eager.config._experts_implementation = "eager"
        generator = torch.Generator().manual_seed(1)
        direction = torch.randint(0, 2, (hidden,), generator=generator).float().mul(2).sub(1) / hidden ** 0.5
        spread = float(dense.gate_up_proj[:, :width].std()) * hidden ** 0.5  # a gate's spread over x ~ N(0, 1)
        dense.gate_up_proj[:, :width] -= spread * direction  # a shift of spread·(x·v) for every unit
        z = torch.randn(args.tokens, 1, hidden, generator=generator)
        z -= (z @ direction)[..., None] * direction  # x = z + a·v shifts every gate by −spread·a
        index = torch.stack([torch.randperm(n_experts, generator=generator)[:k] for _ in range(args.tokens)])
        weights = torch.softmax(torch.randn(args.tokens, k, generator=generator), -1)
        sparse, int8 = SparseExperts(dense), SparseExperts(dense, int8=True)  # made from the shifted gates
        variants = {"dense": dense, "eager": eager, "sparse": sparse, "sparse int8": int8}
        for zeros in args.zeros:
            x = z + torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor(zeros)).item() * direction
            calls = [(x[t], index[t:t + 1], weights[t:t + 1]) for t in range(args.tokens)]
            outputs = {v: [m(*c) for c in calls] for v, m in variants.items()}
            share = statistics.mean(float((torch.relu(dense.gate_up_proj[int(e), :width] @ xt[0]) == 0).float().mean())
                                    for xt, idx, _ in calls for e in idx[0])
            gaps = {v: max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(outputs[v], outputs["dense"]))
                    for v in ("eager", "sparse", "sparse int8")}
            times = time_interleaved({v: lambda m=m: [m(*c) for c in calls] for v, m in variants.items()},
                                     args.rounds, 1)
            us = {v: 1e6 * statistics.median(t) / len(calls) for v, t in times.items()}
            quartiles = {v: speedup_quartiles(times["dense"], times[v]) for v in ("eager", "sparse", "sparse int8")}
            results.append({"model": name, "sizes": dict(zip(("hidden", "width", "experts", "k"), SIZES[name])),
                            "zeros_set": zeros, "zeros": share, "us": us,
                            "speedup": {v: us["dense"] / us[v] for v in quartiles}, "speedup_quartiles": quartiles,
                            "largest_gap": gaps})
            print(f"{name} at {share:.1%} zeros: " + ", ".join(f"{v} {t:.0f} µs" for v, t in us.items()), flush=True)
        del dense, eager, sparse, int8, variants
    result = {"tokens": args.tokens, "rounds": args.rounds, "header": header(), "rows": results}
    print(save("experts", result))
    title = "a mixture's experts decoding a token: dense (transformers' default) against sparse"
    print_table(title, result["header"], [
        [r["model"], f"{r['zeros']:.1%}", f"{r['us']['dense']:.0f}", f"{r['us']['eager']:.0f}",
         f"{r['us']['sparse']:.0f}", f"{r['us']['sparse int8']:.0f}",
         f"{r['speedup']['sparse']:.2f} ({r['speedup_quartiles']['sparse'][0]:.2f}–"
         f"{r['speedup_quartiles']['sparse'][1]:.2f})",
         f"{r['speedup']['sparse int8']:.2f}", f"{r['largest_gap']['sparse']:.1e}",
         f"{r['largest_gap']['sparse int8']:.1e}"] for r in results],
        ["model", "gate zeros", "dense µs", "eager µs", "sparse µs", "int8 µs", "sparse × dense (middle half)",
         "int8 × dense", "sparse gap", "int8 gap"])


if __name__ == "__main__":
    main()
