"""Greedy decoding at batch 1 with the KV cache: a converted (exact-ReLU) language model dense against the same
model with its gated FFNs sparsified (lambda_gelu.sparse.sparsify_).

    lambda-gelu reluize smollm2-135m-instruct --out runs/smollm2-relu
    python benchmarks/bench_decode.py --model runs/smollm2-relu

Reports tokens/s of each (medians of rounds interleaved dense, sparse, dense, ...), whether both generated the same
tokens, the FFN blocks' share of dense decoding time, the gate zeros seen while decoding, the FFN block alone
dense against sparse on the hidden states decoding gave it, and the Amdahl bound those two numbers set on the
whole: 1 / ((1 − share) + share / block speed-up).
"""
from __future__ import annotations

import argparse
import copy
import os
import time

import torch

from _common import header, interleaved, print_table, save


def _mlps(model):
    return [layer.mlp for layer in model.model.layers]


@torch.inference_mode()
def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a checkpoint written by `lambda-gelu reluize` (ReLU gates)")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    from lambda_gelu.hf import stdlib_sentences
    from lambda_gelu.sparse import sparsify_
    from lambda_gelu.sparse_gated import SparseGatedMLP

    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
    dense = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    sparse = copy.deepcopy(dense)
    replaced = sparsify_(sparse)
    prompt = " ".join(stdlib_sentences()[1][:3])  # held-out text
    ids = tokenizer(prompt, return_tensors="pt")

    def generate(model):
        return model.generate(**ids, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                              do_sample=False, use_cache=True)

    same = torch.equal(generate(dense), generate(sparse))
    seconds = interleaved({"dense": lambda: generate(dense), "sparse": lambda: generate(sparse)}, args.rounds, 1)

    # the FFN blocks' share of dense decoding, the gates' zeros, and the blocks' own inputs while decoding
    spent, inputs, zeros, starts = [0.0], [], [0, 0], {}
    hooks = []
    for i, mlp in enumerate(_mlps(dense)):
        def pre(mod, a, i=i):
            starts[i] = time.perf_counter()
            if a[0].shape[1] == 1:  # decoding steps, not the prompt
                inputs.append((i, a[0].clone()))

        def post(mod, a, out, i=i):
            spent[0] += time.perf_counter() - starts[i]
        hooks += [mlp.register_forward_pre_hook(pre), mlp.register_forward_hook(post)]
        def count(mod, a, out):
            if out.shape[1] == 1:  # decoding steps
                zeros[0] += int((out == 0).sum())
                zeros[1] += out.numel()
        hooks.append(mlp.act_fn.register_forward_hook(count))
    t0 = time.perf_counter()
    generate(dense)
    total = time.perf_counter() - t0
    for h in hooks:
        h.remove()
    share = spent[0] / total
    dense_mlps, sparse_mlps = _mlps(dense), _mlps(sparse)
    block = interleaved({"dense": lambda: [dense_mlps[i](x) for i, x in inputs],
                         "sparse": lambda: [sparse_mlps[i](x) for i, x in inputs]}, args.rounds, 1)
    block_speedup = block["dense"] / block["sparse"]
    result = {
        "model": args.model, "new_tokens": args.new_tokens, "prompt_tokens": ids["input_ids"].shape[1],
        "replaced": len(replaced), "same_tokens": same,
        "tokens_per_s": {k: args.new_tokens / v for k, v in seconds.items()},
        "speedup": seconds["dense"] / seconds["sparse"], "mlp_share": share,
        "gate_zeros": zeros[0] / max(zeros[1], 1), "mlp_speedup": block_speedup,
        "amdahl_bound": 1 / ((1 - share) + share / block_speedup), "amdahl_free_mlp": 1 / (1 - share),
        "rounds": args.rounds, "header": header(),
        "relu_gates": sum(isinstance(m, torch.nn.ReLU) for m in dense.modules()),
        "gated_blocks": sum(isinstance(m, SparseGatedMLP) for m in sparse.modules()),
    }
    print(save("decode", result))
    print_table("greedy decoding, batch 1, KV cache", result["header"], [[
        f"{result['tokens_per_s']['dense']:.1f}", f"{result['tokens_per_s']['sparse']:.1f}",
        f"{result['speedup']:.2f}", same, f"{share:.0%}", f"{result['gate_zeros']:.1%}", f"{block_speedup:.2f}",
        f"{result['amdahl_bound']:.2f}"]], ["dense tok/s", "sparse tok/s", "×", "same tokens", "FFN share",
                                            "gate zeros", "FFN ×", "Amdahl bound"])


if __name__ == "__main__":
    main()
