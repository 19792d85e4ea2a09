"""Which layers should hold the zeros? SmolLM2-135M at 85% exact gate zeros, each layer's share chosen by what it was
measured to cost, against `--gate-zeros`' one shift for every gate. Writes studies/smollm2_layer_zeros.md.

    python studies/scripts/smollm2_layer_zeros.py   # ~25 minutes measuring the layers, a conversion of 30, ~6 measuring

First, with no training: on a checkpoint converted by the CLI's default English command (65% zeros of its own), each
layer alone is given a shift at which its gates are zero on a share of the grid, and the perplexity it then costs is
measured on training text only (sentences of the English `--text` and of the training docstrings). The shares that
cost least in sum at a mean of 85% are chosen layer by layer (a Lagrangian over the grid; a layer may keep its own
share), and the three ways to 85% (one shift pooled over the layers, as `--gate-zeros` does; each layer at 85%; the
chosen shares) are measured on held-out text. Then the command of studies/smollm2_budget_zeros.md in 30 minutes,
`--text E E E --minutes 30 --gate-zeros 0.85`, its threshold given the chosen shares, one per layer
(:class:`~lambda_gelu.reluize.GateThreshold` takes one per gated FFN), beside the same command with the one shift
(smollm2_budget.py's run `budget30-zeros0.85-english3-S`, reused where it exists), both measured on smollm2_prose.py's
three held-out sets. The layers' costs are kept in `layer_zeros<Z>.json` beside the runs.
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import random
import sys
from pathlib import Path

import torch

from lambda_gelu.hf.text import stdlib_sentences
from smollm2_budget import along_the_way, zeros_by_layer
from smollm2_english import convert, english_file, english_run, package_prose, report, write_lines
from smollm2_gate_shift import Shifted
from smollm2_prose import given, text_sets, write

MODEL = "smollm2-135m-instruct"
GRID = (0.8, 0.88, 0.94, 0.97)  # the shares each layer is measured at
WAYS = {"none": "the checkpoint as it is", "pooled": "one shift for every gate (the quantile pooled over the layers)",
        "per-layer": "each layer's own shift, each at the share", "allocated": "each layer at its chosen share"}


def allocate(natural: list[float], cost: list[list[float]], target: float) -> list[float]:
    """Each layer's share of zeros, its own (``natural``, at no cost) or one of :data:`GRID` (at ``cost``), that
    least cost in sum reach a mean of ``target``: each layer takes the share that minimises cost − μ·share, μ the
    least (to bisection's precision) that reaches the mean."""
    def choose(mu: float) -> list[float]:
        return [min([(z0, 0.0)] + [(z, c) for z, c in zip(GRID, costs) if z > z0], key=lambda o: o[1] - mu * o[0])[0]
                for z0, costs in zip(natural, cost)]
    lo, hi = 0.0, 1000.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if sum(choose(mid)) / len(natural) >= target else (mid, hi)
    return choose(hi)


def measure_layers(checkpoint: str, english: Path, target: float, calibration: int, sets: dict) -> dict:
    """The costs of each layer's shares on training text, the chosen shares, and the ways to ``target`` measured on
    the held-out ``sets`` (perplexity ÷ the original's, exact zeros on English outside Python)."""
    from lambda_gelu.hf.evaluate import evaluate, relu_zeros
    from lambda_gelu.hf.load import load, model_directory, quiet_transformers
    from lambda_gelu.hf.text import padding_tokenizer
    quiet_transformers()
    torch.manual_seed(0)
    original = load(model_directory(MODEL), MODEL)
    model = load(Path(checkpoint), checkpoint).model
    pad = padding_tokenizer(original.tokenizer)
    eng = english.read_text(encoding="utf-8").splitlines()
    train, _ = stdlib_sentences()
    random.Random(0).shuffle(eng)
    random.Random(1).shuffle(train)

    def batches(sentences):
        return [dict(pad(sentences[i:i + 64], padding=True, truncation=True, max_length=64, return_tensors="pt"))
                for i in range(0, len(sentences), 64)]
    cal = batches(eng[:calibration] + train[:calibration // 2])
    held = {k: batches(v[0]) for k, v in sets.items() if k != "Python reference docs"}
    ref = {k: evaluate(original.model, b, True)["perplexity"] for k, b in held.items()}
    mlps = [layer.mlp for layer in model.model.layers]
    acts = [Shifted() for _ in mlps]
    for mlp, act in zip(mlps, acts):
        mlp.act_fn = act
    seen: dict[int, list[torch.Tensor]] = {i: [] for i in range(len(mlps))}
    mask = [None]
    hooks = [mlp.gate_proj.register_forward_hook(lambda m, a, out, i=i: seen[i].append(out[mask[0]].detach()))
             for i, mlp in enumerate(mlps)]
    with torch.no_grad():
        for b in cal:
            mask[0] = b["attention_mask"].bool()
            model(**b)
    for h in hooks:
        h.remove()
    gates = [torch.cat(v).flatten() for v in seen.values()]
    gates = [g[torch.randperm(g.numel())[:400_000]] for g in gates]
    natural = [round(float((g <= 0).float().mean()), 3) for g in gates]

    def perplexity(bs):
        return evaluate(model, bs, True)["perplexity"]
    base = perplexity(cal)
    cost = []
    for i, (g, z0) in enumerate(zip(gates, natural)):
        row = []
        for z in GRID:
            acts[i].theta = torch.quantile(g, z) if z > z0 else torch.tensor(0.0)
            row.append(math.log(perplexity(cal) / base) if z > z0 else 0.0)
        acts[i].theta = torch.tensor(0.0)
        cost.append(row)
        print(i, f"own {z0:.3f}", " ".join(f"{c:.4f}" for c in row), flush=True)
    shares = allocate(natural, cost, target)

    def ways(thetas):
        for act, theta in zip(acts, thetas):
            act.theta = theta
        out = {k: perplexity(b) / ref[k] for k, b in held.items()}
        zeros = list(relu_zeros(model, held["English outside Python"]).values())
        return {**out, "zeros": sum(zeros) / len(zeros), "layers": [round(v, 3) for v in zeros]}
    measured = {"none": ways([torch.tensor(0.0)] * len(acts)),
                "pooled": ways([torch.quantile(torch.cat(gates), target)] * len(acts)),
                "per-layer": ways([torch.quantile(g, target) for g in gates]),
                "allocated": ways([torch.quantile(g, z) if z > z0 else torch.tensor(0.0)
                                   for g, z, z0 in zip(gates, shares, natural)])}
    return {"checkpoint": checkpoint, "target": target, "grid": list(GRID), "natural": natural, "cost": cost,
            "shares": shares, "measured": measured}


def convert_with_shares(shares_file: str, argv: list[str]) -> int:
    """`lambda-gelu reluize` ``argv``, its gate threshold given the shares of ``shares_file`` (one per layer)."""
    from lambda_gelu.cli import main as cli
    reluizer = importlib.import_module("lambda_gelu.reluize.reluizer")  # lambda_gelu.reluize is also a function
    shares = json.loads(Path(shares_file).read_text(encoding="utf-8"))["shares"]
    one_shift = reluizer.GateThreshold

    class ChosenShares(one_shift):
        def __init__(self, model, total_steps, target, end=0.5):
            super().__init__(model, total_steps, shares, end)
    reluizer.GateThreshold = ChosenShares
    return cli(argv)


def main() -> None:
    if sys.argv[1:2] == ["--convert-with"]:
        sys.exit(convert_with_shares(sys.argv[2], sys.argv[3:]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--out", default="runs/smollm2", help="where the runs and the texts are written")
    parser.add_argument("--output", default="studies/smollm2_layer_zeros.md")
    parser.add_argument("--checkpoint", default="runs/smollm2/budget30-english3-0",
                        help="the checkpoint whose layers are measured (smollm2_budget.py's default run)")
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--gate-zeros", type=float, default=0.85)
    parser.add_argument("--calibration", type=int, default=64, help="English sentences the layers are measured on "
                        "(and half as many training docstrings)")
    args = parser.parse_args()
    sets = text_sets()
    english, packages = package_prose({s for sentences, _ in sets.values() for s in sentences})
    text, zeros = Path(args.out) / "english.txt", args.gate_zeros
    pooled = [english_run(args.out, args.minutes, s, f"zeros{zeros:g}-") for s in args.seeds]
    chosen = [english_run(args.out, args.minutes, s, f"zeros{zeros:g}-", arm="-layers") for s in args.seeds]
    english_file(parser, text, english, [(run, 3) for run in pooled + chosen + [Path(args.checkpoint)]])
    layers_file = Path(args.out) / f"layer_zeros{zeros:g}.json"
    if not layers_file.is_file():
        write_lines(layers_file, [json.dumps(measure_layers(args.checkpoint, text, zeros, args.calibration, sets),
                                             indent=1)])
    options = ["--minutes", f"{args.minutes:g}", "--gate-zeros", f"{zeros:g}", "--quiet"]
    for seed, run in zip(args.seeds, pooled):
        convert(MODEL, run, seed, [text] * 3, options)
    for seed, run in zip(args.seeds, chosen):
        convert(MODEL, run, seed, [text] * 3, options,
                launcher=(sys.executable, __file__, "--convert-with", str(layers_file)))
    layers = json.loads(layers_file.read_text(encoding="utf-8"))
    made = {run: report(run) for run in pooled + chosen}
    write([str(run) for run in pooled + chosen], args.output,
          " ".join(["python studies/scripts/smollm2_layer_zeros.py", *given(parser, args)]), sets=sets,
          title=f"SmolLM2-135M at {zeros:.0%} exact gate zeros: each layer's share chosen by its measured cost",
          preface=preface(layers, args, len(english), packages),
          after=lambda ratios: [*reading(layers, ratios, pooled, chosen), "",
                                *zeros_by_layer(pooled + chosen, made),
                                *along_the_way(pooled + chosen, made, zeros=True)])


def reading(layers: dict, ratios: dict, pooled: list[Path], chosen: list[Path]) -> list[str]:
    """Which way to the share kept more, before training and after it, on each held-out set."""
    before = layers["measured"]
    sets = list(next(iter(ratios.values())))

    def mean(runs, name):
        return sum(ratios[str(run)][name] for run in runs) / len(runs)
    better = [name for name in sets if mean(chosen, name) < mean(pooled, name)]
    return [f"Reading: untrained after the shift, the chosen shares cost less than the one shift (English outside "
            "Python "
            f"×{before['allocated']['English outside Python']:.3f} against "
            f"×{before['pooled']['English outside Python']:.3f}); after the same budget of distillation they keep "
            + (f"more on {len(better)} of the {len(sets)} held-out sets ({', '.join(better)})" if better else
               "less on every held-out set")
            + ": English outside Python " + f"×{mean(chosen, 'English outside Python'):.3f} against "
            f"×{mean(pooled, 'English outside Python'):.3f}, the docstrings "
            f"×{mean(chosen, 'docstrings held out'):.3f} against ×{mean(pooled, 'docstrings held out'):.3f} "
            f"({len(pooled)} seed{'s' * (len(pooled) > 1)}). "
            "What a layer's zeros cost untrained is not what they cost once the distillation has repaired "
            "them (each layer's zeros and the docstrings along the way below)."]


def preface(layers: dict, args: argparse.Namespace, sentences: int, packages: int) -> list[str]:
    """The layers' costs, the chosen shares, and the ways to the share measured before any training."""
    zeros = args.gate_zeros
    lines = [f"Each layer of `{layers['checkpoint']}` (the CLI's default English command, 30 minutes; its gates' "
             "own zeros below) given, alone, the shift at which its gates are zero on a share of the calibration "
             f"tokens ({args.calibration} sentences of the English `--text`, {args.calibration // 2} of the training "
             "docstrings; no held-out text), and what that costs: log(perplexity ÷ the checkpoint's) on those "
             f"sentences. The chosen shares reach a mean of {zeros:.0%} at the least cost in sum; a layer may keep "
             "its own share.", "",
             "| layer | its own zeros | " + " | ".join(f"cost at {z:.0%}" for z in layers["grid"]) + " | chosen |",
             "|---|---|" + "---|" * len(layers["grid"]) + "---|"]
    for i, (z0, costs, z) in enumerate(zip(layers["natural"], layers["cost"], layers["shares"])):
        lines.append(f"| {i} | {z0:.1%} | "
                     + " | ".join(f"{c:.4f}" if z > z0 else "—" for z, c in zip(layers["grid"], costs))
                     + f" | {z:.1%} |")
    m = layers["measured"]
    lines += ["", f"The ways to {zeros:.0%} on that checkpoint, with no training after the shift, on the held-out "
              "sets (perplexity ÷ the original's; exact zeros averaged over the layers on English outside Python):",
              "",
              "| gates | exact zeros | docstrings held out | English outside Python |", "|---|---|---|---|"]
    lines += [f"| {WAYS[k]} | {v['zeros']:.1%} | ×{v['docstrings held out']:.3f} | "
              f"×{v['English outside Python']:.3f} |" for k, v in m.items()]
    lines += ["", f"Then `lambda-gelu reluize {MODEL} --seed S --text E E E --minutes {args.minutes:g} --gate-zeros "
              f"{zeros:g}`, E the English text of [smollm2_english.md](smollm2_english.md) ({sentences} prose "
              f"sentences of {packages} installed packages' READMEs, none held out), as it is (one shift pooled over "
              "the layers) and with its threshold given the chosen shares, one per layer (run names ending "
              "`-layers-S`): each layer's gates then shift by their own quantile, the target rising from the layer's "
              "own share to its chosen one over the first half of the steps. The shares were chosen on a trained "
              "checkpoint; a conversion starts from the swap and the refit, whose layers' costs may differ."]
    return lines


if __name__ == "__main__":
    main()
