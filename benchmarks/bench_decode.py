"""Greedy decoding at batch 1 with the KV cache: a converted (exact-ReLU) language model dense against the same
model with its gated FFNs sparsified (lambda_gelu.inference.sparse.sparsify_), by two decoders: transformers' `generate`, and
lambda_gelu.hf.LeanDecoder (a static cache, a C step per layer, the next token through the output layer's screen).

    lambda-gelu reluize smollm2-135m-instruct --out runs/smollm2-relu
    python benchmarks/bench_decode.py --model runs/smollm2-relu

Reports per decoder the tokens/s of each model (medians of rounds interleaved over the four variants; the speed-up's
middle half over the rounds beside it), whether all four generated the same tokens, the FFN blocks' share of dense
decoding time, the lean decoder's dense model against its torch path (fused=False, screen_head=False, timed in the
same rounds) and the output layer's rows its screened head read, then the gate zeros seen while decoding, the FFN block alone dense against sparse on the hidden
states decoding gave it (and against the same C loop computing every unit: what the skipping itself buys; and
against the sparse block without its gate's int8 screen, which then reads every float32 gate row), and the Amdahl
bound those numbers set on the whole: 1 / ((1 − share) + share / block speed-up). Then the same with the gated FFNs
over int8 weights (sparsify_(model, int8=True)) by the lean decoder, sparse and computing every unit, and what int8
costs: the held-out perplexity against the float32 model's, and the share of greedy tokens that stay the same.
"""
from __future__ import annotations

import argparse
import copy
import os
import re
import statistics
import time

import torch

from _common import checkpoint, header, interleaved, positive_int, print_table, save, speedup_quartiles
from lambda_gelu.timing import time_interleaved


def _mlps(model):
    return [layer.mlp for layer in model.model.layers]


def _ruled_out(mlps, inputs) -> float:
    """The share of (unit, token) the gates' int8 screen rules out on these inputs, decided as the kernel decides."""
    from lambda_gelu.inference.gated import screened_in
    out = total = 0
    for i, x in inputs:
        left = screened_in(mlps[i], x)
        out, total = out + int((~left).sum()), total + left.numel()
    return out / max(total, 1)


