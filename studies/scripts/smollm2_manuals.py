"""Does more kinds of English in the training text keep English outside Python at a high share of gate zeros?
SmolLM2-135M converted by the command of studies/smollm2_sampled.md's runs without samples (the English text of
smollm2_english.md named three times in `--text`, the default 30 minutes, `--gate-zeros 0.85`), beside the same command
with as many English lines, each distinct: that text once and, for the other two thirds, prose of the GNU manuals the
machine has in Info form (coreutils, grep, sed, gzip, wget, gnupg, ...; their licence chapters left out). The same
share of English in the steps' sentences, the same budget, seed and threshold: only which English differs. Both
measured on studies/smollm2_prose.md's three held-out sets. Writes studies/smollm2_manuals.md.

    python studies/scripts/smollm2_manuals.py   # seed 0: a conversion of 30 minutes on 2 cores (and the other if missing),
                                            # then ~6 minutes measuring
    python studies/scripts/smollm2_manuals.py --gate-zeros 0 --seeds 0 1 --output studies/smollm2_manuals_default.md  # default

The runs without the manuals are smollm2_budget.py's (`budget<M>-zeros<Z>-english3-S`, reused where they exist); those
with them are `budget<M>-zeros<Z>-manuals-S` (at `--gate-zeros 0`: `budget<M>-english3-S` and `budget<M>-manuals-S`),
trained on `english_manuals.txt`, written once beside them. A sentence of the held-out sets is never kept, and a
manual's chapters whose title names a licence (the GNU FDL, the GPL) are not read, nor any sentence that speaks of
licences, copyright, warranty or redistribution: Debian's copies of licences are held out.
"""
from __future__ import annotations

import argparse
import gzip
import re
from pathlib import Path

from lambda_gelu.hf.text import evenly, prose_sentences
from smollm2_english import arm_arguments, convert_arms, english_file, english_run, package_prose, steps_run
from smollm2_prose import given, text_sets, write

MODEL = "smollm2-135m-instruct"
INFO = Path("/usr/share/info")
# licence text, kept out: a node (chapter) so named, and any other sentence speaking of licences or copying rights
LICENCE_NODE = re.compile(r"licen[cs]e|\b[la]?gpl\b|\bg?fdl\b|copying", re.IGNORECASE)
LICENCE_WORDS = re.compile(r"licen[cs]|copyright|warrant|free software foundation|redistribut|\b[la]?gpl\b|\bg?fdl\b",
                           re.IGNORECASE)


def manual_prose(exclude: set[str]) -> tuple[list[str], list[str]]:
    """The distinct prose sentences (the CLI's rule) of the Info manuals in ``INFO``, in order of their files, none in
    ``exclude``, none from a node whose name names a licence or copying and none that speaks of licences, copyright,
    warranty or redistribution; and the manuals that gave any."""
    seen, out, manuals = set(exclude), [], []
    for path in sorted(INFO.glob("*.info*.gz")):
        with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
            text = f.read()
        fresh = []
        for node in text.split("\x1f"):
            name = re.search(r"Node: ([^,\n]*)", node)
            if name and LICENCE_NODE.search(name.group(1).strip()):
                continue
            for sentence in prose_sentences(node):
                if sentence not in seen and not LICENCE_WORDS.search(sentence):
                    seen.add(sentence)
                    fresh.append(sentence)
        if fresh:
            manuals.append(path.name.split(".info")[0])
        out += fresh
    return out, list(dict.fromkeys(manuals))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    arm_arguments(parser, "studies/smollm2_manuals.md")
    args = parser.parse_args()
    sets = text_sets()
    held = {s for sentences, _ in sets.values() for s in sentences}
    english, packages = package_prose(held)
    manuals, names = manual_prose(held | set(english))
    if len(manuals) < 2 * len(english):
        parser.error(f"{INFO} gives {len(manuals)} prose sentences of manuals; the runs need {2 * len(english)}, "
                     "twice the English text's (install Debian's info manuals: coreutils, grep, sed, ...)")
    mixed = english + evenly(manuals, 2 * len(english))
    text, zeros = Path(args.out) / "english.txt", args.gate_zeros
    kind = f"zeros{zeros:g}-" if zeros else ""  # 0: the ReLU gates' own zeros, no threshold (the CLI's default)
    base = [english_run(args.out, args.minutes, s, kind) for s in args.seeds]
    with_manuals = [Path(args.out) / f"budget{args.minutes:g}-{kind}manuals-{s}" for s in args.seeds]
    english_file(parser, text, english, [(run, 3) for run in base])
    mixed_path = Path(args.out) / "english_manuals.txt"
    english_file(parser, mixed_path, mixed, [(run, 1) for run in with_manuals])
    convert_arms(MODEL, args, [(base, [text] * 3), (with_manuals, [mixed_path])])
    command = " ".join(["python studies/scripts/smollm2_manuals.py", *given(parser, args)])
    write([str(run) for run in base + with_manuals], args.output, command, sets=sets,
          title=f"SmolLM2-135M → exact ReLU{f' at {zeros:.0%} gate zeros' if zeros else ''}: more kinds of English "
                "in the text", preface=[
              f"`lambda-gelu reluize {MODEL} --seed S --text E E E --minutes {args.minutes:g}"
              f"{f' --gate-zeros {zeros:g}' if zeros else ''}` "
              f"beside the same with `--text EM`: E the English text of [smollm2_english.md](smollm2_english.md) "
              f"({len(english)} prose sentences of {packages} installed packages' READMEs), EM that text once and "
              f"{2 * len(english)} sentences taken evenly from the {len(manuals)} distinct prose sentences (the CLI's "
              f"rule) of {len(names)} GNU manuals in Info form ({', '.join(names)}), their licence chapters left out, "
              "none in the held-out sets below nor in E. The same number of English lines, so the same share of the "
              f"steps' sentences: three times {len(english):,} README sentences against {len(mixed):,} distinct ones, "
              "two thirds of another kind. Of the manuals, no chapter named for a licence or copying is read and no "
              "sentence that speaks of licences, copyright, warranty or redistribution is kept (the held-out English "
              "is half licences); E keeps the READMEs' few such lines, three times over in the runs without EM."],
          after=[steps_run(base + with_manuals)])


if __name__ == "__main__":
    main()
