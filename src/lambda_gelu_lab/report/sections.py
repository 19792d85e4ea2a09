"""The report's Markdown: one section per experiment (accuracy table, paired comparisons, hardness
profiles, robustness, drift grid) and the table of the paper's findings. Numbers come from
:mod:`.stats`, figures from :mod:`.plots`."""
from __future__ import annotations

import itertools
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from ..arms import ARMS
from .analysis import drift, layer_order, matched_spearman, pairwise_spearman
from .plots import plot_drift, plot_lambdas, plot_sparsity
from .stats import (ALPHA, MARGIN, STABLE_RHO, Comparison, Finding, by_seed, by_variant, drift_cells, mean_sd, paired,
                    paired_by_seed, profiles)

ARM_LABEL = {a.name: a.label for a in ARMS.values()}

SPARSE_GOAL = (0.85, 0.005, 1.02)  # issue goal: ≥ 85% zeros at ≤ 0.5 points accuracy (≤ 2% perplexity) below annealed
# (a, a's metric, b, b's metric, what the difference means)
COMPARISONS = [
    ("lambda-harden", "sub_test_acc", "gelu", "sub_test_acc", "annealed→ReLU − direct swap"),
    ("lambda-harden", "sub_test_acc", "gelu", "test_acc", "annealed→ReLU − GELU original"),
    ("lambda-harden", "sub_test_acc", "relu", "test_acc", "annealed→ReLU − ReLU from scratch"),
    ("lambda-harden", "sub_test_acc", "prelu", "sub_test_acc", "annealed→ReLU − PReLU→ReLU"),
    ("lambda-harden", "sub_test_acc", "swish-harden", "sub_test_acc", "annealed→ReLU − annealed Swish→ReLU"),
    ("lambda-harden", "sub_test_acc", "gelu-finetune", "sub_test_acc", "annealed→ReLU − swap + fine-tune"),
    ("lambda-harden-learn", "sub_test_acc", "lambda-harden", "sub_test_acc",
     "λ learning during the anneal − frozen (the paper), after ReLU"),
    ("reluize-anneal", "sub_test_acc", "reluize-swap", "sub_test_acc", "post-hoc: anneal − swap (equal steps)"),
    ("reluize-anneal", "sub_test_acc", "reluize-blockwise", "sub_test_acc", "post-hoc: anneal − blockwise (equal steps)"),
    ("reluize-blockwise", "sub_test_acc", "gelu", "test_acc", "post-hoc blockwise→ReLU − GELU original"),
    ("reluize-anneal", "sub_test_acc", "gelu", "test_acc", "post-hoc anneal→ReLU − GELU original"),
    ("reluize-swap", "sub_test_acc", "gelu", "test_acc", "post-hoc swap→ReLU − GELU original"),
    ("reluize-swap", "sub_test_acc", "reluize-blockwise", "sub_test_acc", "post-hoc: swap − blockwise (equal steps)"),
    ("reluize-swap", "sub_test_acc", "reluize-swap", "sub_test_acc", "post-hoc: swap − swap at the lab's defaults"),
    ("lambda-harden", "sub_test_acc", "reluize-anneal", "sub_test_acc", "annealed→ReLU in training − post-hoc anneal"),
]
# the word that names an arm in COMPARISONS' texts, after which a variant's settings are written
ARM_WORD = {"reluize-anneal": "anneal", "reluize-swap": "swap", "reluize-blockwise": "blockwise"}


def mean_std(values) -> str:
    v = np.asarray([x for x in values if x is not None], dtype=float)
    if len(v) == 0:
        return "—"
    return mean_sd(v, scale=100)


def reading(c: Comparison) -> str:
    """The comparison in words: a difference (CI excludes 0), equivalence (TOST), or neither."""
    if c.difference == "n/a":
        return "n/a (fewer than two seeds)"
    equivalent = f"equivalent within ±{100 * MARGIN:g}" if c.equivalent else ""
    if c.difference == "higher":
        return "**higher** (CI above 0)" + (f"; {equivalent}" if equivalent else "")
    if c.difference == "lower":
        return "**lower** (CI below 0)" + (f"; {equivalent}" if equivalent else "")
    return f"**{equivalent}** (TOST)" if equivalent else "inconclusive (CI contains 0, equivalence not shown)"


