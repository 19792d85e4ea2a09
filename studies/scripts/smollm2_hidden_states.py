"""What should the distillation's hidden-state term weigh? SmolLM2-135M at 85% exact gate zeros, converted by the
command of studies/smollm2_budget_zeros.md in 30 minutes (`--text E E E --minutes 30 --gate-zeros 0.85`) with the loss's
hidden-state term as it is, four and sixteen times as heavy, as each position's own relative error, and left out.
Writes studies/smollm2_hidden_states.md.

    python studies/scripts/smollm2_hidden_states.py   # seed 0: four conversions of 30 minutes on 2 cores (and the one
                                                  # as it is, if missing), then ~15 minutes measuring

`logits-kl`, the loss of a causal LM, adds to the KL the mean over the hidden states (the embeddings' and each
layer's) of their relative squared error, ‖s − t‖² / ‖t‖² summed over every position of the batch. In a Llama-family
model one position, the first, holds nearly all of a middle layer's squared norm (its massive activations: the
preface's table), so that sum weighs the other positions' hidden states next to nothing in those layers. The arms:

- `sum`: the term as it is (smollm2_budget.py's run `budget<M>-zeros<Z>-english3-S`, reused where it exists);
- `sum4`, `sum16`: the term as it is, four or sixteen times as heavy beside the KL (`--hidden-weight 4`, `16`; runs
  `...-english3-hidden4-S`, `...-english3-hidden16-S`);
- `tokens`: each position's ‖s − t‖² / ‖t‖², averaged over the positions (runs `...-english3-tokens-S`): the CLI in
  a process of its own with that term in place of the library's (`--convert-with tokens`);
- `none`: the KL alone (`--hidden-weight 0`; runs `...-english3-nohidden-S`).

The same text, seed, budget and threshold in each. All measured on smollm2_prose.py's three held-out sets.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import torch

from smollm2_budget import along_the_way, zeros_by_layer
from smollm2_english import (arm_arguments, convert, done, english_file, english_run, package_prose, report, steps_run)
from smollm2_prose import given, text_sets, write

MODEL = "smollm2-135m-instruct"
ARMS = {"sum": "the relative squared error summed over every position (the library's)",
        "sum4": "the library's term, four times as heavy beside the KL",
        "sum16": "the library's term, sixteen times as heavy beside the KL",
        "tokens": "each position's relative squared error, averaged over the positions",
        "none": "no hidden-state term: the KL alone"}
SUFFIX = {"sum": "", "sum4": "-hidden4", "sum16": "-hidden16", "tokens": "-tokens", "none": "-nohidden"}
WEIGHT = {"sum": 1, "sum4": 4, "sum16": 16, "tokens": 1, "none": 0}  # each arm's --hidden-weight, given always


def token_relative_error(s: torch.Tensor, t: torch.Tensor, mask) -> torch.Tensor:
    """The mean over the positions ``mask`` keeps (all, if it does not fit) of each one's ‖s − t‖² / ‖t‖²."""
    ratio = (s.float() - t.float()).pow(2).sum(-1) / t.float().pow(2).sum(-1).clamp(min=torch.finfo(torch.float32).tiny)
    if mask is not None and mask.shape == ratio.shape:
        m = mask.to(torch.float32)
        return (ratio * m).sum() / m.sum().clamp(min=1.0)
    return ratio.mean()


def convert_with(arm: str, argv: list[str]) -> int:
    """`lambda-gelu reluize` ``argv`` with the per-position hidden-state term (the ``tokens`` arm): the loss's
    ``relative_error``, which a causal LM's `logits-kl` calls only for its hidden states, made
    :func:`token_relative_error`."""
    from lambda_gelu.cli import main as cli
    if arm != "tokens":
        raise SystemExit(f"--convert-with takes tokens (the other arms are the CLI's --hidden-weight), got {arm!r}")
    importlib.import_module("lambda_gelu.reluize.losses").relative_error = token_relative_error
    return cli(argv)


def first_position_shares(english: list[str], sentences: int = 16) -> list[float]:
    """Each hidden state's (the embeddings', each layer's) share of its squared norm held by the first position, over
    ``sentences`` English sentences of the training text, in the original model."""
    from lambda_gelu.hf.load import load, model_directory, quiet_transformers
    from lambda_gelu.hf.text import padding_tokenizer
    quiet_transformers()
    original = load(model_directory(MODEL), MODEL)
    batch = padding_tokenizer(original.tokenizer)(english[:sentences], padding=True, truncation=True, max_length=128,
                                                  return_tensors="pt")
    with torch.no_grad():
        hidden = original.model(**batch, output_hidden_states=True).hidden_states
    mask = batch["attention_mask"].unsqueeze(-1).float()
    return [float(h[:, 0].float().pow(2).sum() / (h.float().pow(2) * mask).sum()) for h in hidden]


