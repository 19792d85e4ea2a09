"""Model level: one training step (forward, backward, AdamW step) with nn.GELU vs λ-GELU.

    python benchmarks/bench_model.py [--threads 2] [--reps 20]

Both models have the same weights; λ-GELU has one λ per layer in its own parameter group.
Writes benchmarks/results/model.json.
"""
from __future__ import annotations

import argparse
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

import lambda_gelu as lg
from _common import header, interleaved, positive_int, print_table, save
from lambda_gelu_lab.models import MLP, Block


def mlp_case(quick):
    batch = 32 if quick else 256
    model = MLP(784, (1024, 1024), 10, nn.GELU)
    x, y = torch.randn(batch, 784), torch.randint(0, 10, (batch,))
    return "MLP 784-1024-1024-10, batch %d" % batch, model, x, y, lambda out, y: F.cross_entropy(out, y)


def transformer_case(quick):
    batch, seq, d = (4, 32, 64) if quick else (32, 128, 256)

    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.Sequential(*[Block(d, 4, 4, nn.GELU) for _ in range(4)])
            self.head = nn.Linear(d, 10)

        def forward(self, x):
            return self.head(self.blocks(x).mean(1))

    x, y = torch.randn(batch, seq, d), torch.randint(0, 10, (batch,))
    return f"transformer 4 blocks d={d} seq={seq} batch={batch}", Stack(), x, y, lambda out, y: F.cross_entropy(out, y)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=positive_int, default=2)
    p.add_argument("--reps", type=positive_int, default=20)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    head = header()
    results = []
    for make in (mlp_case, transformer_case):
        torch.manual_seed(0)
        label, gelu_model, x, y, loss_fn = make(args.quick)
        lam_model = copy.deepcopy(gelu_model)
        lg.convert_to_lambda_gelu_(lam_model)
        opts = {"GELU": torch.optim.AdamW(gelu_model.parameters(), lr=1e-4),
                "λ-GELU": torch.optim.AdamW(lg.lambda_param_groups(lam_model, lr=1e-4))}
        models = {"GELU": gelu_model, "λ-GELU": lam_model}

        def step(name):
            opts[name].zero_grad(set_to_none=True)
            loss_fn(models[name](x), y).backward()
            opts[name].step()
        t = interleaved({n: (lambda n=n: step(n)) for n in models}, 3 if args.quick else args.reps, warmup=3)
        results.append({"model": label, "gelu_ms": 1e3 * t["GELU"], "lambda_ms": 1e3 * t["λ-GELU"],
                        "ratio": t["λ-GELU"] / t["GELU"]})
    rows = [[r["model"], f"{r['gelu_ms']:.1f}", f"{r['lambda_ms']:.1f}", f"{r['ratio']:.3f}"] for r in results]
    print_table("training step, λ-GELU vs GELU (medians of interleaved reps)", head, rows,
                ["model", "GELU ms", "λ-GELU ms", "ratio"])
    if not args.quick:
        print(save("model", {"header": head, "reps": args.reps, "results": results}))


if __name__ == "__main__":
    main()
