"""Hardness-profile statistics: rank agreement of layerwise λ across seeds or initialisations, and
the drift of λ during learning."""
from __future__ import annotations

import itertools
import math

import numpy as np
from scipy import stats


def layer_order(names):
    """Qualified layer names in network order ('2' < '10', 'blocks.1.mlp.1' < 'blocks.10.mlp.1')."""
    return sorted(names, key=lambda s: [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in s.split(".")])


def profile_vector(profile: dict[str, float], layers: list[str]) -> np.ndarray:
    return np.array([profile[layer] for layer in layers], dtype=float)


def pairwise_spearman(profiles: list[dict[str, float]]) -> dict:
    """Spearman ρ of every pair of layerwise profiles (same layers): mean, min, number of pairs.

    A profile with all layers equal has no ranking; pairs involving one are skipped (counted in
    ``undefined``)."""
    if not profiles:
        return {"mean": math.nan, "min": math.nan, "pairs": 0, "undefined": 0}
    layers = layer_order(profiles[0])
    vectors = [profile_vector(p, layers) for p in profiles]
    rhos, undefined = [], 0
    for a, b in itertools.combinations(vectors, 2):
        if np.ptp(a) == 0 or np.ptp(b) == 0:
            undefined += 1
            continue
        rhos.append(float(stats.spearmanr(a, b).statistic))
    return {"mean": float(np.mean(rhos)) if rhos else math.nan, "min": float(np.min(rhos)) if rhos else math.nan,
            "pairs": len(rhos), "undefined": undefined}


def matched_spearman(a: dict[int, dict[str, float]], b: dict[int, dict[str, float]]) -> dict:
    """Spearman ρ between two settings' profiles, seed by seed (the seeds both have)."""
    rhos = []
    for seed in sorted(set(a) & set(b)):
        r = pairwise_spearman([a[seed], b[seed]])
        if r["pairs"]:
            rhos.append(r["mean"])
    return {"mean": float(np.mean(rhos)) if rhos else math.nan, "min": float(np.min(rhos)) if rhos else math.nan,
            "pairs": len(rhos)}


def drift(init_lambda: float, lambda_end: dict[str, float]) -> float:
    """Δλ = mean over layers of (λ_end − λ_init)."""
    return float(np.mean([v - init_lambda for v in lambda_end.values()]))
