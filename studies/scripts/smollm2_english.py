"""Does distilling on English prose carry a conversion's quality to English outside Python? SmolLM2-135M converted by
the CLI's default recipe with `--text`: the prose sentences of the installed Python packages' long descriptions (their
READMEs on the package index), beside the same conversion on the standard library's docstrings alone, both measured on
studies/smollm2_prose.md's three held-out sets. Writes studies/smollm2_english.md.

    python studies/scripts/smollm2_english.py --runs 1:0 1:1 3:0 3:0:0.87 3:0:0.75 3:0@30 3:1@30 3:2@30
    # ≤ 1¼ hours a missing run on 2 cores, then ~3 minutes measuring each checkpoint

The baseline is an existing conversion (by default smollm2_recipes.sh's refit run at lr 5e-4); the English runs take its
steps, refit sentences and lr, and by default its seed, so that they differ from it only in the text. `--runs W:S`
names the English runs: each at seed S, naming the English file W times in `--text`, so that W > 1 makes it a larger
share of each step's sentences (the baseline stays one seed); `W:S:Z` also asks `--gate-zeros Z`, the gate threshold
(its runs on the docstrings alone are studies/smollm2_sparsity.md's, measured on these sets in studies/smollm2_prose.md);
`W:S@M` takes a time budget of M minutes instead of the baseline's steps and refit, as a user's `--minutes M` would (30
is the CLI's default for a causal LM), the steps and the refit planned to fit it on the machine that runs it.
scikit-learn's description is left out (its dataset descriptions are in the English held-out set), and so is every
sentence of the three held-out sets. Which packages are installed decides the text: the doc counts its packages and
sentences.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import statistics
import subprocess
from pathlib import Path
from typing import NamedTuple

from lambda_gelu.hf.convert import ConversionConfig
from lambda_gelu.hf.text import prose_sentences, stdlib_sentences
from transformers import AutoTokenizer
from smollm2_prose import given, text_sets, write

HELD_OUT_PACKAGES = {"scikit-learn"}  # its dataset descriptions are held out
DEFAULT_MINUTES = ConversionConfig.DEFAULT_MINUTES_CAUSAL


class Run(NamedTuple):
    """An English run: where it is written, its seed, the times it names the English file, its --gate-zeros, and its
    --minutes where it takes a time budget instead of the baseline's steps."""
    out: Path
    seed: int
    times: int
    zeros: str | None
    minutes: int | None


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
    parser.add_argument("--runs", nargs="+", default=None, metavar="W:S[:Z][@M]",
                        help="the English runs, each written beside the baseline: W the times it names the English "
                             "file in --text, S its seed, Z its --gate-zeros if any, M its --minutes if it takes a "
                             "time budget instead of the baseline's steps (default 1:the baseline's seed)")
    parser.add_argument("--output", default="studies/smollm2_english.md")
    args = parser.parse_args()
    if not done(args.baseline):
        parser.error(f"{args.baseline} is not a finished conversion: make the baseline first, by the command on "
                     "studies/smollm2_recipes_lr5e-4.md's third line, or give --baseline")
    base = report(args.baseline)
    settings = base["settings"]
    lr, seed, steps, refit = settings["lr"], base["seed"], base["steps"], base["refit_sentences"]
    tag = f"{lr:.0e}".replace("e-0", "e-")  # 5e-4, as the other runs' directories name it
    specs = list(dict.fromkeys(args.runs or [f"1:{seed}"]))
    if not all(re.fullmatch(r"[1-9]\d*:\d+(:0\.\d*[1-9])?(@[1-9]\d*)?", spec) for spec in specs):
        parser.error(f"--runs takes W:S[:Z][@M], W ≥ 1 the times the English file is named, S a seed, Z a share "
                     f"of gate zeros between 0 and 1 (0.87) and M whole minutes (30): not {specs}")
    runs = []
    for spec in specs:
        spec, _, m = spec.partition("@")
        w, s, *z = spec.split(":")
        name = (f"english{w if int(w) > 1 else ''}{''.join(f'-zeros{v}' for v in z)}{f'-min{m}' if m else ''}"
                f"-lr{tag}-{s}")
        runs.append(Run(Path(args.baseline).parent / name, int(s), int(w), z[0] if z else None, int(m) if m else None))

    sets = text_sets()  # the held-out sets: kept out of the English text, then measured on
    english, packages = package_prose({s for sentences, _ in sets.values() for s in sentences})
    text = Path(args.baseline).parent / "english.txt"
    english_file(parser, text, english, [(run.out, run.times) for run in runs])
    for run in runs:
        budget = ["--minutes", str(run.minutes)] if run.minutes else ["--steps", str(steps), "--refit", str(refit)]
        convert(base["model"], run.out, run.seed, [text] * run.times,
                [*budget, "--lr", f"{lr:g}", *(["--gate-zeros", run.zeros] if run.zeros else []), "--quiet"])
    words = sum(len(s.split()) for s in english)
    tokenizer = AutoTokenizer.from_pretrained(args.baseline)  # the checkpoint's, the original's own

    def tokens(sentences):
        return statistics.fmean(min(len(ids), base["max_tokens"]) for ids in tokenizer(sentences)["input_ids"])

    docstrings = stdlib_sentences()[0]
    command = " ".join(["python studies/scripts/smollm2_english.py", *(["--runs", *specs] if args.runs else []),
                        *given(parser, args, "runs")])
    timed = [run for run in runs if run.minutes]
    named = []
    for w in dict.fromkeys(run.times for run in runs):
        dirs = [f"`{run.out}`" for run in runs if run.times == w]
        named.append(f"{', '.join(dirs)} name{'s' if len(dirs) == 1 else ''} it {'once' if w == 1 else f'{w} times'} "
                     f"({w * len(english)} of {w * len(english) + base['train_sentences']} training sentences)")
    write([args.baseline, *(str(run.out) for run in runs)], args.output, command, sets=sets,
          preface=[f"The English text: {len(english)} prose sentences ({words} words) of the long descriptions of "
                   f"{packages} installed Python packages (their READMEs), written one a line to `{text}` and given "
                   f"as `--text` beside the docstrings: {'; '.join(named)}. `{args.baseline}` trains on the "
                   f"docstrings alone. All at lr {lr:g}"
                   + (f" and, but for the time-budget runs below, {steps} steps and a refit over {refit} sentences"
                      if timed else f", {steps} steps, a refit over {refit} sentences")
                   + f"; the baseline at seed {seed}, each English run at the seed its name ends with. No sentence of "
                   "the three held-out sets below is in the English text."
                   + "".join(budgeted([run for run in timed if run.minutes == m], tag)
                             for m in dict.fromkeys(run.minutes for run in timed))
                   + "".join(f" `{run.out.name}` also asks `--gate-zeros {run.zeros}`: every gate's bias lowered "
                             f"until {float(run.zeros):.0%} of the gates' outputs are exact zeros, a share reached "
                             "over the first half of the steps" + counterpart(f"zeros{run.zeros}-lr{tag}") + "."
                             for run in runs if run.zeros),
                   "",
                   "Minutes each conversion took (its report's, the measuring left out; made at different times, so "
                   "part of any difference may be the machine's): "
                   + ", ".join(f"`{Path(d).name}` {report(d)['seconds'] / 60:.0f}"
                               for d in [args.baseline, *(run.out for run in runs)])
                   + f". The English sentences are longer: {tokens(english):.1f} tokens on average (at most "
                   f"{base['max_tokens']}) against the docstrings' {tokens(docstrings):.1f}, so English makes a step "
                   "dearer, and a `--minutes` budget, which times a batch of the training text's mean length, plans "
                   "fewer steps with it."])


