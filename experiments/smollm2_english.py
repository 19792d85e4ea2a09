"""Does distilling on English prose carry a conversion's quality to English outside Python? SmolLM2-135M converted by
the CLI's default recipe with `--text`: the prose sentences of the installed Python packages' long descriptions (their
READMEs on the package index), beside the same conversion on the standard library's docstrings alone, both measured on
docs/smollm2_prose.md's three held-out sets. Writes docs/smollm2_english.md.

    python experiments/smollm2_english.py --seeds 0 1   # ≈ 1 hour a missing run on 2 cores, then ≈ 10 minutes

The baseline is an existing conversion (by default smollm2_recipes.sh's refit run at lr 5e-4); the English runs take its
steps, refit sentences and lr, and by default its seed, so that they differ from it only in the text; `--seeds` adds
English runs at further seeds (the baseline stays one seed). scikit-learn's description is left out (its
dataset descriptions are in the English held-out set), and so is every sentence of the three held-out sets. Which
packages are installed decides the text: the doc counts its packages and sentences.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
from pathlib import Path

from lambda_gelu.hf.text import prose_sentences
from smollm2_prose import text_sets, write

HELD_OUT_PACKAGES = {"scikit-learn"}  # its dataset descriptions are held out


def package_prose(exclude: set[str]) -> tuple[list[str], int]:
    """The distinct prose sentences (the CLI's rule) of every installed distribution's long description, in order of
    the distributions' names, none in ``exclude``; and how many distributions gave any."""
    seen, out, packages = set(exclude), [], 0
    dists = {(d.metadata["Name"] or "").lower(): d for d in importlib.metadata.distributions()}
    for name in sorted(set(dists) - HELD_OUT_PACKAGES):
        meta = dists[name].metadata
        fresh = [s for s in prose_sentences(meta.get_payload() or meta.get("Description") or "") if s not in seen]
        packages += bool(fresh)
        seen.update(fresh)
        out += fresh
    return out, packages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default="runs/smollm2/refit704-lr5e-4-0",
                        help="a conversion on the docstrings alone, whose settings the English runs take")
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="the English runs' seeds (default: the baseline's); each is written beside the baseline")
    parser.add_argument("--output", default="docs/smollm2_english.md")
    args = parser.parse_args()
    if not (Path(args.baseline) / "reluize_report.json").is_file():
        parser.error(f"{args.baseline} is not a finished conversion: make the baseline first, by the command on "
                     "docs/smollm2_recipes_lr5e-4.md's third line, or give --baseline")
    base = json.loads((Path(args.baseline) / "reluize_report.json").read_text(encoding="utf-8"))
    settings = base["settings"]
    lr, seed, steps, refit = settings["lr"], base["seed"], base["steps"], base["refit_sentences"]
    tag = f"{lr:.0e}".replace("e-0", "e-")  # 5e-4, as the other runs' directories name it
    seeds = list(dict.fromkeys(args.seeds or [seed]))
    outs = [Path(args.baseline).parent / f"english-lr{tag}-{s}" for s in seeds]

    sets = text_sets()  # the held-out sets: kept out of the English text, then measured on
    english, packages = package_prose({s for sentences, _ in sets.values() for s in sentences})
    text = outs[0].parent / "english.txt"
    for out in outs:  # a run measured again must have trained on this text
        if (out / "reluize_report.json").is_file():
            trained = json.loads((out / "reluize_report.json").read_text(encoding="utf-8"))["user_lines"]
            if trained != len(english):
                parser.error(f"{out} trained on {trained} lines of --text, the installed packages give "
                             f"{len(english)} now: remove it to convert again")
    missing = [(out, s) for out, s in zip(outs, seeds) if not (out / "reluize_report.json").is_file()]
    if missing:
        tmp = text.with_suffix(".tmp")
        tmp.write_text("\n".join(english) + "\n", encoding="utf-8")
        os.replace(tmp, text)
    for out, run_seed in missing:
        subprocess.run(["lambda-gelu", "reluize", base["model"], "--out", str(out), "--seed", str(run_seed),
                        "--steps", str(steps), "--refit", str(refit), "--lr", f"{lr:g}", "--text", str(text),
                        "--quiet"], check=True)
    words = sum(len(s.split()) for s in english)
    command = "python experiments/smollm2_english.py" + (" --seeds " + " ".join(map(str, seeds)) if args.seeds else "")
    runs = ", ".join(f"`{out}`" for out in outs)
    write([args.baseline, *map(str, outs)], args.output, command, sets=sets,
          preface=[f"The English text: {len(english)} prose sentences ({words} words) of the long descriptions of "
                   f"{packages} installed Python packages (their READMEs), written one a line to `{text}` and given "
                   f"as `--text`; {runs} train{'s' if len(outs) == 1 else ''} on them beside the docstrings, "
                   f"`{args.baseline}` on the docstrings alone, all at {steps} steps, a refit over {refit} sentences, "
                   f"lr {lr:g}; the baseline at seed {seed}, the English text at seed{'s' if len(seeds) > 1 else ''} "
                   f"{', '.join(map(str, seeds))}. No sentence of the three held-out sets below is in the English "
                   "text."])


if __name__ == "__main__":
    main()
