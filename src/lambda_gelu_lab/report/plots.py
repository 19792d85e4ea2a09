"""The report's figures: λ per layer over training, the hardness-drift heatmap and scatter, sparsity against accuracy."""
from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import numpy as np

from .analysis import layer_order


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _style(plt, i: int) -> dict:
    """The i-th series' colour and marker, so that a figure with more series than a colour cycle has colours still
    tells them apart ((colour, marker) pairs repeat after 140 series)."""
    colours, markers = plt.get_cmap("tab20").colors, "os^DvPX"
    return dict(color=colours[i % len(colours)], marker=markers[i % len(markers)])


def _save(plt, fig, img_dir: Path, name: str) -> Path:
    """Save ``fig`` in ``img_dir`` as ``name``, which is made of stored task names: anything but letters, digits,
    '.', '-' and '_' becomes '_', so that no stored name can lead the file out of the report's image folder."""
    path = img_dir / re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".")
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # a legend beside the axes is kept whole
    plt.close(fig)
    return path


def plot_lambdas(task, base, by_variant, order, lambda_rows, img_dir: Path) -> Path | None:
    # the learned and annealed arms at their defaults, and the annealed arm's switch-point variants
    panels = [v for v in order if (v in ("lambda", "lambda-harden") or by_variant[v][0]["arm"] == "lambda-harden")
              and any(lambda_rows.get(r["id"]) for r in by_variant[v])]
    if not panels:
        return None
    plt = _pyplot()

    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
    for ax, v in zip(axes[0], panels):
        runs = by_variant[v]
        series = defaultdict(list)  # layer → list of (steps, values) per seed
        for r in runs:
            per_layer = defaultdict(list)
            for step, layer, value in lambda_rows.get(r["id"], []):
                per_layer[layer].append((step, value))
            for layer, pts in per_layer.items():
                series[layer].append(np.asarray(pts, float))
        for layer in layer_order(series):
            curves = series[layer]
            n = min(len(c) for c in curves)
            steps = curves[0][:n, 0]
            vals = np.stack([c[:n, 1] for c in curves])
            mean = vals.mean(0)
            line, = ax.plot(steps, mean, label=f"layer {layer}")
            if len(curves) > 1:
                ax.fill_between(steps, vals.min(0), vals.max(0), color=line.get_color(), alpha=0.2)
        cfg = runs[0]["config"]
        if runs[0]["arm"] == "lambda-harden":
            total = runs[0]["metrics"]["steps"]
            if cfg["switch_at"] == "auto":  # each seed chose its own switch step: show their range
                chosen = [r["metrics"]["switch_step"] for r in runs]
                ax.axvspan(min(chosen), max(chosen), color="k", alpha=0.15, label="switch (auto, range over seeds)")
            else:
                ax.axvline(int(cfg["switch_at"] * total), color="k", ls="--", lw=1, label="switch")
            ax.set_yscale("log")
        ax.set_title(f"{task}: {v} (n={len(runs)})", fontsize=9)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("λ (mean over seeds, band = min–max)")
        ax.legend(fontsize=7)
    return _save(plt, fig, img_dir, f"lambda_{task}_{base}.png")


def plot_drift(task: str, base: str, ts: list[float], cs: list[float], grid: np.ndarray, img_dir: Path) -> Path:
    """Heatmap of mean Δλ over temperature (rows) × multiplier (columns)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(1.4 * len(cs) + 2, 1.0 * len(ts) + 1.5))
    im = ax.imshow(grid, cmap="viridis")
    ax.set_xticks(range(len(cs)), [f"{c:g}" for c in cs])
    ax.set_yticks(range(len(ts)), [f"{t:g}" for t in ts])
    ax.set_xlabel("multiplier c")
    ax.set_ylabel("temperature t")
    for i in range(len(ts)):
        for j in range(len(cs)):
            if not np.isnan(grid[i, j]):
                bright = grid[i, j] > np.nanmin(grid) + 0.6 * (np.nanmax(grid) - np.nanmin(grid))
                ax.text(j, i, f"{grid[i, j]:+.2f}", ha="center", va="center", color="k" if bright else "w", fontsize=8)
    fig.colorbar(im, label="Δλ")
    ax.set_title(f"{task}: hardness drift", fontsize=9)
    return _save(plt, fig, img_dir, f"drift_{task}_{base}.png")


def plot_sparsity(task: str, base: str, points: list[tuple[float, float, float]], img_dir: Path) -> Path:
    """Exact zeros after ReLU (x) against the paired accuracy difference to the annealed arm (y), one
    point per penalty peak, labelled with it."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.4))
    points = sorted(points)
    ax.plot([100 * z for _, z, _ in points], [100 * d for _, _, d in points], "o-")
    for peak, z, d in points:
        ax.annotate(f"{peak:g}", (100 * z, 100 * d), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.axhline(-0.5, color="grey", lw=0.8, ls="--")
    ax.axvline(85, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("exact zeros after ReLU (%)")
    ax.set_ylabel("accuracy − annealed (points)")
    ax.set_title(f"{task}: activation penalty peak (labels)", fontsize=9)
    return _save(plt, fig, img_dir, f"sparsity_{task}_{base}.png")


def plot_drift_scatter(task: str, points: list[tuple[str, float, float | None]], img_dir: Path) -> Path:
    """Hardness drift Δλ (x) against accuracy after ReLU (y), one colour and marker per variant (a drift grid
    has more variants than a colour cycle has colours), the legend beside the plot."""
    plt = _pyplot()
    by = defaultdict(list)
    for variant, x, y in points:
        if y is not None:
            by[variant].append((x, 100 * y))
    fig, ax = plt.subplots(figsize=(5.5 + 2.5 * (len(by) > 6), 3.6))
    for i, (variant, xy) in enumerate(sorted(by.items())):
        xs, ys = zip(*xy)
        ax.scatter(xs, ys, s=16, label=variant, **_style(plt, i))
    ax.set_xlabel("hardness drift Δλ (λ learned − λ₀, mean over layers)")
    ax.set_ylabel("test accuracy after ReLU (%)")
    ax.set_title(f"{task}: does Δλ predict the ReLU network's accuracy?", fontsize=9)
    if len(by) > 6:
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    else:
        ax.legend(fontsize=6)
    return _save(plt, fig, img_dir, f"drift_scatter_{task}.png")
