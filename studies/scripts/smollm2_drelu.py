"""dReLU (TurboSparse: ReLU on the gated FFN's ``up`` as well as on its gate) against the plain swap, on
SmolLM2-135M-Instruct at equal steps. Writes studies/smollm2_drelu.md.

    python studies/scripts/smollm2_drelu.py        # ≈ 35 minutes on 2 cores; needs runs/smollm2/swap-0

The plain swap is ``runs/smollm2/swap-0`` (studies/scripts/smollm2_recipes.sh: the CLI's swap with no refit, seed 0). The
dReLU run here takes the same path — the same training sentences in the same length batches, the same steps, learning
rate and seed, KL distillation from the frozen original — with ``down(relu(gate(x)) * relu(up(x)))`` in every layer.
Both are measured on the CLI's 256 held-out sentences: perplexity against the original's, and on real tokens the
exact zeros of the gate, of ``up`` and of what ``down`` reads (zero wherever either is: the columns of ``down`` a
sparse kernel skips), averaged over the layers.

Why it is measured here and not offered by ``lambda-gelu reluize``: no transformers architecture applies an
activation to ``up``, so a dReLU checkpoint would load only through code of its own (TurboSparse's models carry
remote code), and the CLI writes only checkpoints that plain transformers loads as the converted network.
"""
from __future__ import annotations

import argparse
import copy
import json
import warnings
from pathlib import Path

import torch
import torch.nn as nn

from lambda_gelu.hf import corpus, load, model_directory
from lambda_gelu.core.zeros import exact_zeros
from lambda_gelu.hf.evaluate import evaluate, scores
from lambda_gelu.hf.load import quiet_transformers
from lambda_gelu.reluize import reluize


def zeros(model, batches) -> dict[str, float]:
    """Exact zeros on real tokens, averaged over the layers: the gate's output, up's (after its ReLU, if any) and
    down's input."""
    counted = exact_zeros(model, batches, [site for layer in model.model.layers for site in (
        ("gate", layer.mlp.act_fn, "output"), ("up", layer.mlp.up_proj, "output"),
        ("down", layer.mlp.down_proj, "input"))])
    return {key: site["zero_fraction"] for key, site in counted.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--swap", default="runs/smollm2/swap-0", help="the plain swap's checkpoint")
    parser.add_argument("--output", default="studies/smollm2_drelu.md")
    args = parser.parse_args()
    quiet_transformers()
    report = json.loads((Path(args.swap) / "reluize_report.json").read_text())
    s = report["settings"]
    seed, steps, size, max_tokens = report["seed"], report["steps"], report["batch_size"], report["max_tokens"]
    if report["refit_sentences"] or s["schedule"] != "swap" or report["batching"] != "length":
        raise SystemExit(f"{args.swap}: not the plain swap (no refit, length batches); "
                         "run studies/scripts/smollm2_recipes.sh")
    loaded = load(model_directory("smollm2-135m-instruct"), "smollm2-135m-instruct")
    model = loaded.model
    text = corpus(loaded.tokenizer, seed=seed, batch_size=size, max_tokens=max_tokens)  # the CLI's, with no --text
    held_batches, batches = text.held_batches(), text.batches(steps)

    original = copy.deepcopy(model)
    reference = evaluate(original, held_batches, True)
    for layer in model.model.layers:
        layer.mlp.up_proj = nn.Sequential(layer.mlp.up_proj, nn.ReLU())
    torch.manual_seed(seed)
    with warnings.catch_warnings():  # that its config cannot name relu(up): this model is measured, never saved
        warnings.simplefilter("ignore", UserWarning)
        reluize(model, batches, steps, schedule="swap", lr=s["lr"], lr_schedule=s["lr_schedule"], teacher=original)
    model.eval()
    drelu = {**scores(evaluate(model, held_batches, True), reference), **zeros(model, held_batches)}
    del model
    swapped = load(Path(args.swap)).model
    swap = {**scores(evaluate(swapped, held_batches, True), reference), **zeros(swapped, held_batches)}
    rows = [("swap: down(relu(gate(x)) · up(x)) (ReluLLaMA)", swap),
            ("dReLU: down(relu(gate(x)) · relu(up(x))) (TurboSparse)", drelu)]
    lines = ["# SmolLM2-135M-Instruct: dReLU against the plain swap at equal steps", "",
             "`python studies/scripts/smollm2_drelu.py`", "",
             f"Both distilled from the frozen original for {steps} steps (seed {seed}, batches of {size} "
             f"length-grouped training sentences, lr {s['lr']:g} falling linearly to 0, no refit) — the swap by "
             f"`lambda-gelu reluize --refit 0` (`{args.swap}`), dReLU by this script on the same batches. Measured "
             f"on the CLI's {len(text.held)} held-out sentences; zeros on real tokens, averaged over the layers. *down "
             "reads zero*: the share of `down`'s inputs that are exactly zero, the columns of `down` a sparse kernel "
             "skips.", "",
             "| FFN | perplexity ÷ original | gate zeros | up zeros | down reads zero |", "|---|---|---|---|---|"]
    lines += [f"| {name} | {r['perplexity_ratio']:.3f} | {100 * r['gate']:.1f}% | {100 * r['up']:.1f}% | "
              f"{100 * r['down']:.1f}% |" for name, r in rows]
    lines += ["", "dReLU is measured here, not offered by `lambda-gelu reluize`: no transformers architecture applies "
              "an activation to `up`, so its checkpoint would load only through code of its own, and the CLI writes "
              "only checkpoints that plain transformers loads as the converted network.", ""]
    Path(args.output).write_text("\n".join(lines), encoding="utf-8")
    print(args.output)


if __name__ == "__main__":
    main()
