"""LeanDecoder on each layout its C step runs, at one small model's sizes: transformers' `generate` against the
decoder's torch path and its C step, greedy at batch 1 with the KV cache.

    python benchmarks/bench_layouts.py

Each family's model is built from its config at SmolLM2-135M's sizes (the Llama row is that model's shape; Gemma 4's
global heads twice as wide, its last third of layers reading earlier layers' keys and values), random weights as
transformers initialises them, ReLU gates, float32. What a decoding step costs beside its weights' products — Python
calls, norms, rotations, the cache — does not depend on the weights, so the ratios hold for a trained model of these
sizes (whose tokens would differ). From the same prompt each decoder generates the same number of new tokens
(no end token), in interleaved rounds. Reports tokens/s, the C step's speed-up over `generate` and over the torch
path with the rounds' middle half, and whether the three gave the same tokens.
"""
from __future__ import annotations

import argparse
import statistics

import torch

from _common import header, positive_int, print_table, save, speedup_quartiles
from lambda_gelu.timing import time_interleaved

SMOLLM2 = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
               num_key_value_heads=3, head_dim=64, vocab_size=49152, max_position_embeddings=2048, hidden_act="relu",
               hidden_activation="relu", pad_token_id=0, bos_token_id=None, eos_token_id=None)
HALVES = ["sliding_attention", "full_attention"] * 15  # local then global layers, where a family alternates them
LAYOUTS = {  # name: (config class, what the family adds)
    "Llama (SmolLM2-135M)": ("LlamaConfig", {}),
    "Qwen3 (per-head query/key norms)": ("Qwen3Config", {}),
    "Gemma 3 (norms around both, local and global layers)": ("Gemma3TextConfig", dict(sliding_window=512,
                                                                                        layer_types=HALVES)),
    "Gemma 4 (values normed, shared caches, per-layer inputs)": ("Gemma4TextConfig", dict(
        global_head_dim=128, sliding_window=512, layer_types=HALVES, num_kv_shared_layers=10,
        hidden_size_per_layer_input=64, vocab_size_per_layer_input=49152)),
    "OLMo 2 (norms after alone, over every head)": ("Olmo2Config", {}),
    "EXAONE 4 (norms after alone, global layers unturned)": ("Exaone4Config", dict(sliding_window=512,
                                                                                   layer_types=HALVES)),
    "HunYuan (per-head norms after the rotation)": ("HunYuanDenseV1Config", {}),
    "Granite (scaled sublayers and logits)": ("GraniteConfig", dict(embedding_multiplier=12.0,
                                                                    residual_multiplier=0.22,
                                                                    attention_multiplier=0.015625,
                                                                    logits_scaling=8.0)),
}


def _model(cls_name: str, more: dict):
    import transformers
    torch.manual_seed(0)
    config = getattr(transformers, cls_name)(**SMOLLM2, **more)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


@torch.inference_mode()
def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    p.add_argument("--new-tokens", type=positive_int, default=32)
    p.add_argument("--rounds", type=positive_int, default=8)
    args = p.parse_args()
    from lambda_gelu.hf import LeanDecoder

    prompt = torch.randint(1, SMOLLM2["vocab_size"], (1, 16), generator=torch.Generator().manual_seed(1))
    n, rows, table = args.new_tokens, [], []
    for name in args.layouts:
        model = _model(*LAYOUTS[name])
        lean, torch_path = LeanDecoder(model, max_length=256), LeanDecoder(model, max_length=256, fused=False)
        assert lean.fused, f"{name}: the C step does not apply"
        runs = {"generate": lambda: model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False),
                "torch path": lambda: torch_path.generate(prompt, n), "C step": lambda: lean.generate(prompt, n)}
        tokens = {k: run() for k, run in runs.items()}
        same = all(torch.equal(t, tokens["generate"]) for t in tokens.values())
        times = time_interleaved(runs, args.rounds, 1)
        median = {k: statistics.median(v) for k, v in times.items()}
        rows.append({"layout": name, "tokens_per_s": {k: n / t for k, t in median.items()}, "same_tokens": same,
                     "over_generate": median["generate"] / median["C step"],
                     "over_generate_quartiles": speedup_quartiles(times["generate"], times["C step"]),
                     "over_torch_path": median["torch path"] / median["C step"],
                     "over_torch_path_quartiles": speedup_quartiles(times["torch path"], times["C step"])})
        r = rows[-1]
        table.append([name, *(f"{r['tokens_per_s'][k]:.1f}" for k in runs), f"{r['over_generate']:.2f}",
                      f"{r['over_torch_path']:.2f}", same])
    head = header()
    print_table("LeanDecoder's C step by layout, SmolLM2-135M's sizes", head, table,
                ["layout", "generate tok/s", "torch path tok/s", "C step tok/s", "× generate", "× torch path",
                 "same tokens"])
    print(save("layouts", {"header": head, "new_tokens": n, "rounds": args.rounds, "rows": rows}))


if __name__ == "__main__":
    main()
