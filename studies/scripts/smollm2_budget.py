"""Does the CLI's default budget for a causal LM (`--minutes 30`) plan the steps it runs? SmolLM2-135M converted by the
default command with smollm2_english.py's English text named three times in `--text`, the command a user who wants
English kept would give; each run's refit, planned and run steps and where its linear lr ended, then its perplexity on
smollm2_prose.py's three held-out sets. Writes studies/smollm2_budget.md.

    python studies/scripts/smollm2_budget.py   # seeds 0 1 2: ~30 minutes a missing run on 2 cores, ~3 measuring each
    python studies/scripts/smollm2_budget.py --before runs/smollm2/budget30-float32-english3-{0,1,2}
    python studies/scripts/smollm2_budget.py --output studies/smollm2_budget_frozen.md --embeddings freeze
    python studies/scripts/smollm2_budget.py --output studies/smollm2_budget_zeros.md --minutes 90 --gate-zeros 0.85 --seeds 0
    python studies/scripts/smollm2_budget.py --output studies/smollm2_budget_long.md --minutes 120 --seeds 0
    python studies/scripts/smollm2_budget.py --output studies/smollm2_budget_english6.md --gate-zeros 0.85 --english-times 6 \
        --seeds 0
    python studies/scripts/smollm2_budget.py --output studies/smollm2_budget_batch16.md --gate-zeros 0.85 --batch-size 16 \
        --seeds 0
    python studies/scripts/smollm2_budget.py --output studies/smollm2_budget_atonce.md --gate-zeros 0.85 --at-once --seeds 0
    python studies/scripts/smollm2_budget.py --output studies/smollm2_budget_lr1e-3.md --gate-zeros 0.85 --lr 0.001 --seeds 0

The steps multiply in bfloat16 where the CPU does so natively (`precision` auto, a causal LM's default; the
`budget30-float32-english3-*` runs multiplied in float32, on another day) and leave the token embeddings and the output
layer as the original's with `--embeddings freeze` (runs `budget30-frozen-english3-*`; write them to their own
`--output`), where the default trains them. `--minutes` and `--gate-zeros` give the conversions another budget and a
share of exact gate zeros to reach (runs `budget<M>-zeros<Z>-english3-*`), `--batch-size` another number of sentences a
step, `--ramp` another fraction of the steps over which the threshold's share rises, `--at-once` the share reached at
once, before the refit, and `--lr` another learning rate; a doc with the threshold adds each layer's zeros, and one with
the threshold or any of those five the held-out docstrings measured along the way; those five also measure the same
command's runs of the same seeds with the defaults beside their own. The steps are planned once the refit is done, for
what it really left of the budget, a step timed in its parts (the teacher's forward; the student's forward, loss and
backward; AdamW's update), then planned again at each eighth of them from the pace they really kept. Before, they were
planned once, a step as 1.5x a timed forward and backward (MiniLM's ratio), 15-18% above SmolLM2's real steps: 26 of the
30 minutes used (runs `budget30-ratio-english3-*`; a step timed in its parts came out 21% above on one run); before
that, the steps were planned before the refit for what its estimate would leave (`budget30-estimated-english3-*`, 26-27
minutes used); before that, a refit batch counted as 1.75 steps, which on SmolLM2 left its refit less than half its
time: smollm2_english.md's `min30` runs planned 129-157 steps and ran 122-136, their lr cut at 5-22% of its peak.
`--before` measures finished runs of an earlier planner beside these. A plan made once rested on seconds of timing: run
beside another job on the machine, a seed planned 8.2 s a step that then took 5.3 s and used 20 of the 30 minutes. Run
these with the machine to itself all the same: a step slowed by other work is a step fewer. The machine's own speed
moves too, from day to day and within a day: the steps ran at 4.7-5.8 s on the days the runs planned once were made,
5.9-6.2 s on the day of the float32 re-planned runs (whose refit the estimate cut to 512-640 sentences), 4.8-5.2 s in
bfloat16 (refit 544-768 sentences): a slow day's 30 minutes hold fewer steps and a smaller refit. With the faster step
and refit: 4.0-4.4 s, refits of 1024 sentences in 2 minutes. benchmarks/bench_distill.py times the two precisions side
by side, and under bfloat16 the step as it is (eager attention, the KL in chunks) beside the step these runs'
predecessors took (SDPA attention, the plain KL: 1.70x slower on an AMD CPU, 1.49x on the Intel CPU with AMX the
default's runs were made on); the frozen runs took that slower step.
"""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import NamedTuple