def _ci(c: Comparison) -> str:
    return "—" if math.isnan(c.lo) else f"[{100 * c.lo:+.2f}, {100 * c.hi:+.2f}]"


def _fmt_p(p: float) -> str:
    return "—" if math.isnan(p) else f"{p:.2g}"


def _settings(cfg: dict) -> str:
    keys = ("epochs", "batch_size", "optimizer", "lr", "momentum", "weight_decay", "warmup")
    return ", ".join(f"{k}={cfg[k]}" for k in keys if k in cfg)


def findings_table(found: list[Finding]) -> list[str]:
    if not found:
        return []
    return ["## Which of the paper's findings hold here", "",
            f"Each row is computed from the runs below. A difference needs the 95% CI of the paired difference to "
            f"exclude 0 (*not detected* otherwise); *equivalent* needs TOST to bound it within ±{100 * MARGIN:g} "
            f"points at α = {ALPHA:g} (*inconclusive*: neither shown); one seed gives *n/a*. A profile counts as "
            f"stable when the mean Spearman ρ across seeds is ≥ {STABLE_RHO}.", "",
            "| finding (paper) | task | measured | holds here? |", "|---|---|---|---|",
            *[f"| {f.claim} | {f.task} | {f.measured} | {f.holds} |" for f in found], ""]


def experiment_section(task, base, rs, lambda_rows, img_dir: Path, root: Path, summary: list[str],
                       label: str) -> list[str]:
    """``label`` names the experiment in headings (``stats.experiment_labels``)."""
    variants = by_variant(rs)
    order = sorted(variants, key=lambda v: (list(ARM_LABEL).index(variants[v][0]["arm"])
                                              if variants[v][0]["arm"] in ARM_LABEL else 99, v))
    lines = [f"## {label}", "", f"Experiment `{base}`: {_settings(rs[0]['config'])}.", "",
             "| arm | seeds | test acc | after ReLU | drop | val acc | test loss → after ReLU |",
             "|---|---|---|---|---|---|---|"]
    for v in order:
        g = variants[v]
        arm = g[0]["arm"]
        name = ARM_LABEL.get(arm, arm) + (f" `{v[len(arm):]}`" if v != arm else "")
        sub = [r["sub_test_acc"] for r in g]
        drops = [r["test_acc"] - r["sub_test_acc"] for r in g if r["sub_test_acc"] is not None]
        diverged = sum(bool(r["metrics"].get("diverged")) for r in g)
        loss = np.mean([r["test_loss"] for r in g])
        sub_loss = [r["sub_test_loss"] for r in g if r["sub_test_loss"] is not None]
        losses = f"{loss:.3f}" + (f" → {np.mean(sub_loss):.3f}" if sub_loss else "")
        lines.append(f"| {name}{f' ({diverged} diverged)' if diverged else ''} | {len(g)} | "
                     f"{mean_std(r['test_acc'] for r in g)} | {mean_std(sub)} | {mean_std(drops)} | "
                     f"{mean_std(r['val_acc'] for r in g)} | {losses} |")
    lines.append("")

    # paired comparisons over seeds, for every annealed variant against the shared baselines
    rows = []
    for v in order:
        a_runs = by_seed(variants[v])
        arm = variants[v][0]["arm"]
        for a_arm, a_key, b_arm, b_key, what in COMPARISONS:
            if arm != a_arm or b_arm not in variants or v == b_arm:
                continue
            b_runs = by_seed(variants[b_arm])
            c, seeds = paired_by_seed(a_runs, a_key, b_runs, b_key)
            word = ARM_WORD.get(arm, "annealed")
            name = what if v == arm else what.replace(word, f"{word} `{v[len(arm):]}`", 1)
            if v == a_arm == "lambda-harden" and b_arm == "gelu" and b_key == "sub_test_acc" and c.n:
                a_mean = np.mean([a_runs[s][a_key] for s in seeds])
                b_mean = np.mean([b_runs[s][b_key] for s in seeds])
                drop_a = np.mean([a_runs[s]["test_acc"] - a_runs[s][a_key] for s in seeds])
                drop_b = np.mean([b_runs[s]["test_acc"] - b_runs[s][b_key] for s in seeds])
                summary.append(f"- **{label}** (`{base}`, {c.n} seeds): annealed→ReLU {100 * a_mean:.2f}% "
                               f"(drop {100 * drop_a:.2f}) vs direct swap {100 * b_mean:.2f}% (drop {100 * drop_b:.2f}): "
                               f"{100 * c.mean:+.2f} points, 95% CI {_ci(c)}, p = {_fmt_p(c.p_t)} — "
                               f"annealed→ReLU minus direct swap: {reading(c)}.")
            rows.append(f"| {name} | {c.n} | {100 * c.mean:+.2f} | {_ci(c)} | {_fmt_p(c.p_t)} | {_fmt_p(c.p_w)} | "
                        f"{_fmt_p(c.p_tost)} | {reading(c)} |")
    if rows:
        lines += [f"Paired over seeds (same initialisation and data order), in accuracy points; TOST tests "
                  f"equivalence within ±{100 * MARGIN:g} points:", "",
                  "| difference | pairs | mean | 95% CI | p (paired t) | p (Wilcoxon) | p (TOST) | reading |",
                  "|---|---|---|---|---|---|---|---|", *rows, ""]

    lines += _switch_points(variants, order)
    lines += _sparsity_curve(task, base, variants, order, img_dir, root)
    lines += _profile_table(variants, order)
    lines += _robustness(variants, order)
    png = plot_lambdas(task, base, variants, order, lambda_rows, img_dir)
    if png is not None:
        lines += [f"![λ per layer over training, {task}]({png.relative_to(root).as_posix()})", ""]
    lines += _drift_grid(task, base, variants, img_dir, root)
    return lines