@torch.inference_mode()
def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, type=checkpoint,
                   help="a checkpoint written by `lambda-gelu reluize` (ReLU gates)")
    p.add_argument("--new-tokens", type=positive_int, default=64)
    p.add_argument("--rounds", type=positive_int, default=5)
    p.add_argument("--threads", type=positive_int, default=None)
    p.add_argument("--tag", default=None, help="saved as benchmarks/results/decode-TAG.json, a section of its own in "
                   "docs/performance.md (default: decode.json, the conversion reported first)")
    args = p.parse_args()
    if args.tag is not None and not re.fullmatch(r"[A-Za-z0-9_.-]+", args.tag):
        p.error(f"--tag names a results file: letters, digits, '_', '.' and '-' only, got {args.tag!r}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    from lambda_gelu.hf import LeanDecoder, stdlib_sentences
    from lambda_gelu.hf.evaluate import evaluate
    from lambda_gelu.hf.text import padding_tokenizer
    from lambda_gelu.inference.sparse import sparsify_
    from lambda_gelu.inference.gated import SparseGatedMLP

    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
    dense = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    def sparsified(int8=False, skip=True, screen=True):  # a copy with its gated FFNs replaced; skip=False: every
        model = copy.deepcopy(dense)                       # unit computed; screen=False: every gate row read
        sparsify_(model, int8=int8)
        for m in model.modules():
            if isinstance(m, SparseGatedMLP):
                m.sparse, m.screen = skip, screen
        return model

    sparse, every_unit = sparsified(), sparsified(skip=False)
    int8 = {"sparse": sparsified(int8=True), "every unit": sparsified(int8=True, skip=False)}
    prompt = " ".join(stdlib_sentences()[1][:3])  # held-out text
    ids = tokenizer(prompt, return_tensors="pt")
    n = args.new_tokens
    lean = {"dense": LeanDecoder(dense), "sparse": LeanDecoder(sparse),
            "dense, torch path": LeanDecoder(dense, fused=False, screen_head=False),
            **{f"int8 {mode}": LeanDecoder(model) for mode, model in int8.items()}}

    def generate(model):
        return model.generate(**ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, use_cache=True)

    runs = {("generate", "dense"): lambda: generate(dense), ("generate", "sparse"): lambda: generate(sparse),
            ("lean", "dense"): lambda: lean["dense"].generate(ids["input_ids"], n),
            ("lean", "sparse"): lambda: lean["sparse"].generate(ids["input_ids"], n),
            ("lean", "dense, torch path"): lambda: lean["dense, torch path"].generate(ids["input_ids"], n),
            ("lean", "int8 sparse"): lambda: lean["int8 sparse"].generate(ids["input_ids"], n),
            ("lean", "int8 every unit"): lambda: lean["int8 every unit"].generate(ids["input_ids"], n)}
    tokens = {k: run() for k, run in runs.items()}
    same = {path: torch.equal(tokens[path, "dense"], tokens[path, "sparse"]) for path in ("generate", "lean")}
    same_as_generate = all(torch.equal(tokens["lean", m], tokens["generate", "dense"])
                           for m in ("dense", "dense, torch path"))
    times = time_interleaved({f"{p} {m}": run for (p, m), run in runs.items()}, args.rounds, 1)
    seconds = {k: statistics.median(v) for k, v in times.items()}
    head, read = lean["dense"].head, []  # the output layer's rows the screened head reads, token by token
    lean["dense"].head = lambda h: (head(h), read.append(head.rows_read))[0]
    runs["lean", "dense"]()
    lean["dense"].head = head

    # the FFN blocks' share of dense decoding by each decoder, the gates' zeros, and the blocks' own inputs
    spent, inputs, zeros, starts, collect = [0.0], [], [0, 0], {}, [True]
    hooks = []
    for i, mlp in enumerate(_mlps(dense)):
        def pre(mod, a, i=i):
            starts[i] = time.perf_counter()
            if collect[0] and a[0].shape[1] == 1:  # decoding steps, not the prompt (generate's, once)
                inputs.append((i, a[0].clone()))

        def post(mod, a, out, i=i):
            spent[0] += time.perf_counter() - starts[i]
        hooks += [mlp.register_forward_pre_hook(pre), mlp.register_forward_hook(post)]
        def count(mod, a, out):
            if out.shape[1] == 1:  # decoding steps
                zeros[0] += int((out == 0).sum())
                zeros[1] += out.numel()
        hooks.append(mlp.act_fn.register_forward_hook(count))
    share = {}
    for path, run in (("generate", runs["generate", "dense"]), ("lean", runs["lean", "dense"])):
        spent[0], t0 = 0.0, time.perf_counter()
        run()
        share[path] = spent[0] / (time.perf_counter() - t0)
        collect[0] = False
    for h in hooks:
        h.remove()
    blocks = {"dense": _mlps(dense), "sparse": _mlps(sparse), "every unit": _mlps(every_unit),
              "unscreened": _mlps(sparsified(screen=False)),
              **{f"int8 {m}": _mlps(model) for m, model in int8.items()}}
    block = interleaved({k: lambda mlps=mlps: [mlps[i](x) for i, x in inputs] for k, mlps in blocks.items()},
                        args.rounds, 1)
    block_speedup = block["dense"] / block["sparse"]
    ruled_out = _ruled_out(_mlps(sparse), inputs)
    # what int8 costs: the next-token perplexity on held-out text, against the float32 model's
    pad, sentences = padding_tokenizer(tokenizer), stdlib_sentences()[1][:128]
    held = [dict(pad(sentences[i:i + 16], padding=True, truncation=True, max_length=64, return_tensors="pt"))
            for i in range(0, len(sentences), 16)]
    perplexity = {k: evaluate(model, held, causal=True)["perplexity"] for k, model in
                  (("dense", dense), ("int8 sparse", int8["sparse"]))}
    agree = float((tokens["lean", "int8 sparse"] == tokens["lean", "dense"]).float().mean())
    result = {
        "model": args.model, "tag": args.tag, "new_tokens": n, "prompt_tokens": ids["input_ids"].shape[1],
        "rounds": args.rounds, "header": header(),
        "gate_zeros": zeros[0] / max(zeros[1], 1), "mlp_speedup": block_speedup,
        "same_as_generate": same_as_generate,
        "relu_gates": sum(isinstance(m, torch.nn.ReLU) for m in dense.modules()),
        "gated_blocks": sum(isinstance(m, SparseGatedMLP) for m in sparse.modules()),
        "paths": {path: {"tokens_per_s": {m: n / seconds[f"{path} {m}"] for m in ("dense", "sparse")},
                         "speedup": seconds[f"{path} dense"] / seconds[f"{path} sparse"], "same_tokens": same[path],
                         "speedup_quartiles": speedup_quartiles(times[f"{path} dense"], times[f"{path} sparse"]),
                         "mlp_share": share[path],
                         "amdahl_bound": 1 / ((1 - share[path]) + share[path] / block_speedup),
                         "amdahl_free_mlp": 1 / (1 - share[path])} for path in ("generate", "lean")},
        "lean_sparse_over_generate_dense": seconds["generate dense"] / seconds["lean sparse"],
        "lean_over_torch_path": seconds["lean dense, torch path"] / seconds["lean dense"],
        "head_rows_read": {"mean": statistics.mean(read), "max": max(read), "of": head.layer.out_features},
        "block_ms": {k: 1e3 * v / len(inputs) for k, v in block.items()},
        "mlp_over_every_unit": block["every unit"] / block["sparse"],
        "mlp_over_unscreened": block["unscreened"] / block["sparse"], "screen_ruled_out": ruled_out,
        "int8": {"tokens_per_s": {m: n / seconds[f"lean int8 {m}"] for m in ("sparse", "every unit")},
                 "over_lean_dense": seconds["lean dense"] / seconds["lean int8 sparse"],
                 "over_every_unit": seconds["lean int8 every unit"] / seconds["lean int8 sparse"],
                 "block_over_dense": block["dense"] / block["int8 sparse"],
                 "block_over_every_unit": block["int8 every unit"] / block["int8 sparse"],
                 "tokens_agree": agree, "perplexity_ratio": perplexity["int8 sparse"] / perplexity["dense"]},
    }
    print(save(f"decode-{args.tag}" if args.tag else "decode", result))
    print_table("greedy decoding, batch 1, KV cache", result["header"], [[
        path, f"{r['tokens_per_s']['dense']:.1f}", f"{r['tokens_per_s']['sparse']:.1f}",
        f"{r['speedup']:.2f} ({r['speedup_quartiles'][0]:.2f}–{r['speedup_quartiles'][1]:.2f})",
        r["same_tokens"], f"{r['mlp_share']:.0%}", f"{result['gate_zeros']:.1%}", f"{block_speedup:.2f}",
        f"{r['amdahl_bound']:.2f}"] for path, r in result["paths"].items()],
        ["decoder", "dense tok/s", "sparse tok/s", "× (middle half)", "same tokens", "FFN share", "gate zeros", "FFN ×",
         "Amdahl bound"])
    print(f"FFN block: sparse {block_speedup:.2f}× dense, {result['mlp_over_every_unit']:.2f}× the same loop computing "
          f"every unit, {result['mlp_over_unscreened']:.2f}× itself without the gate's screen (which ruled out "
          f"{ruled_out:.1%} of the units)")
    print(f"lean decoder, dense: {result['lean_over_torch_path']:.2f}× its torch path; its head read "
          f"{statistics.mean(read):.1f} of {head.layer.out_features} rows a token (at most {max(read)})")
    q = result["int8"]
    print(f"int8 weights, lean decoder: {q['tokens_per_s']['sparse']:.1f} tokens/s sparse ({q['over_lean_dense']:.2f}× "
          f"float32 dense, {q['over_every_unit']:.2f}× int8 every unit); block {q['block_over_dense']:.2f}× float32 "
          f"dense; perplexity ×{q['perplexity_ratio']:.3f} of float32; {q['tokens_agree']:.0%} tokens the same")


if __name__ == "__main__":
    main()
