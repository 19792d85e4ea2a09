"""The report's statistics, as data: paired comparisons over seeds, equivalence tests, and the
paper's findings with the verdict the runs give. Nothing here writes Markdown.

Every comparison pairs runs by seed (same initialisation and data order). "Higher"/"lower" needs the
95% t-interval of the mean paired difference to exclude 0. "Equivalent" needs a two one-sided
t-tests procedure (TOST) to reject a difference of ±``MARGIN`` or more at α = 0.05 — a CI that
merely contains 0 is absence of evidence, not equivalence, and is reported as *inconclusive*.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
from scipy import stats

from ..config import EXPERIMENT_FIELDS
from .analysis import drift, pairwise_spearman

MARGIN = 0.005     # equivalence margin: ±0.5 accuracy points
ALPHA = 0.05
STABLE_RHO = 0.8   # a layerwise profile counts as stable across seeds when the mean Spearman ρ reaches this


@dataclass(frozen=True)
class Comparison:
    """a − b over the seeds both have: mean, 95% CI, p-values, and what they allow one to say."""
    n: int
    mean: float
    lo: float = math.nan      # 95% t-interval
    hi: float = math.nan
    p_t: float = math.nan     # paired t-test
    p_w: float = math.nan     # Wilcoxon signed-rank
    p_tost: float = math.nan  # TOST against ±MARGIN

    @property
    def difference(self) -> str:
        """'higher', 'lower', 'not detected', or 'n/a' (fewer than two seeds)."""
        if self.n < 2 or math.isnan(self.lo):
            return "n/a"
        return "higher" if self.lo > 0 else "lower" if self.hi < 0 else "not detected"

    @property
    def equivalent(self) -> bool | None:
        """Within ±MARGIN by TOST at α; None with fewer than two seeds."""
        return None if self.n < 2 else bool(self.p_tost < ALPHA)


def mean_sd(values, fmt: str = "{:.2f}", scale: float = 1.0, *, lone: str | None = None) -> str:
    """"mean ± sample std" of ``values`` (each statistic × ``scale``, formatted by ``fmt``): the one way every
    report writes a spread. With one value: the mean alone, or with ``lone`` as its spread (e.g. "0")."""
    v = np.asarray(values, dtype=float)
    mean = fmt.format(scale * v.mean())
    if len(v) < 2:
        return mean if lone is None else f"{mean} ± {fmt.format(float(lone))}"
    return f"{mean} ± {fmt.format(scale * v.std(ddof=1))}"


def tost_p(d: np.ndarray, margin: float = MARGIN) -> float:
    """p-value of the paired TOST: the larger of the two one-sided t-tests of H₀: mean ≤ −margin and
    H₀: mean ≥ +margin. Equivalence is shown when it is below α."""
    n, mean = len(d), float(np.mean(d))
    sd = float(np.std(d, ddof=1))
    if sd == 0:
        return 0.0 if abs(mean) < margin else 1.0
    se = sd / math.sqrt(n)
    p_low = stats.t.sf((mean + margin) / se, n - 1)   # evidence that mean > −margin
    p_high = stats.t.cdf((mean - margin) / se, n - 1)  # evidence that mean < +margin
    return float(max(p_low, p_high))


def paired(a: list[float], b: list[float], margin: float = MARGIN) -> Comparison:
    """Mean of a − b, its 95% t-interval, the paired t and Wilcoxon p-values, and TOST's."""
    d = np.asarray(a, float) - np.asarray(b, float)
    n = len(d)
    if n < 2:
        return Comparison(n, float(d.mean()) if n else math.nan)
    sd = d.std(ddof=1)
    half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    p_t = float(stats.ttest_rel(a, b).pvalue) if sd > 0 else (1.0 if d.mean() == 0 else 0.0)
    p_w = float(stats.wilcoxon(d).pvalue) if np.any(d != 0) else math.nan
    return Comparison(n, float(d.mean()), float(d.mean() - half), float(d.mean() + half), p_t, p_w, tost_p(d, margin))


def by_variant(rs) -> dict[str, list[dict]]:
    out = defaultdict(list)
    for r in rs:
        out[r["variant"]].append(r)
    return out


def by_seed(runs) -> dict[int, dict]:
    return {r["seed"]: r for r in runs}


def paired_by_seed(a: dict[int, dict], a_key: str, b: dict[int, dict], b_key: str) -> tuple[Comparison, list[int]]:
    """:func:`paired` over the seeds both sides have; and those seeds."""
    seeds = sorted(set(a) & set(b))
    return paired([a[s][a_key] for s in seeds], [b[s][b_key] for s in seeds]), seeds


def profiles(runs, key) -> dict[int, dict[str, float]]:
    return {r["seed"]: r["metrics"][key] for r in runs if r["metrics"].get(key)}


def drift_cells(variants) -> tuple[float | None, dict[tuple[float, float], list[dict]]]:
    """The learned arm's runs by (temperature, multiplier), at its most common init_lambda; and that init."""
    learned = [g for g in variants.values() if g[0]["arm"] == "lambda"]
    if not learned:
        return None, {}
    inits = defaultdict(int)
    for g in learned:
        inits[g[0]["config"]["init_lambda"]] += len(g)
    init = max(inits, key=inits.get)
    cells = defaultdict(list)
    for g in learned:
        c = g[0]["config"]
        if c["init_lambda"] == init:
            cells[(c["temperature"], c["multiplier"])] += g
    return init, cells