def main() -> None:
    if sys.argv[1:2] == ["--convert-with"]:
        sys.exit(convert_with(sys.argv[2], sys.argv[3:]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    arm_arguments(parser, "studies/smollm2_hidden_states.md")
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    args = parser.parse_args()
    sets = text_sets()
    english, packages = package_prose({s for sentences, _ in sets.values() for s in sentences})
    text, zeros = Path(args.out) / "english.txt", args.gate_zeros
    kind = f"zeros{zeros:g}-" if zeros else ""
    runs = {arm: [english_run(args.out, args.minutes, s, kind, arm=SUFFIX[arm]) for s in args.seeds]
            for arm in args.arms}
    english_file(parser, text, english, [(run, 3) for arm_runs in runs.values() for run in arm_runs])
    options = ["--minutes", f"{args.minutes:g}", *(["--gate-zeros", f"{zeros:g}"] if zeros else []), "--quiet"]
    for arm, arm_runs in runs.items():  # the `sum` arm's runs are smollm2_budget.py's too, which may weigh otherwise
        for run in arm_runs:
            weight = report(run)["settings"].get("hidden_weight", 1) if done(run) else WEIGHT[arm]
            if weight != WEIGHT[arm]:
                parser.error(f"{run} weighed the hidden-state term {weight:g}, arm {arm} {WEIGHT[arm]:g}: move it "
                             "away, and this converts it again")
    for arm, arm_runs in runs.items():
        for seed, run in zip(args.seeds, arm_runs):
            launcher = (sys.executable, __file__, "--convert-with", arm) if arm == "tokens" else ("lambda-gelu",)
            convert(MODEL, run, seed, [text] * 3, options + ["--hidden-weight", str(WEIGHT[arm])], launcher=launcher)
    shares = first_position_shares(english)
    every = [run for arm_runs in runs.values() for run in arm_runs]
    made = {run: report(run) for run in every}
    write([str(run) for run in every], args.output, " ".join(["python studies/scripts/smollm2_hidden_states.py",
                                                              *given(parser, args)]),
          sets=sets, title=f"SmolLM2-135M{f' at {zeros:.0%} gate zeros' if zeros else ''}: the distillation's "
                           "hidden-state term",
          preface=preface(args, shares, len(english), packages, runs),
          after=lambda ratios: [*reading(ratios, runs), "", steps_run(every), "",
                                *(zeros_by_layer(every, made) if zeros else []),
                                *along_the_way(every, made, zeros=zeros)])


def reading(ratios: dict, runs: dict[str, list[Path]]) -> list[str]:
    """The arms in order of what they kept of English outside Python, and each one's three held-out sets."""
    def mean(arm, name):
        return sum(ratios[str(run)][name] for run in runs[arm]) / len(runs[arm])
    sets = list(next(iter(ratios.values())))
    order = sorted(runs, key=lambda arm: mean(arm, "English outside Python"))
    best_everywhere = all(min(runs, key=lambda arm: mean(arm, name)) == order[0] for name in sets)
    seeds = len(runs[order[0]])
    lead = f"`{order[0]}` keeps the most of English outside Python" if len(order) > 1 else "one arm"
    lead += " and of every held-out set" if best_everywhere and len(order) > 1 else ""
    return [f"Reading: {lead}: "
            + "; ".join(f"`{arm}` " + ", ".join(f"{name} ×{mean(arm, name):.3f}" for name in sets) for arm in order)
            + f" ({seeds} seed{'s' * (seeds > 1)} each)."]


def preface(args: argparse.Namespace, shares: list[float], sentences: int, packages: int,
            runs: dict[str, list[Path]]) -> list[str]:
    zeros = args.gate_zeros
    lines = [f"`lambda-gelu reluize {MODEL} --seed S --text E E E --minutes {args.minutes:g}"
             f"{f' --gate-zeros {zeros:g}' if zeros else ''}`, E the English text of "
             f"[smollm2_english.md](smollm2_english.md) ({sentences} prose sentences of {packages} installed "
             "packages' READMEs, none held out), its loss's hidden-state term in each arm:", ""]
    lines += [f"- `{arm}` ({', '.join(f'`{run.name}`' for run in arm_runs)}): {ARMS[arm]};"
              for arm, arm_runs in runs.items()]
    lines += ["", "What the sum over positions weighs: the share of each hidden state's squared norm (summed over "
              "the positions of 16 English training sentences) that the first position holds, in the original model "
              "(0: the embeddings; i: layer i's output; the last is after the final norm):", "",
              "| hidden state | " + " | ".join(str(i) for i in range(len(shares))) + " |",
              "|---|" + "---|" * len(shares),
              "| first position's share | " + " | ".join(f"{100 * s:.1f}%" for s in shares) + " |"]
    return lines


if __name__ == "__main__":
    main()