def english_file(parser: argparse.ArgumentParser, text: Path, english: list[str], runs: list[tuple[Path, int]]) -> None:
    """Each finished run of ``runs`` (its directory, the times it names the English file) must have trained on
    ``english`` named as often (a run measured again, on the text the installed packages give now); where any is yet
    to run, ``english`` is written to ``text``, one sentence a line, whole or not at all."""
    for out, times in runs:
        if done(out) and report(out)["user_lines"] != times * len(english):
            parser.error(f"{out} trained on {report(out)['user_lines']} lines of --text, the installed packages give "
                         f"{times} × {len(english)} now: remove it to convert again")
    if not all(done(out) for out, _ in runs):
        write_lines(text, english)


def convert(model: str, out: Path, seed: int, texts: list[Path], options: list[str],
            launcher: tuple[str, ...] = ("lambda-gelu",)) -> None:
    """``lambda-gelu reluize model --out out --seed seed --text texts options`` (``launcher`` in place of
    ``lambda-gelu``: a script that runs the CLI), unless the conversion has finished in ``out``."""
    if not done(out):
        subprocess.run([*launcher, "reluize", model, "--out", str(out), "--seed", str(seed),
                        "--text", *map(str, texts), *options], check=True)


def write_lines(path: Path, lines: list[str]) -> None:
    """``lines`` written to ``path``, one a line, whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def budgeted(runs: list[Run], tag: str) -> str:
    """What the runs that take one time budget planned, and where the docstrings alone are measured in it."""
    names, minutes = ", ".join(f"`{run.out.name}`" for run in runs), runs[0].minutes
    made = [report(run.out) for run in runs]
    note = (f" {names} take{'s' if len(runs) == 1 else ''} a time budget instead, `--minutes {minutes}`"
            + (" (the CLI's default for a causal LM)" if minutes == DEFAULT_MINUTES else "")
            + ", as a user's command would: on the machine that ran them the budget decided the refit, over "
            + ", ".join(str(r["refit_sentences"]) for r in made) + " sentences (a refit takes at most a quarter "
            "of the budget), and the steps: " + ", ".join(f"{r['steps']} of {r['planned_steps']}"
                                                   for r in made)
            + " planned (the steps end where the next would overrun the budget)")
    if minutes == DEFAULT_MINUTES and (where := measured(f"lr{tag}")):
        note += (f". The docstrings alone in this budget are {where}, run on another day (their steps in "
                 "[smollm2_lr.md](smollm2_lr.md))")
    return note + "."


def counterpart(name: str) -> str:
    """Where the docstrings-only run ``name`` is measured on these sets, or that none is."""
    where = measured(name)
    return f" (the same on the docstrings alone: {where})" if where else \
        " (no run on the docstrings alone asks this share)"


def measured(name: str) -> str:
    """A link to the docstrings-only runs ``name`` in studies/smollm2_prose.md, or "" where it measures none."""
    if f"/{name}-" in Path(__file__).parents[1].joinpath("docs", "smollm2_prose.md").read_text(encoding="utf-8"):
        return f"[smollm2_prose.md](smollm2_prose.md)'s `{name}`"
    return ""


def done(directory) -> bool:
    """Whether the conversion written to ``directory`` has finished: its report is written last."""
    return (Path(directory) / "reluize_report.json").is_file()


def report(directory) -> dict:
    """The report of the conversion written to ``directory``."""
    return json.loads((Path(directory) / "reluize_report.json").read_text(encoding="utf-8"))


def english_run(out, minutes: float, seed: int, kind: str = "", times: int = 3, arm: str = "") -> Path:
    """smollm2_budget.py's run of the English text named ``times`` times in ``--text``, in ``out``:
    ``budget<M>-<kind>english<N><arm>-<S>``, ``kind`` what its command adds (``zeros0.85-``, ``frozen-``, ...) and
    ``arm`` another study's arm beside it (``-sampled1536``)."""
    return Path(out) / f"budget{minutes:g}-{kind}english{times}{arm}-{seed}"


