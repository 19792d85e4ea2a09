"""How far a conversion's perplexity holds outside the text it was trained on: SmolLM2-135M checkpoints converted by
`lambda-gelu reluize` (which distils on standard-library docstrings and measures on docstrings of files it held out)
against the original on three held-out sets — those docstrings, Python's reference documentation (the stdlib's
pydoc_data: prose about Python, not docstrings) and English outside Python (Debian's common licences and
scikit-learn's dataset descriptions, where the machine has them). Writes studies/smollm2_prose.md.

    python studies/scripts/smollm2_prose.py runs/smollm2/default-* runs/smollm2/lr5e-4-*   # ≈ 1 minute a checkpoint

Each set: up to 256 prose sentences (the CLI's rule: 6 to 60 words, mostly letters), spread evenly over the set, none
that the conversions trained on; batches of 64, at most the conversions' tokens a sentence. Checkpoints are grouped by
their directory's name less its "-SEED" tail: mean ± sample std over the seeds.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import defaultdict
from pathlib import Path


from lambda_gelu.hf.evaluate import evaluate
from lambda_gelu.hf.load import load, model_directory, quiet_transformers
from lambda_gelu.hf.text import (HELD_BATCH, HELD_OUT, padding_tokenizer, reference_sentences, stdlib_sentences,
                                  unseen_prose)
from lambda_gelu_lab.report.stats import mean_sd

LICENCES = Path("/usr/share/common-licenses")


def text_sets() -> dict[str, tuple[list[str], str]]:
    """{set: (its sentences, where they come from)}; a set whose sources are absent is left out."""
    train, held = stdlib_sentences()
    trained = set(train)

    sets = {"docstrings held out": (held[:HELD_OUT], "the standard library's docstrings in files held out of "
                                    "training: the set `reluize` reports")}
    sets["Python reference docs"] = (reference_sentences(trained),
                                     "the language reference's topics in the stdlib's pydoc_data")
    english, found = [], []
    licences = [LICENCES / n for n in ("GPL-3", "Apache-2.0", "MPL-2.0", "GFDL-1.3") if (LICENCES / n).is_file()]
    if licences:
        english += [p.read_text(encoding="utf-8", errors="replace") for p in licences]
        found.append("Debian's common licences (" + ", ".join(p.name for p in licences) + ")")
    try:
        import sklearn
    except ImportError:
        sklearn = None
    descr = sorted((Path(sklearn.__file__).parent / "datasets" / "descr").glob("*.rst")) if sklearn else []
    if descr:
        english += [p.read_text(encoding="utf-8") for p in descr]
        found.append(f"scikit-learn's {len(descr)} dataset descriptions")
    if english:
        sets["English outside Python"] = (unseen_prose(english, trained), " and ".join(found))
    return sets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="+", help="directories written by `lambda-gelu reluize` from SmolLM2")
    parser.add_argument("--output", default="studies/smollm2_prose.md")
    args = parser.parse_args()
    write(args.checkpoints, args.output,
          " ".join(["python studies/scripts/smollm2_prose.py", *args.checkpoints, *given(parser, args, "checkpoints")]))


def given(parser: argparse.ArgumentParser, args: argparse.Namespace, *skip: str) -> list[str]:
    """The options of ``args`` (less ``skip``) not at ``parser``'s defaults, as a command line names them (a list
    as its items, a flag alone): a doc's command regenerates that doc, not the default one."""
    named = [(f"--{k.replace('_', '-')}", v) for k, v in vars(args).items()
             if k not in skip and v != parser.get_default(k)]
    return [option if v is True else f"{option} {' '.join(map(str, v)) if isinstance(v, list) else v}"
            for option, v in named]


def write(checkpoints: list[str], output: str, command: str, preface: list[str] = (), sets: dict | None = None,
          title: str = "SmolLM2-135M → exact ReLU: perplexity outside the training text",
          after=()) -> None:
    """Measures ``checkpoints`` against the original on ``sets`` (default :func:`text_sets`) and writes the doc
    ``output``, titled ``title``, headed by the ``command`` that regenerates it and the ``preface`` lines, closed by
    the ``after`` lines, or by those ``after`` makes of {checkpoint: {set: perplexity ÷ the original's}} (a checkpoint
    given ``--text`` lines must not have been given any of those sets' sentences)."""
    quiet_transformers()
    reports = {d: json.loads((Path(d) / "reluize_report.json").read_text(encoding="utf-8")) for d in checkpoints}
    first = next(iter(reports.values()))
    original = load(model_directory(first["model"]), first["model"])
    pad = padding_tokenizer(original.tokenizer)
    sets = text_sets() if sets is None else sets
    batches = {name: [dict(pad(s[i:i + HELD_BATCH], padding=True, truncation=True, max_length=first["max_tokens"],
                               return_tensors="pt")) for i in range(0, len(s), HELD_BATCH)]
               for name, (s, _) in sets.items()}

    def perplexities(model):
        return {name: evaluate(model, b, True)["perplexity"] for name, b in batches.items()}

    reference = perplexities(original.model)
    del original
    rows = {}
    for d, report in reports.items():
        model = load(Path(d), d).model
        ratios = {name: p / reference[name] for name, p in perplexities(model).items()}
        zeros = report.get("zeros") or {}
        rows[d] = (ratios, 100 * statistics.fmean(zeros.values()) if zeros else None, report)
        print(d, {k: round(v, 3) for k, v in ratios.items()}, flush=True)
        del model
    groups = defaultdict(list)
    for d in rows:
        groups[re.sub(r"-\d+$", "", Path(d).name)].append(d)

    names = list(sets)
    lines = [f"# {title}", "",
             f"`{command}`", "", *preface, *([""] if preface else []),
             "`lambda-gelu reluize` distils on the standard library's docstrings (and on the user's `--text` lines, "
             "where given) and reports perplexity on the "
             "docstrings of files it held out: text never trained on, but of the training text's kind. Here each "
             "checkpoint's perplexity ÷ the original's on that set and on two further held-out sets:", ""]
    lines += [f"- *{name}*: {len(sets[name][0])} sentences, {sets[name][1]}; the original's perplexity "
              f"{reference[name]:.1f}." for name in names]
    lines += ["", "| checkpoints | seeds | lr | `--text` lines | exact gate zeros | " + " | ".join(names) + " |",
              "|---|---|---|---|---|" + "---|" * len(names)]
    for group, ds in groups.items():
        zeros = [rows[d][1] for d in ds if rows[d][1] is not None]
        lrs = sorted({f"{rows[d][2]['settings']['lr']:g}" for d in ds})
        users = sorted({rows[d][2].get("user_lines", 0) for d in ds})
        lines.append(f"| {group} | {len(ds)} | {', '.join(lrs)} | {', '.join(map(str, users))} | "
                     + (mean_sd(zeros, "{:.1f}") + "%" if zeros else "—") + " | "
                     + " | ".join("×" + mean_sd([rows[d][0][n] for d in ds], "{:.3f}") for n in names) + " |")
    lines += ["", "Each checkpoint (its report's ratio beside the same held-out docstrings measured here):", "",
              "| checkpoint | in its report | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    lines += [f"| `{d}` | ×{r['reluized']['perplexity_ratio']:.3f} | "
              + " | ".join(f"×{ratios[n]:.3f}" for n in names) + " |" for d, (ratios, _, r) in rows.items()]
    if callable(after):
        after = after({d: ratios for d, (ratios, _, _) in rows.items()})
    if after:
        lines += ["", *after]
    Path(output).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(output)


if __name__ == "__main__":
    main()
