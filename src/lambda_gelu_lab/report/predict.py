"""Does hardness drift predict deployment quality? Spearman correlations, over stored runs, between what λ
learned and what the ReLU network it became is worth (the reviewers: "Δλ is a proxy without established
correlation to deployment quality")."""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import numpy as np
from scipy import stats

from ..arms import ARMS
from .analysis import drift
from .plots import plot_drift_scatter

MIN_RUNS = 5  # fewer runs (or variants) than this give no correlation worth a row
VARIANT_MEANS = "variant means"
# arm → the λ profile it learned (before any anneal): the learned arm's at the end, the others' at the switch
LEARNED = {a.name: a.learned_profile for a in ARMS.values() if a.learned_profile}


def _predictors(run: dict) -> dict[str, float] | None:
    key = LEARNED.get(run["arm"])
    profile = run["metrics"].get(key) if key else None
    if not profile:
        return None
    values = np.array(list(profile.values()), float)
    return {"Δλ": drift(run["config"]["init_lambda"], profile), "profile spread": float(np.ptp(values))}


def _outcomes(run: dict, deployed: dict) -> dict[str, float]:
    out = {}
    if run["sub_test_acc"] is not None:
        out["after ReLU"] = run["sub_test_acc"]
        out["substitution drop"] = run["test_acc"] - run["sub_test_acc"]
    d = deployed.get((run["task"], run["base_hash"], run["seed"])) if run["variant"] == "lambda-harden" else None
    if d and "int8" in d:
        out["int8 acc"] = d["int8"]["int8_acc"]
    if d and "verify" in d:  # the exactly verified fraction at the middle radius (the others are easy or hopeless)
        radii = sorted((k for k, c in d["verify"].items() if isinstance(c, dict) and "verified" in c), key=float)
        if radii:
            eps = radii[len(radii) // 2]
            out[f"verified (ε={eps})"] = d["verify"][eps]["verified"] / max(1, d["verify"][eps]["points"])
    return out


def _mean(variant: str, units: list) -> tuple:
    """One variant as one point: its predictors and outcomes averaged over its runs (each outcome over the
    runs that have it). Runs of different variants share seeds (the same initial weights, data order and,
    up to the switch, the same training), so pooling the runs themselves would count one seed's evidence
    several times and shrink p; across variants, each setting is one observation."""
    def mean(dicts: list[dict]) -> dict[str, float]:
        keys = {k for d in dicts for k in d}
        return {k: float(np.mean([d[k] for d in dicts if k in d])) for k in keys}
    return variant, mean([x for _, x, _ in units]), mean([o for _, _, o in units])


def _reading(rho: float, p: float) -> str:
    if math.isnan(rho):
        return "undefined (a constant column)"
    if p >= 0.05:
        return "no association detected"
    return ("**positive**" if rho > 0 else "**negative**") + (" (strong)" if abs(rho) >= 0.7 else "")


def drift_section(runs: list[dict], deploy_rows, img_dir: Path, root: Path) -> list[str]:
    deployed = defaultdict(dict)
    for task, base, seed, model, section, data in deploy_rows:
        if model == "annealed→ReLU":
            deployed[(task, base, seed)][section] = data
    by_task = defaultdict(list)  # task → [(variant, predictors, outcomes)]
    for r in runs:
        x = _predictors(r)
        if x is not None:
            by_task[r["task"]].append((r["variant"], x, _outcomes(r, deployed)))
    rows, plots = [], []
    for task, units in by_task.items():
        groups = defaultdict(list)
        for unit in units:
            groups[unit[0]].append(unit)
        scopes = [(f"`{v}`", g) for v, g in sorted(groups.items())]
        if len(groups) > 1:
            scopes.append((VARIANT_MEANS, [_mean(v, g) for v, g in sorted(groups.items())]))
        for scope, g in scopes:
            for predictor in ("Δλ", "profile spread"):
                outcomes = sorted({k for _, _, o in g for k in o})
                for outcome in outcomes:
                    pairs = [(x[predictor], o[outcome]) for _, x, o in g if outcome in o]
                    if len(pairs) < MIN_RUNS:
                        continue
                    a, b = np.array(pairs).T
                    if np.ptp(a) == 0 or np.ptp(b) == 0:
                        rho, p = math.nan, math.nan
                    else:
                        res = stats.spearmanr(a, b)
                        rho, p = float(res.statistic), float(res.pvalue)
                    rows.append(f"| {task} | {scope} | {predictor} | {outcome} | {len(pairs)} | "
                                f"{'—' if math.isnan(rho) else f'{rho:+.2f}'} | "
                                f"{'—' if math.isnan(p) else f'{p:.2g}'} | {_reading(rho, p)} |")
        plots.append(plot_drift_scatter(task, [(v, x["Δλ"], o.get("after ReLU")) for v, x, o in units], img_dir))
    if not by_task:
        return []
    intro = ("For every stored run that learned λ: its hardness drift Δλ (mean over layers of λ learned − λ₀; λ at the "
             "switch for the annealed arms, at the end for the learned arm) and the spread of its layerwise profile "
             "(max − min λ), against the quality of the ReLU network it became: accuracy after ReLU, the substitution "
             "drop, and — where `lambda-gelu deploy` measured the annealed run of that seed — int8 accuracy and the "
             "exactly verified fraction. Spearman ρ within each variant (one point per seed), and across the variants "
             f"of a task (*{VARIANT_MEANS}*: one point per setting, its mean over seeds; runs of different variants "
             "share seeds, so pooling the runs themselves would count one seed several times).")
    if rows:
        table = [f"p is uncorrected for the {len(rows)} tests in this table: read a single p < 0.05 with care. Groups "
                 f"of fewer than {MIN_RUNS} runs or variants are left out.", "",
                 "| task | runs | predictor | outcome | n | Spearman ρ | p | reading |",
                 "|---|---|---|---|---|---|---|---|", *rows]
    else:
        table = [f"No variant has {MIN_RUNS} runs yet, and no task {MIN_RUNS} variants: too few for a correlation."]
    return ["## Does hardness drift predict deployment quality?", "", intro, "", *table, "",
            *[f"![Δλ against accuracy after ReLU, {t}]({p.relative_to(root).as_posix()})" for t, p in zip(by_task, plots)],
            ""]