def arm_arguments(parser: argparse.ArgumentParser, output: str) -> None:
    """The options of a study that sets an arm beside smollm2_budget.py's English runs at a share of gate zeros: the
    seeds, where the runs go, the doc, the budget and the share."""
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--out", default="runs/smollm2", help="where the runs and the texts are written")
    parser.add_argument("--output", default=output)
    parser.add_argument("--minutes", type=float, default=DEFAULT_MINUTES)
    parser.add_argument("--gate-zeros", type=float, default=0.85, help="the conversions' --gate-zeros (0: none, the "
                        "ReLU gates' own zeros)")


def convert_arms(model: str, args: argparse.Namespace, arms: list[tuple[list[Path], list[Path]]]) -> None:
    """Each arm's runs (one a seed of ``args.seeds``) converted from ``model`` on its ``--text`` files, with the
    budget and the share of gate zeros of :func:`arm_arguments`, unless finished."""
    options = ["--minutes", f"{args.minutes:g}", *(["--gate-zeros", f"{args.gate_zeros:g}"] if args.gate_zeros else []),
               "--quiet"]
    for runs, texts in arms:
        for seed, run in zip(args.seeds, runs):
            convert(model, run, seed, texts, options)


def steps_run(runs: list[Path]) -> str:
    """A doc's line of the steps each finished run took in its budget, and their pace once its refit was done."""
    return "Steps run in the budget (a step takes longer on longer sentences): " + "; ".join(
        f"`{run.name}` {r['steps']} ({(r['seconds'] - 60 * r['curve'][0]['minutes']) / r['steps']:.2f} s a "
        "step after the refit)" for run, r in ((run, report(run)) for run in runs)) + "."


if __name__ == "__main__":
    main()
