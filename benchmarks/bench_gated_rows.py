"""The sparse gated FFN block at a few rows a call (batched or speculative decoding) against transformers' dense block
and against the same C loop computing every unit, on a converted model's own hidden states.

    python benchmarks/bench_gated_rows.py --model runs/smollm2/budget30-english3-0

A held-out prompt's hidden states at each FFN block's input are cut into calls of R consecutive positions; every
variant runs the same calls over all the blocks in interleaved rounds (cold caches: the blocks' weights do not all fit
in the last-level cache). More rows share fewer zeros: a unit is read if it is active in any row of the call, so the
union of active units grows with R, and the sparse block's edge with it shrinks. Reports per R the union's share of
the units, the median µs a block call of each variant and the speed-ups' middle half over the rounds.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics

import torch

from _common import checkpoint, header, positive_int, print_table, save, speedup_quartiles
from lambda_gelu.timing import time_interleaved


@torch.inference_mode()
def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, type=checkpoint,
                   help="a checkpoint written by `lambda-gelu reluize` (ReLU gates)")
    p.add_argument("--rows", type=positive_int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--calls", type=positive_int, default=24, help="calls of each size per block")
    p.add_argument("--rounds", type=positive_int, default=10)
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    from lambda_gelu.hf import stdlib_sentences
    from lambda_gelu.inference.sparse import sparsify_

    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
    dense = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    sparse, every_unit = copy.deepcopy(dense), copy.deepcopy(dense)
    sparsify_(sparse)
    sparsify_(every_unit)
    blocks = {name: [layer.mlp for layer in model.model.layers]
              for name, model in (("dense", dense), ("sparse", sparse), ("every unit", every_unit))}
    for m in blocks["every unit"]:
        m.sparse = False  # the same C loop over every unit (at most 8 rows; beyond, the dense block)
    states = {}
    hooks = [m.register_forward_pre_hook(lambda mod, a, i=i: states.__setitem__(i, a[0][0].clone()))
             for i, m in enumerate(blocks["dense"])]
    need = max(args.rows) * args.calls + 1
    ids = tokenizer(" ".join(stdlib_sentences()[1][:64]), return_tensors="pt")["input_ids"][:, :need]
    if ids.shape[1] < need:
        p.error(f"the held-out prompt has {ids.shape[1]} tokens, fewer than --calls × the largest --rows + 1")
    dense(ids)
    for h in hooks:
        h.remove()
    results = []
    for rows in args.rows:
        calls = [(i, states[i][1 + c * rows:1 + (c + 1) * rows][None]) for c in range(args.calls)
                 for i in range(len(blocks["dense"]))]
        worst = max(float((blocks["sparse"][i](x) - blocks["dense"][i](x)).abs().max()
                          / blocks["dense"][i](x).abs().max()) for i, x in calls)
        union = statistics.mean(float((blocks["dense"][i].act_fn(blocks["dense"][i].gate_proj(x[0])) != 0).any(0)
                                      .float().mean()) for i, x in calls)
        times = time_interleaved({k: lambda mlps=mlps: [mlps[i](x) for i, x in calls] for k, mlps in blocks.items()},
                                 args.rounds, 1)
        us = {k: 1e6 * statistics.median(v) / len(calls) for k, v in times.items()}
        results.append({"rows": rows, "union_active": union, "us": us, "speedup": us["dense"] / us["sparse"],
                        "speedup_quartiles": speedup_quartiles(times["dense"], times["sparse"]),
                        "every_unit_over_dense": us["dense"] / us["every unit"],
                        "largest_gap": worst})
    result = {"model": args.model, "calls": args.calls, "rounds": args.rounds, "header": header(), "rows": results}
    print(save("gated_rows", result))
    print_table("the sparse gated FFN block at a few rows a call", result["header"], [
        [r["rows"], f"{r['union_active']:.1%}", f"{r['us']['dense']:.0f}", f"{r['us']['sparse']:.0f}",
         f"{r['speedup']:.2f} ({r['speedup_quartiles'][0]:.2f}–{r['speedup_quartiles'][1]:.2f})",
         f"{r['every_unit_over_dense']:.2f}", f"{r['largest_gap']:.1e}"] for r in results],
        ["rows", "union active", "dense µs", "sparse µs", "× dense (middle half)", "every unit × dense",
         "largest gap (relative)"])


if __name__ == "__main__":
    main()
