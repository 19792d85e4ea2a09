"""Does distilling on the original's own samples keep English outside Python at a high share of gate zeros? SmolLM2-135M
converted by the command of studies/smollm2_budget_zeros.md (the English text named three times in `--text`, a time
budget, `--gate-zeros`), beside the same command with text the original model wrote added to `--text`: samples drawn
from it at temperature 1 from its first token alone, cut into prose sentences by the CLI's rule. Both measured on
studies/smollm2_prose.md's three held-out sets. Writes studies/smollm2_sampled.md.

    python studies/scripts/smollm2_sampled.py   # seed 0: ~12 minutes sampling, two conversions of 30, ~6 measuring

Distillation matches the original's next-token distribution on the text it is given: text the original itself wrote
is where its distribution puts its mass, general English rather than Python, with nothing held out read to make it.
The runs without it are smollm2_budget.py's (`budget<M>-zeros<Z>-english3-S`, reused where they exist); those with
it are `budget<M>-zeros<Z>-english3-sampled<N>-S`. The samples are drawn once (seeded) and kept in the runs'
directory; a sentence of the held-out sets is never kept.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from lambda_gelu.hf.load import load, model_directory, quiet_transformers
from lambda_gelu.hf.text import prose_sentences
from smollm2_english import (arm_arguments, convert_arms, done, english_file, english_run, package_prose, steps_run,
                             write_lines)
from smollm2_prose import given, text_sets, write

MODEL = "smollm2-135m-instruct"


def sample(path: Path, samples: int, tokens: int, batch: int, seed: int, exclude: set[str]) -> list[str]:
    """The distinct prose sentences of ``samples`` texts of at most ``tokens`` tokens drawn from the original at
    temperature 1 from its first token alone, none in ``exclude``; written to ``path`` one a line (whole or not at
    all) and read from it when it is there."""
    if path.is_file():
        return path.read_text(encoding="utf-8").splitlines()
    quiet_transformers()
    original = load(model_directory(MODEL), MODEL)
    model, tokenizer = original.model, original.tokenizer
    torch.manual_seed(seed)
    seen, sentences = set(exclude), []
    with torch.inference_mode():
        for start in range(0, samples, batch):
            ids = torch.full((min(batch, samples - start), 1), tokenizer.bos_token_id)
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                                 top_k=0, top_p=1.0, max_new_tokens=tokens,
                                 pad_token_id=tokenizer.eos_token_id)
            for text in tokenizer.batch_decode(out[:, 1:], skip_special_tokens=True):
                fresh = [s for s in prose_sentences(text) if s not in seen]
                seen.update(fresh)
                sentences += fresh
            print(f"sampled {start + len(ids)} of {samples}: {len(sentences)} sentences", flush=True)
    write_lines(path, sentences)
    return sentences


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    arm_arguments(parser, "studies/smollm2_sampled.md")
    parser.add_argument("--samples", type=int, default=1536, help="texts drawn from the original")
    parser.add_argument("--tokens", type=int, default=96, help="tokens a text at most")
    parser.add_argument("--batch", type=int, default=64, help="texts drawn at once")
    args = parser.parse_args()
    sets = text_sets()
    held = {s for sentences, _ in sets.values() for s in sentences}
    english, packages = package_prose(held)
    text, zeros = Path(args.out) / "english.txt", args.gate_zeros
    base = [english_run(args.out, args.minutes, s, f"zeros{zeros:g}-") for s in args.seeds]
    with_samples = [english_run(args.out, args.minutes, s, f"zeros{zeros:g}-", arm=f"-sampled{args.samples}")
                    for s in args.seeds]
    english_file(parser, text, english, [(run, 3) for run in base + [r for r in with_samples if not done(r)]])
    sampled_path = Path(args.out) / f"sampled{args.samples}x{args.tokens}.txt"
    sampled = sample(sampled_path, args.samples, args.tokens, args.batch, 0, held)
    convert_arms(MODEL, args, [(base, [text] * 3), (with_samples, [text] * 3 + [sampled_path])])
    command = " ".join(["python studies/scripts/smollm2_sampled.py", *given(parser, args)])
    write([str(run) for run in base + with_samples], args.output, command, sets=sets,
          title=f"SmolLM2-135M → exact ReLU at {zeros:.0%} gate zeros: the original's own samples as text", preface=[
              f"`lambda-gelu reluize {MODEL} --seed S --text E E E [G] --minutes {args.minutes:g} --gate-zeros "
              f"{zeros:g}`: E the English text of [smollm2_english.md](smollm2_english.md) ({len(english)} prose "
              f"sentences of {packages} installed packages' READMEs), G the original's own samples: {args.samples} "
              f"texts of at most {args.tokens} tokens drawn at temperature 1 (no top-k, no top-p) from its first "
              f"token alone, seed 0, giving {len(sampled)} distinct prose sentences (the CLI's rule), none in the "
              "held-out sets below. The same budget, seed and threshold with and without G."],
          after=[steps_run(base + with_samples)])


if __name__ == "__main__":
    main()