@dataclass(frozen=True)
class Finding:
    claim: str      # the paper's finding
    task: str
    measured: str   # what the runs show, in words and numbers
    holds: str      # the verdict: "yes", "no", "not detected", "inconclusive", "partly", "n/a", with a reason


def _points(c: Comparison) -> str:
    ci = "" if math.isnan(c.lo) else f", CI [{100 * c.lo:+.2f}, {100 * c.hi:+.2f}]"
    tost = "" if math.isnan(c.p_tost) else f", TOST p {c.p_tost:.2g}"
    return f"{100 * c.mean:+.2f} points{ci}{tost}, {c.n} seed{'s' if c.n != 1 else ''}"


def _one_seed(c: Comparison) -> str | None:
    return "n/a (one seed)" if c.n < 2 else None


def experiment_labels(experiments: dict[tuple[str, str], list[dict]]) -> dict[tuple[str, str], str]:
    """A readable name for each experiment: its task, and where the task has several experiments, the
    shared settings they differ in, e.g. ``fmnist-vit (epochs=8)``."""
    shared = EXPERIMENT_FIELDS - {"task"}
    settings = {key: {k: v for k, v in rs[0]["config"].items() if k in shared} for key, rs in experiments.items()}
    labels = {}
    for key in experiments:
        others = [settings[k] for k in experiments if k[0] == key[0] and k != key]
        differ = sorted({k for o in others for k in o.keys() | settings[key].keys()
                         if o.get(k) != settings[key].get(k)})
        labels[key] = key[0] + (f" ({', '.join(f'{k}={settings[key].get(k)}' for k in differ)})" if differ else "")
    return labels


def findings(experiments: dict[tuple[str, str], list[dict]]) -> list[Finding]:
    """The paper's findings, one per experiment where its runs can test them, with the verdict they
    give; the task column names the experiment (:func:`experiment_labels`)."""
    out = []
    labels = experiment_labels(experiments)
    for key, rs in experiments.items():
        task = key[0]
        variants = by_variant(rs)
        seeds = {v: by_seed(g) for v, g in variants.items()}
        if "lambda-harden" in seeds and "gelu" in seeds:
            c, _ = paired_by_seed(seeds["lambda-harden"], "sub_test_acc", seeds["gelu"], "sub_test_acc")
            holds = _one_seed(c) or {"higher": "yes", "lower": "no"}.get(c.difference, "not detected")
            out.append(Finding("annealed→ReLU keeps more accuracy than a direct GELU→ReLU swap", labels[key], _points(c), holds))
            c, _ = paired_by_seed(seeds["lambda-harden"], "sub_test_acc", seeds["gelu"], "test_acc")
            if task == "stdlib-gpt":
                holds = _one_seed(c) or ("yes" if c.difference == "lower" else
                                         "no: better than the original" if c.difference == "higher" else
                                         "no: equivalent to the original" if c.equivalent else "inconclusive")
                claim = "GPT-2: annealing to ReLU deteriorates the model severely"
            else:
                holds = _one_seed(c) or ("yes (equivalent)" if c.equivalent else "yes (better)"
                                         if c.difference == "higher" else "no (a loss)" if c.difference == "lower"
                                         else "inconclusive")
                claim = "the annealed ReLU network matches the GELU original"
            out.append(Finding(claim, labels[key], _points(c) + " vs GELU", holds))
        if "lambda" in variants:
            profs = list(profiles(variants["lambda"], "lambda_end").values())
            r = pairwise_spearman(profs)
            if r["pairs"] and len(profs[0]) >= 3:  # over two layers ρ is ±1 whatever happens
                out.append(Finding("layerwise hardness profiles are stable across seeds", labels[key],
                                   f"mean Spearman ρ {r['mean']:.2f} (min {r['min']:.2f}) over {r['pairs']} pairs",
                                   "yes" if r["mean"] >= STABLE_RHO else "no"))
        init, cells = drift_cells(variants)
        if len({t for t, _ in cells}) >= 3 and len({c for _, c in cells}) >= 3:
            keys = sorted(cells)
            means = [float(np.mean([drift(init, r["metrics"]["lambda_end"]) for r in cells[k]])) for k in keys]
            rho_c = stats.spearmanr([c for _, c in keys], means)[0]
            rho_t = stats.spearmanr([t for t, _ in keys], means)[0]
            out.append(Finding("hardness drift Δλ grows with the effective step c·σ(s/t)²/t² (with c, and as t falls)",
                               labels[key], f"Spearman of cell-mean Δλ with c {rho_c:+.2f}, with t {rho_t:+.2f} ({len(keys)} cells)",
                               "yes" if rho_c > 0.5 and rho_t < -0.5 else "partly" if rho_c > 0.5 or rho_t < -0.5
                               else "no"))
    return sorted(out, key=lambda f: (f.claim, f.task))
