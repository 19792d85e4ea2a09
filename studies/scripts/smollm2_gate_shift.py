"""Why the gate threshold (``--gate-zeros``) shifts every gate by one amount: on SmolLM2-135M converted by the CLI's
defaults, before any training, ReLU gates ``relu(gate(x) − θ)`` at a given share of zeros, with θ one number for
every unit of every layer against θ per layer (each layer zero on that share) and θ per unit (each unit zero on that
share of the calibration tokens). Writes
studies/smollm2_gate_shift.md.

    python studies/scripts/smollm2_gate_shift.py --model runs/smollm2/default-0     # ≈ 10 minutes on 2 cores

Calibration: 256 training sentences; measured on 128 held-out sentences (perplexity against the original's, exact
zeros of the gates on real tokens, averaged over the layers).
"""
from __future__ import annotations

import argparse
import random
from pathlib import Path

import torch

from lambda_gelu.hf.evaluate import evaluate, relu_zeros
from lambda_gelu.hf.load import load, model_directory, quiet_transformers
from lambda_gelu.hf.text import padding_tokenizer, stdlib_sentences


class Shifted(torch.nn.ReLU):
    """relu(x − θ), θ a number or one per unit (a ReLU module, whose exact zeros relu_zeros counts)."""

    def __init__(self):
        super().__init__()
        self.theta = torch.tensor(0.0)

    def forward(self, x):
        return torch.relu(x - self.theta)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="runs/smollm2/default-0", help="a converted SmolLM2 checkpoint")
    parser.add_argument("--shares", type=float, nargs="+", default=[0.75, 0.85])
    parser.add_argument("--output", default="studies/smollm2_gate_shift.md")
    args = parser.parse_args()
    quiet_transformers()
    torch.manual_seed(0)
    original = load(model_directory("smollm2-135m-instruct"), "smollm2-135m-instruct")
    model = load(Path(args.model), args.model).model
    pad = padding_tokenizer(original.tokenizer)
    train, held = stdlib_sentences()
    random.Random(0).shuffle(train)

    def batches(sentences):
        return [dict(pad(sentences[i:i + 64], padding=True, truncation=True, max_length=64, return_tensors="pt"))
                for i in range(0, len(sentences), 64)]
    calibration, held = batches(train[:256]), batches(held[:128])
    reference = evaluate(original.model, held, True)["perplexity"]
    mlps = [layer.mlp for layer in model.model.layers]
    acts = [Shifted() for _ in mlps]
    for mlp, act in zip(mlps, acts):
        mlp.act_fn = act
    seen: dict[int, list[torch.Tensor]] = {i: [] for i in range(len(mlps))}
    hooks = [mlp.gate_proj.register_forward_hook(lambda m, a, out, i=i: seen[i].append(
        out[b["attention_mask"].bool()].detach())) for i, mlp in enumerate(mlps)]
    with torch.no_grad():
        for b in calibration:
            model(**b)
    for h in hooks:
        h.remove()
    gates = [torch.cat(v) for v in seen.values()]  # (calibration tokens, units) per layer
    sample = torch.cat([g.flatten()[torch.randperm(g.numel())[:200_000]] for g in gates])

    def measure(thetas):
        for act, theta in zip(acts, thetas):
            act.theta = theta
        zeros = relu_zeros(model, held)
        return sum(zeros.values()) / len(zeros), evaluate(model, held, True)["perplexity"] / reference

    rows = [("none (the checkpoint)", *measure([torch.tensor(0.0)] * len(acts)))]
    for share in args.shares:
        shift = torch.quantile(sample, share)
        rows.append((f"one θ = {float(shift):.3f} for every unit, aiming at {share:.0%}",
                     *measure([shift] * len(acts))))
        per_layer = [torch.quantile(g.flatten()[torch.randperm(g.numel())[:200_000]], share) for g in gates]
        rows.append((f"θ per layer, each at {share:.0%}", *measure(per_layer)))
        per_unit = [torch.quantile(g, share, dim=0) for g in gates]
        rows.append((f"θ per unit, each at {share:.0%}", *measure(per_unit)))
    lines = ["# SmolLM2-135M: one gate shift for every unit against one per layer or per unit", "",
             f"`python studies/scripts/smollm2_gate_shift.py --model {args.model}`", "",
             f"The checkpoint `{args.model}` (converted to exact ReLU by the CLI's defaults), its gates made "
             "relu(gate(x) − θ) with no training after: θ one number for every unit of every layer (the quantile "
             "of the gates' pre-activations over 256 training sentences, pooled over the layers) against θ per layer "
             "(each layer's own quantile) and θ per unit "
             "(each unit's own quantile, so that every unit is zero on that share of the calibration tokens). "
             "Measured on 128 held-out sentences: exact gate zeros on real tokens averaged over the layers, and the "
             "perplexity against the original model's.", "",
             "| gates | exact zeros | perplexity ÷ original |", "|---|---|---|"]
    lines += [f"| {name} | {100 * z:.1f}% | {p:.3g} |" for name, z, p in rows]
    triples = list(zip(rows[1::3], rows[2::3], rows[3::3]))
    cheapest = sum(one[2] < min(layer[2], unit[2]) for one, layer, unit in triples)
    lines += ["", f"Reading: the one shift costs the least perplexity at {cheapest} of the {len(triples)} shares. A "
              "threshold per unit silences the units that fire often as much as the rare ones; one per layer makes "
              "every layer equally sparse, where the one shift lets the layers whose gates sit lower take more of "
              "the zeros. `--gate-zeros` lowers one shift for every gate and lets the distillation repair its cost "
              "([smollm2_sparsity.md](smollm2_sparsity.md)).", ""]
    Path(args.output).write_text("\n".join(lines), encoding="utf-8")
    print(args.output)


if __name__ == "__main__":
    main()