def _switch_points(by_variant, order) -> list[str]:
    """Where switch_at="auto" switched, and its accuracy after ReLU paired against each fixed switch point."""
    auto = [v for v in order
            if by_variant[v][0]["arm"] == "lambda-harden" and by_variant[v][0]["config"]["switch_at"] == "auto"]
    fixed = [v for v in order if by_variant[v][0]["arm"] == "lambda-harden" and v not in auto]
    lines = []
    for v in auto:
        g = by_variant[v]
        where = [r["metrics"]["switch_step"] / r["metrics"]["steps"] for r in g]
        lines.append(f"Automatic switch point (`{v}`, sign patterns of a fixed probe batch): it switched at "
                     f"{mean_sd(where, lone='0')} of training "
                     f"(range {min(where):.2f}–{max(where):.2f}, {len(g)} seeds). " +
                     ("After ReLU, paired against the fixed switch points (accuracy points, automatic minus fixed):"
                      if fixed else "No fixed switch point was run beside it in this experiment."))
        lines.append("")
        if fixed:
            lines += ["| fixed switch | pairs | mean | 95% CI | p (paired t) | p (TOST) | reading |",
                      "|---|---|---|---|---|---|---|"]
        for f in fixed:
            c, _ = paired_by_seed(by_seed(g), "sub_test_acc", by_seed(by_variant[f]), "sub_test_acc")
            at = by_variant[f][0]["config"]["switch_at"]
            lines.append(f"| {at:g} of training (`{f}`) | {c.n} | {100 * c.mean:+.2f} | {_ci(c)} | {_fmt_p(c.p_t)} | "
                         f"{_fmt_p(c.p_tost)} | {reading(c)} |")
        if fixed:
            lines.append("")
    return lines


