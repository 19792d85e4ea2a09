"""Does the CLI's default budget for a causal LM (`--minutes 30`) plan the steps it runs? SmolLM2-135M converted by the
default command with smollm2_english.py's English text named three times in `--text`, the command a user who wants
English kept would give; each run's refit, planned and run steps and where its linear lr ended, then its perplexity on
smollm2_prose.py's three held-out sets. Writes docs/smollm2_budget.md.

    python experiments/smollm2_budget.py   # seeds 0 1 2: ~30 minutes a missing run on 2 cores, ~3 measuring each
    python experiments/smollm2_budget.py --before runs/smollm2/budget30-estimated-english3-{0,1,2}

The steps are planned once the refit is done, for what it really left of the budget. Before, they were planned
beforehand for what the refit's estimate would leave (that estimate and the step's came out above the real times:
26-27 of the 30 minutes used); before that, a refit batch counted as 1.75 steps (MiniLM's ratio), which on SmolLM2
left its refit less than half its time: smollm2_english.md's `min30` runs planned 129-157 steps and ran 122-136,
their lr cut at 5-22% of its peak. `--before` measures finished runs of an earlier planner beside these.
The plan rests on seconds of timing: run beside another job on the machine, seed 1 planned 8.2 s a step that then took
5.3 s and used 20 of the 30 minutes; docs/smollm2_budget.md holds its run made again with the machine to itself.
"""
from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

from smollm2_english import done, english_file, package_prose, report
from smollm2_prose import given, text_sets, write

MODEL = "smollm2-135m-instruct"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--out", default="runs/smollm2", help="where the runs and the English text are written")
    parser.add_argument("--output", default="docs/smollm2_budget.md")
    parser.add_argument("--before", nargs="+", default=[], help="finished runs of the same command with an earlier "
                        "planner (the steps planned from the refit's estimate), measured beside these")
    args = parser.parse_args()
    sets = text_sets()  # the held-out sets: kept out of the English text, then measured on
    english, packages = package_prose({s for sentences, _ in sets.values() for s in sentences})
    text, runs = Path(args.out) / "english.txt", [Path(args.out) / f"budget30-english3-{s}" for s in args.seeds]
    before = [Path(d) for d in args.before]
    english_file(parser, text, english, [(run, 3) for run in runs + before])
    for seed, run in zip(args.seeds, runs):
        if not done(run):
            subprocess.run(["lambda-gelu", "reluize", MODEL, "--out", str(run), "--seed", str(seed),
                            "--text", *[str(text)] * 3, "--quiet"], check=True)
    made = {run: report(run) for run in runs + before}
    rows = ["| run | budget | refit: sentences, minutes | steps planned | steps run | lr at the end, of its peak | "
            "minutes |", "|---|---|---|---|---|---|---|"]
    for run, r in made.items():
        refit = next((p["minutes"] for p in r["curve"] if p["step"] == 0), 0.0)
        end = 1 - r["steps"] / r["planned_steps"] if r["lr_schedule"] == "linear" else 1.0
        rows.append(f"| `{run.name}` | {r['budget_minutes']:g} | {r['refit_sentences']}, {refit:.1f} | "
                    f"{r['planned_steps']} | {r['steps']} | {end:.0%} | {r['seconds'] / 60:.1f} |")
    command = " ".join(["python experiments/smollm2_budget.py", *given(parser, args)])
    write([str(run) for run in runs + before], args.output, command, sets=sets,
          title="SmolLM2-135M → exact ReLU in the CLI's default 30 minutes, with English text", preface=[
        f"The CLI's default command for a causal LM, `lambda-gelu reluize {MODEL} --seed S --text E E E` (a "
        f"`--minutes 30` budget, lr {next(iter(made.values()))['settings']['lr']:g}), E the English text of "
        f"[smollm2_english.md](smollm2_english.md): {len(english)} prose sentences of {packages} installed packages' "
        "READMEs, none in the held-out sets below. The budget sizes the refit from an estimate (at most a quarter "
        "of it) and, once the refit is done, plans the steps for what it really left; a linear lr decays to 0 over "
        "the planned steps, and the steps end early only where the next would overrun the budget. Minutes are the "
        "report's, the measuring left out (it measures the held-out docstrings at eight points).", "", *rows, "",
        *([f"{', '.join(f'`{d.name}`' for d in before)}: the same command when the steps were planned before the "
           "refit, for what its estimate would leave, on an earlier day (part of any difference may be the "
           "machine's)."] if before else []),
        "The same command when a refit batch counted as 1.75 steps (MiniLM's ratio) and the steps overran their "
        "plan: [smollm2_english.md](smollm2_english.md)'s `english3-min30-lr5e-4` runs, on another day."])


if __name__ == "__main__":
    main()