from lambda_gelu.hf.convert import EMBEDDINGS, ConversionConfig
from lambda_gelu.reluize import ReluizeConfig
from lambda_gelu.reluize.config import CAUSAL_LR
from smollm2_english import convert, done, english_file, english_run, package_prose, report
from smollm2_prose import given, text_sets, write

MODEL = "smollm2-135m-instruct"
DEFAULT_MINUTES = ConversionConfig.DEFAULT_MINUTES_CAUSAL
DEFAULT_BATCH = next(f.default for f in dataclasses.fields(ConversionConfig) if f.name == "batch_size")
DEFAULT_RAMP = ReluizeConfig.anneal  # the threshold's ramp is the anneal fraction
EMBEDDING_NOTES = {"freeze": "the token embeddings and the output layer left as the original's",
              "train": "the token embeddings and the output layer trained too"}
PLANNERS = {  # the --before runs this doc has shown, by name: how their steps were planned
    "budget30-float32-english3": "when its steps multiplied in float32, planned as here",
    "budget30-ratio-english3": "when the steps were planned once, after the refit, a step as 1.5× a timed "
                               "forward and backward (MiniLM's ratio)",
    "budget30-estimated-english3": "when the steps were planned before the refit, for what its estimate would leave",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--out", default="runs/smollm2", help="where the runs and the English text are written")
    parser.add_argument("--output", default="studies/smollm2_budget.md")
    parser.add_argument("--before", nargs="+", default=[], help="finished runs of the same command by an earlier "
                        "planner (PLANNERS names those this doc has shown), measured beside these")
    parser.add_argument("--embeddings", choices=EMBEDDINGS, default="train", help="the conversions' "
                        "--embeddings: freeze leaves the token embeddings and the output layer as the original's")
    parser.add_argument("--minutes", type=float, default=DEFAULT_MINUTES, help="the conversions' --minutes")
    parser.add_argument("--gate-zeros", type=float, default=0.0, help="the conversions' --gate-zeros: the share of "
                        "the gates' outputs, averaged over the layers, made exact zeros (0: the threshold left off)")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH, help="the conversions' --batch-size: "
                        "sentences a step (runs `budget<M>-batch<B>-...`)")
    parser.add_argument("--ramp", type=float, default=DEFAULT_RAMP, help="the conversions' --anneal, with "
                        "--gate-zeros: the fraction of the steps over which the share of zeros rises to it (runs "
                        "`budget<M>-zeros<Z>-ramp<R>-...`)")
    parser.add_argument("--at-once", action="store_true", help="the conversions' --gate-zeros-at-once, with "
                        "--gate-zeros: the gates lowered to the share at once, before the refit, which then solves "
                        "each FFN's down for them (runs `budget<M>-zeros<Z>-atonce-...`)")
    parser.add_argument("--lr", type=float, default=CAUSAL_LR, help="the conversions' --lr (default: the CLI's for "
                        "a causal LM, with or without --gate-zeros; runs `budget<M>-...-lr<L>-english3-S`)")
    parser.add_argument("--english-times", type=int, default=3, help="how many times the conversions' --text names "
                        "the English text (runs `...english<N>-S`)")
    args = parser.parse_args()
    sets = text_sets()  # the held-out sets: kept out of the English text, then measured on
    english, packages = package_prose({s for sentences, _ in sets.values() for s in sentences})
    frozen, zeros, default = args.embeddings == "freeze", args.gate_zeros, args.minutes == DEFAULT_MINUTES
    if (args.ramp != DEFAULT_RAMP or args.at_once) and not zeros:
        parser.error("--ramp and --at-once are the threshold's: give --gate-zeros too")
    changes = variations(args.minutes, args.batch_size, args.ramp, args.at_once, args.lr)
    options = [*(option for change in changes for option in change.options),
               *(["--experimental-embeddings", "freeze"] if frozen else []), *(["--gate-zeros", f"{zeros:g}"] if zeros else [])]
    kind = ("frozen-" if frozen else "") + (f"zeros{zeros:g}-" if zeros else "")
    text = Path(args.out) / "english.txt"
    times = args.english_times
    runs = [english_run(args.out, args.minutes, s, kind + "".join(c.tag for c in changes), times) for s in args.seeds]
    before = [Path(d) for d in args.before]
    # another budget, batch size or ramp: the same command's runs of the same seeds with the defaults, where finished
    beside = [run for s in args.seeds
              if changes and done(run := english_run(args.out, DEFAULT_MINUTES, s, kind, times))]
    english_file(parser, text, english, [(run, times) for run in runs + before + beside])
    for seed, run in zip(args.seeds, runs):
        convert(MODEL, run, seed, [text] * times, [*options, "--quiet"])
    made = {run: report(run) for run in runs + before + beside}
    rows = ["| run | precision | embeddings | budget | refit: sentences, minutes | a step timed, run (s) | steps "
            "planned: first, last | plans made again | steps run | lr at the end, of its peak | minutes |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for run, r in made.items():
        refit = next((p["minutes"] for p in r["curve"] if p["step"] == 0), 0.0)
        end = 1 - r["steps"] / r["planned_steps"] if r["lr_schedule"] == "linear" else 1.0
        step = (r["seconds"] - 60 * refit) / r["steps"]
        plans = r.get("plans")  # the reports of the planners before did not keep their plans
        timed, first = (f"{plans[0]['step_seconds']:.2f}", plans[0]["steps"]) if plans else ("—", r["planned_steps"])
        rows.append(f"| `{run.name}` | {r.get('precision', 'float32')} | {r.get('embeddings', 'train')} | "
                    f"{r['budget_minutes']:g} | "
                    f"{r['refit_sentences']}, {refit:.1f} | {timed}, "
                    f"{step:.2f} | {first}, {r['planned_steps']} | {len(plans) - 1 if plans else '—'} | "
                    f"{r['steps']} | {end:.0%} | "
                    f"{r['seconds'] / 60:.1f} |")
    earlier = {}  # the runs of each earlier planner, by the name they share
    for run in before:
        earlier.setdefault(run.name.rsplit("-", 1)[0], []).append(run)
    command = " ".join(["python studies/scripts/smollm2_budget.py", *given(parser, args)])
    first = next(iter(made.values()))
    # the weight the runs ran at: by default 4 with --gate-zeros since that was measured, 1 before it and without
    weighed = " or ".join(sorted({f"{made[run]['settings'].get('hidden_weight', 1):g}" for run in runs}))
    asked = [c.says for c in changes] + ([f"asked for {zeros:.0%} exact gate zeros"] if zeros else [])
    asked = ", " + ", ".join(asked[:-1]) + (" and " if len(asked) > 1 else "") + asked[-1] if asked else ""
    write([str(run) for run in runs + before + beside], args.output, command, sets=sets,
          title="SmolLM2-135M → exact ReLU in " + ("the CLI's default 30" if default else f"{args.minutes:g}")
          + " minutes, with English text" + (", the embeddings frozen" if frozen else "")
          + "".join(f", {c.says}" for c in changes if not c.says.startswith("given"))
          + (f", {zeros:.0%} exact gate zeros" if zeros else ""), preface=[
        f"The CLI's default command for a causal LM{', the embeddings frozen' if frozen else ''}{asked}, "
        f"`lambda-gelu reluize {MODEL} --seed S --text{' E' * times}{''.join(' ' + o for o in options)}` (a "
        f"`--minutes {args.minutes:g}` budget, lr {first['settings']['lr']:g}, the loss's hidden-state term weighed "
        f"{weighed}, "
        f"{EMBEDDING_NOTES[first.get('embeddings', 'train')]}), E the English text of "
        f"[smollm2_english.md](smollm2_english.md): {len(english)} prose sentences of {packages} installed packages' "
        "READMEs, none in the held-out sets below. The budget sizes the refit from an estimate (at most a quarter "
        "of it) and, once the refit is done, plans the steps for what it really left, a step timed in its parts (the "
        "teacher's forward; the student's forward, loss and backward; AdamW's update), then plans again at each "
        "eighth of the steps from the pace they really kept; a linear lr decays to 0 over the steps last planned, "
        "and the steps end early only where the next would overrun the budget. Minutes are the "
        "report's, the measuring left out (it measures the held-out docstrings at eight points)."
        + (f" `--gate-zeros {zeros:g}` gives every gate a bias, lowered "
           + ("at once" if args.at_once else "step by step") + f" until {zeros:.0%} of the gates' outputs, averaged "
           "over the layers, are exact zeros: "
           + ("on the refit's sentences before the refit, whose least squares then solve each FFN's `down` for the "
              "shifted gates, and the steps hold the share" if args.at_once else
              "a share reached over the first " + ("half" if args.ramp == 0.5 else f"{args.ramp:.0%}")
              + " of the steps") + "; the biases train with the rest." if zeros else ""), "", *rows, "",
        *(f"{', '.join(f'`{d.name}`' for d in group)}: the same command {PLANNERS.get(name, 'planned earlier')}, "
          "made earlier (part of any difference may be the machine's)." for name, group in earlier.items()),
        *closing(frozen, zeros, default),
        *([] if times == 3 else ["", *named_three_times(Path(args.out), runs, made)])],
        after=lambda ratios: [*(zeros_by_layer(runs, made) if zeros else []),
                              *(along_the_way(runs + beside, made, zeros, args.at_once) if zeros or beside else []),
                              *(compared(" and ".join(c.against for c in changes), runs, beside, made, ratios)
                                if beside else [])])


def closing(frozen: bool, zeros: float, default: bool) -> list[str]:
    """The lines after a doc's table of runs: where the same command was measured before, or without the threshold."""
    if zeros:
        return ["The threshold before the step and the refit were made faster: 347 steps and a refit of 704 "
                "sentences, about 72 minutes, the same English text named three times, English outside Python ×1.907 "
                "at 87% gate zeros and ×1.338 at 75% ([smollm2_english.md](smollm2_english.md)'s `english3-zeros*` "
                "runs, one seed each). The default 30 minutes without it: [smollm2_budget.md](smollm2_budget.md)."]
    if not default:
        return [] if frozen else [
            "A 120-minute budget when the CLI's default lr was 5e-5 and the conversion trained on the docstrings "
            "alone, with the step and refit of that time: [smollm2_long.md](smollm2_long.md) (1581 steps, the "
            "docstrings ×1.019; one seed)."]
    return [("The same command with the embeddings trained (the default): [smollm2_budget.md](smollm2_budget.md), "
             "made later on an Intel CPU with AMX, with a faster step (eager attention and the KL in chunks under "
             "bfloat16, [performance.md](performance.md)) and refit: these runs took the slower ones.") if frozen else
            ("Before the step was made faster (eager attention and the KL in chunks under bfloat16, "
             "[performance.md](performance.md)) and the refit too (each batch's forward paused at each activation, "
             "the layers solved by Cholesky), the same command on an Intel CPU with AMX ran 243-305 steps after "
             "refits of 544-768 sentences: English outside Python ×1.256 ± 0.019, the docstrings ×0.990 ± 0.007 "
             "(the runs are gone; [guide.md](guide.md) keeps their numbers)."),
            "The same command when a refit batch counted as 1.75 steps (MiniLM's ratio) and the steps overran their "
            "plan: [smollm2_english.md](smollm2_english.md)'s `english3-min30-lr5e-4` runs, on another day."]


def named_three_times(out: Path, runs: list[Path], made: dict[Path, dict]) -> list[str]:
    """Where the same command with the English text named three times is measured, and how its refit compares."""
    three = [out / run.name.replace(run.name.split("-")[-2], "english3") for run in runs]
    lines = ["The same command with the English text named three times: "
             + ", ".join(f"`{run.name}`" for run in three) + " in [smollm2_layer_zeros.md](smollm2_layer_zeros.md), "
             "measured on these sets."]
    if all(done(run) for run in three):
        lines[0] += " Refits and steps there, against here: " + "; ".join(
            f"{report(a)['refit_sentences']} sentences and {report(a)['steps']} steps against "
            f"{made[b]['refit_sentences']} and {made[b]['steps']}" for a, b in zip(three, runs)) + (
            ". A refit is cut where its estimate says it would take more than a quarter of the budget: an estimate "
            "made while another job shares the machine cuts it.")
    return lines


def zeros_by_layer(runs: list[Path], made: dict[Path, dict]) -> list[str]:
    """What a threshold's doc adds: each layer's exact gate zeros on the held-out docstrings."""
    lines = ["Each layer's exact gate zeros on the held-out docstrings (%):", "",
             "| layer | " + " | ".join(f"`{run.name}`" for run in runs) + " |", "|---|" + "---|" * len(runs)]
    return lines + [f"| {layer} | " + " | ".join(f"{100 * made[run]['zeros'][layer]:.1f}" for run in runs) + " |"
                    for layer in made[runs[0]]["zeros"]] + [""]


def along_the_way(runs: list[Path], made: dict[Path, dict], zeros: float, at_once: bool = False) -> list[str]:
    """The held-out docstrings measured along each run (the curve its report keeps)."""
    lines = ["The held-out docstrings along the way (step 0: the swap and the refit"
             + (", the gates lowered at once before the refit in the runs marked `atonce`, not yet in the others"
                if at_once else ", the threshold not yet lowered" if zeros else "") + "):", "",
             "| run | step | minutes | perplexity ÷ original | predictions kept |", "|---|---|---|---|---|"]
    return lines + [f"| `{run.name}` | {p['step']} | {p['minutes']:.1f} | ×{p['perplexity_ratio']:.3f} | "
                    f"{p['agreement']:.3f} |" for run in runs for p in made[run]["curve"]]


class Variation(NamedTuple):
    """How a run differs from the default command: its CLI options, its runs' tag, what the doc says of it, and what it
    says against the default."""
    options: list[str]
    tag: str
    says: str
    against: str


def variations(minutes: float, batch: int, ramp: float, at_once: bool, lr: float) -> list[Variation]:
    """The ways the runs differ from the default command, in the order their options are given."""
    every = [(minutes != DEFAULT_MINUTES,
              Variation(["--minutes", f"{minutes:g}"], "", f"given a {minutes:g}-minute budget",
                        f"{minutes:g} minutes against the default {DEFAULT_MINUTES:g}")),
             (batch != DEFAULT_BATCH,
              Variation(["--batch-size", str(batch)], f"batch{batch}-", f"{batch} sentences a step",
                        f"{batch} sentences a step against the default {DEFAULT_BATCH}")),
             (ramp != DEFAULT_RAMP,
              Variation(["--anneal", f"{ramp:g}"], f"ramp{ramp:g}-", f"the zeros reached over {ramp:.0%} of the steps",
                        f"the zeros reached over {ramp:.0%} of the steps against the default {DEFAULT_RAMP:.0%}")),
             (at_once,
              Variation(["--experimental-gate-zeros-at-once"], "atonce-", "the zeros reached at once, before the refit",
                        f"the zeros reached at once, before the refit, against over {DEFAULT_RAMP:.0%} of the steps")),
             (lr != CAUSAL_LR,
              Variation(["--lr", f"{lr:g}"], f"lr{lr:g}-", f"at lr {lr:g}", f"an lr of {lr:g} against the default "
                        f"{CAUSAL_LR:g}"))]
    return [variation for differs, variation in every if differs]


def compared(how: str, runs: list[Path], beside: list[Path], made: dict[Path, dict],
             ratios: dict[str, dict[str, float]]) -> list[str]:
    """Runs that differ from the default command by ``how`` against the default command's runs of the same seeds, on
    each held-out set (``ratios``: {checkpoint: {set: perplexity ÷ the original's}})."""
    pairs = [(run, short) for run in runs for short in beside if run.name.rsplit("-", 1)[1] == short.name.rsplit(
        "-", 1)[1]]
    sets = list(ratios[str(beside[0])])
    return ["", f"{how[0].upper()}{how[1:]} ("
            + ", ".join(f"`{run.name}` against `{short.name}`: {made[run]['steps']} steps against "
                        f"{made[short]['steps']}" for run, short in pairs) + "): "
            + "; ".join(f"{name} " + ", ".join(f"×{ratios[str(a)][name]:.3f} against ×{ratios[str(b)][name]:.3f}"
                                             for a, b in pairs) for name in sets) + "."]


if __name__ == "__main__":
    main()