def _sparsity_curve(task, base, by_variant, order, img_dir: Path, root: Path) -> list[str]:
    """Exact zeros after ReLU against accuracy for each penalty strength, paired by seed against the
    annealed arm without penalty (same switch point)."""
    sparse = sorted((v for v in order if by_variant[v][0]["arm"] == "lambda-harden-sparse"),
                    key=lambda v: by_variant[v][0]["config"]["sparsity"])
    base_arm = [v for v in order if by_variant[v][0]["arm"] == "lambda-harden"]
    if not sparse:
        return []
    min_zeros, max_drop, max_ppl = SPARSE_GOAL
    lines = ["Activation sparsity against quality: `lambda-harden-sparse` adds an L1 penalty on the λ-GELU outputs, "
             "its factor rising from the switch point to its peak (`sparsity`) at 90% of training in three "
             "sine-shaped stages (lambda_gelu.SparsityRegularizer). Exact zeros among all ReLU outputs on the test "
             "set after ReLU-ization; accuracy after ReLU paired by seed against the annealed arm at the same switch "
             f"point (points; the perplexity ratio is exp of the paired mean difference in test loss). Goal: ≥ "
             f"{100 * min_zeros:g}% zeros at ≤ {100 * max_drop:g} points below (≤ {100 * (max_ppl - 1):g}% "
             "perplexity); *met* needs the CI's lower end above −0.5.", "",
             "| arm | penalty peak | seeds | zeros after ReLU | after ReLU | − annealed (pairs) | 95% CI | "
             "perplexity ratio | goal |", "|---|---|---|---|---|---|---|---|---|"]

    def zeros(runs):
        return [r["metrics"].get("sub_zero_fraction") for r in runs]

    points = []  # (label, zeros, accuracy difference)
    for v in base_arm:
        z = [x for x in zeros(by_variant[v]) if x is not None]
        lines.append(f"| `{v}` | 0 | {len(by_variant[v])} | {mean_std(z)} | "
                     f"{mean_std(r['sub_test_acc'] for r in by_variant[v])} | — | — | — | — |")
        if z:
            points.append((0.0, float(np.mean(z)), 0.0))
    for v in sparse:
        g = by_variant[v]
        cfg = g[0]["config"]
        ref = next((b for b in base_arm if by_variant[b][0]["config"]["switch_at"] == cfg["switch_at"]), None)
        z = [x for x in zeros(g) if x is not None]
        cells = ["—"] * 4
        if ref is not None:
            c, seeds = paired_by_seed(by_seed(g), "sub_test_acc", by_seed(by_variant[ref]), "sub_test_acc")
            a, b = by_seed(g), by_seed(by_variant[ref])
            loss = paired([a[s]["sub_test_loss"] for s in seeds], [b[s]["sub_test_loss"] for s in seeds])
            ratio = math.exp(loss.mean) if c.n else math.nan
            zero_mean = float(np.mean(z)) if z else math.nan
            lm = task.endswith("gpt")  # a language model: judged by perplexity
            quality = (ratio <= max_ppl and (math.isnan(loss.hi) or math.exp(loss.hi) <= max_ppl)) if lm else                 (c.mean >= -max_drop and not math.isnan(c.lo) and c.lo >= -max_drop)
            goal = "n/a" if c.n < 2 else "**met**" if zero_mean >= min_zeros and quality else "not met"
            cells = [f"{100 * c.mean:+.2f} ({c.n})", _ci(c), f"{ratio:.3f}", goal]
            points.append((cfg["sparsity"], zero_mean, c.mean))
        lines.append(f"| `{v}` | {cfg['sparsity']:g} | {len(g)} | {mean_std(z)} | "
                     f"{mean_std(r['sub_test_acc'] for r in g)} | " + " | ".join(cells) + " |")
    lines.append("")
    if len(points) > 1:
        path = plot_sparsity(task, base, points, img_dir)
        lines += [f"![sparsity against accuracy, {task}]({path.relative_to(root).as_posix()})", ""]
    return lines


def _robustness(by_variant, order) -> list[str]:
    rows = []
    for v in order:
        arm = by_variant[v][0]["arm"]
        key = {"lambda": "lambda_end", "lambda-harden": "lambda_switch"}.get(arm)
        if key is None:
            continue
        per_seed = profiles(by_variant[v], key)
        r = pairwise_spearman(list(per_seed.values()))
        if r["pairs"] or r["undefined"]:
            flat = f" (+{r['undefined']} with a flat profile)" if r["undefined"] else ""
            when = "end" if key == "lambda_end" else "switch"
            rows.append(f"| {v}: λ at {when} | across seeds | {len(per_seed)} | {r['mean']:.3f} | {r['min']:.3f} | "
                        f"{r['pairs']}{flat} |")
    # the same seeds started from different init_lambda (learned arm, other settings equal)
    by_setting = defaultdict(dict)
    for v in order:
        g = by_variant[v]
        if g[0]["arm"] == "lambda":
            c = g[0]["config"]
            by_setting[(c["temperature"], c["multiplier"])][c["init_lambda"]] = profiles(g, "lambda_end")
    for (t, c), inits in by_setting.items():
        for a, b in itertools.combinations(sorted(inits), 2):
            r = matched_spearman(inits[a], inits[b])
            if r["pairs"]:
                rows.append(f"| lambda (t={t:g}, c={c:g}): λ at end | init λ₀={a:g} vs {b:g} | {r['pairs']} | "
                            f"{r['mean']:.3f} | {r['min']:.3f} | {r['pairs']} |")
    if not rows:
        return []
    return ["Robustness of the layerwise profile: Spearman rank correlation of λ across layers, between every "
            "pair of seeds, and between initialisations for the same seed.", "",
            "| profile | between | seeds | mean ρ | min ρ | pairs |", "|---|---|---|---|---|---|", *rows, ""]


def _drift_grid(task, base, by_variant, img_dir: Path, root: Path) -> list[str]:
    init, cells = drift_cells(by_variant)
    if len(cells) < 2:
        return []
    ts, cs = sorted({t for t, _ in cells}), sorted({c for _, c in cells})
    lines = [f"Hardness drift Δλ = mean over layers of (λ_end − λ_init), learned arm from λ₀ = {init:g}, over "
             "temperature t (rows) and learning-rate multiplier c (columns); test accuracy of the λ-GELU network "
             "in brackets. Mean ± std over seeds (a cell without ± has one seed).", "",
             "| t \\ c | " + " | ".join(f"{c:g}" for c in cs) + " |", "|---" * (len(cs) + 1) + "|"]
    grid = np.full((len(ts), len(cs)), np.nan)
    for i, t in enumerate(ts):
        row = []
        for j, c in enumerate(cs):
            runs = cells.get((t, c), [])
            if not runs:
                row.append("—")
                continue
            d = np.array([drift(init, r["metrics"]["lambda_end"]) for r in runs])
            grid[i, j] = d.mean()
            acc = mean_std(r["test_acc"] for r in runs)
            spread = f" ± {d.std(ddof=1):.2f}" if len(d) > 1 else ""  # one seed: no spread to show
            row.append(f"{d.mean():+.2f}{spread} ({acc})")
        lines.append(f"| {t:g} | " + " | ".join(row) + " |")
    path = plot_drift(task, base, ts, cs, grid, img_dir)
    return lines + ["", f"![hardness drift, {task}]({path.relative_to(root).as_posix()})", ""]


def _profile_table(by_variant, order) -> list[str]:
    cols = []  # (header, {layer: [values]})
    for v in order:
        g = by_variant[v]
        if g[0]["arm"] == "lambda":
            cols.append((f"{v}: λ at end", _collect(g, "lambda_end")))
        elif g[0]["arm"] == "lambda-harden":
            cols.append((f"{v}: λ at switch", _collect(g, "lambda_switch")))
        elif g[0]["arm"] == "lambda-harden-learn":  # and where its still-learning λ(s) went under the anneal
            cols += [(f"{v}: λ at switch", _collect(g, "lambda_switch")),
                     (f"{v}: its λ(s) at end", _collect(g, "lambda_learned_end"))]
    cols = [c for c in cols if c[1]]
    if not cols:
        return []
    layers = layer_order({layer for _, d in cols for layer in d})
    out = ["Layerwise hardness profile (learned λ per activation layer, mean ± std over seeds):", "",
           "| layer | " + " | ".join(h for h, _ in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for layer in layers:
        cells = []
        for _, d in cols:
            v = np.asarray(d.get(layer, []), float)
            cells.append("—" if len(v) == 0 else mean_sd(v, "{:.3f}", lone="0"))
        out.append(f"| {layer} | " + " | ".join(cells) + " |")
    return out + [""]


def _collect(runs, key) -> dict[str, list[float]]:
    d = defaultdict(list)
    for r in runs:
        for layer, v in (r["metrics"].get(key) or {}).items():
            d[layer].append(v)
    return d
