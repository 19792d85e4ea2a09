"""The report's deployment section, from the store's ``deploy`` table (``lambda-gelu deploy``):
int8 graphs, latency, verification and sparsity, with a reading computed from them."""
from __future__ import annotations

import json
import math
from collections import defaultdict

import numpy as np

from ..store import Store
from .sections import mean_std


def deployment_section(store: Store) -> list[str]:
    rows = store.deploy_rows()
    if not rows:
        return []
    from ..deploy_eval import EPSILONS, MODELS
    order = [m for m, _, _ in MODELS]
    data = defaultdict(lambda: defaultdict(lambda: defaultdict(dict)))  # task → section → model → seed → data
    for task, _base, seed, model, section, d in rows:  # one experiment per task: deploy picks it
        data[task][section][model][seed] = d
    lines = ["# Deployment", "",
             "Produced by `lambda-gelu deploy` on the stored models above: the GELU original, its direct swap to "
             "ReLU, the annealed λ-GELU → ReLU, and ReLU from scratch, same seeds. Mean ± std over seeds.", ""]
    for task, sections in data.items():
        lines += [f"## {task}: deployment", ""] + _deployment_reading(sections)
        if "int8" in sections:
            lines += ["Static int8 quantization with ONNX Runtime (QOperator, uint8 activations, int8 weights, "
                      "calibrated on 1024 training examples); *float ops* are the nodes of the int8 graph that still "
                      "compute in floating point.", "",
                      "| model | seeds | fp32 acc | int8 acc | int8 − fp32 | float ops in the int8 graph |",
                      "|---|---|---|---|---|---|"]
            for m in order:
                per = sections["int8"].get(m, {})
                if not per:
                    continue
                fops = {json.dumps(d["float_ops"], sort_keys=True) for d in per.values()}
                lines.append(f"| {m} | {len(per)} | {mean_std(d['fp32_acc'] for d in per.values())} | "
                             f"{mean_std(d['int8_acc'] for d in per.values())} | "
                             f"{mean_std(d['int8_acc'] - d['fp32_acc'] for d in per.values())} | "
                             f"{' / '.join(sorted(fops)).replace('{}', 'none (fully integer)')} |")
            lines.append("")
        if "latency" in sections:
            lat = next(iter(sections["latency"]["*"].values()))
            cols = sorted({(r["threads"], r["batch"]) for r in lat})
            lines += ["ONNX Runtime latency, ms per batch (median of interleaved repetitions, one seed's models); "
                      "ratio to the GELU int8 graph in parentheses.", "",
                      "| model | graph | " + " | ".join(f"{t} thr, batch {b}" for t, b in cols) + " |",
                      "|---|---|" + "---|" * len(cols)]
            ms = {(r["model"], r["kind"], r["threads"], r["batch"]): r["ms"] for r in lat}
            for kind in ("fp32", "int8"):
                for m in order:
                    if (m, kind, *cols[0]) not in ms:
                        continue
                    cells = [f"{ms[(m, kind, t, b)]:.3f} ({ms[(m, kind, t, b)] / ms[('GELU', 'int8', t, b)]:.2f}×)"
                             for t, b in cols]
                    lines.append(f"| {m} | {kind} | " + " | ".join(cells) + " |")
            lines.append("")
        if "verify" in sections:
            any_d = next(iter(next(iter(sections["verify"].values())).values()))
            lines += [f"L∞ robustness of the first {any_d['points']} test points (ε in input units; "
                      f"fmnist-mlp: pixels in [0, 1]). *IBP*/*CROWN*: certified by bounds; *exact*: decided by "
                      f"attack → CROWN → MILP (HiGHS, {any_d['time_limit']:g} s per point). Percent of points "
                      "(a point must also be classified correctly). A ReLU network's certificate holds for its "
                      "float32 forward: each margin exceeds a bound on that forward's rounding, or the point is "
                      "left undecided (a timeout). GELU admits bounds only (IBP, in exact arithmetic).", "",
                      "| ε | model | clean | IBP cert. | CROWN cert. | exact: verified | falsified | timeout |",
                      "|---|---|---|---|---|---|---|---|"]
            for eps in EPSILONS:
                for m in order:
                    per = sections["verify"].get(m, {})
                    if not per:
                        continue
                    vals = [d[str(eps)] for d in per.values()]
                    frac = lambda key: mean_std(v[key] / v["points"] for v in vals)  # noqa: E731
                    relu = m != "GELU"
                    lines.append(f"| {eps:g} | {m} | {frac('correct')} | {frac('ibp')} | "
                                 f"{frac('crown') if relu else '—'} | {frac('verified') if relu else '—'} | "
                                 f"{frac('falsified') if relu else '—'} | {frac('timeout') if relu else '—'} |")
            lines.append("")
        if "sparsity" in sections:
            lines += ["Activation sparsity on the test set: exact zeros among ReLU outputs, and units never active "
                      "(mean over layers). GELU outputs are never exactly zero.", "",
                      "| model | zero fraction | never-active units |", "|---|---|---|"]
            for m in order:
                per = {k: v for k, v in sections["sparsity"].get(m, {}).items() if v and "zero_fraction" in v}
                if per:
                    lines.append(f"| {m} | {mean_std(d['zero_fraction'] for d in per.values())} | "
                                 f"{mean_std(d['dead_fraction'] for d in per.values())} |")
            lines.append("")
    return lines


def _deployment_reading(sections) -> list[str]:
    """Plain sentences computed from the tables below: what ReLU-ization buys and what it costs."""
    def avg(model, section, fn):
        per = sections.get(section, {}).get(model, {})
        vals = [fn(d) for d in per.values() if d]
        return float(np.mean(vals)) if vals else math.nan

    out = ["Reading (computed from the tables below):", ""]
    if "int8" in sections:
        integer = [m for m, per in sections["int8"].items() if all(not d["float_ops"] for d in per.values())]
        floaty = {m: next(iter(per.values()))["float_ops"] for m, per in sections["int8"].items()
                  if any(d["float_ops"] for d in per.values())}
        out.append(f"- Fully integer int8 graphs: {', '.join(integer) or 'none'}; still computing in float: "
                   + (", ".join(f"{m} ({', '.join(f'{k}×{v}' for k, v in ops.items())})" for m, ops in floaty.items())
                      or "none") + ".")
        cost = avg("annealed→ReLU", "int8", lambda d: d["fp32_acc"]) - avg("GELU", "int8", lambda d: d["fp32_acc"])
        swap = avg("direct swap", "int8", lambda d: d["fp32_acc"]) - avg("GELU", "int8", lambda d: d["fp32_acc"])
        q = {m: avg(m, "int8", lambda d: d["int8_acc"] - d["fp32_acc"]) for m in sections["int8"]}
        out.append(f"- Accuracy cost of ReLU-ization against the GELU original (fp32): annealed {100 * cost:+.2f} "
                   f"points, direct swap {100 * swap:+.2f}. Int8 minus fp32: "
                   + ", ".join(f"{m} {100 * v:+.2f}" for m, v in q.items()) + " points.")
    if "latency" in sections:
        lat = next(iter(sections["latency"]["*"].values()))
        ms = {(r["model"], r["kind"], r["threads"], r["batch"]): r["ms"] for r in lat}
        ratios = [ms[("annealed→ReLU", "int8", t, b)] / ms[("GELU", "int8", t, b)]
                  for (m, k, t, b) in ms if m == "GELU" and k == "int8" and ("annealed→ReLU", "int8", t, b) in ms]
        if ratios:
            out.append(f"- Int8 latency, annealed→ReLU over GELU: {min(ratios):.2f}× to {max(ratios):.2f}× across batch "
                       "sizes and thread counts.")
    if "verify" in sections:
        eps = "0.01"
        pct = lambda m, key: 100 * avg(m, "verify", lambda d: d[eps][key] / d[eps]["points"])  # noqa: E731
        out.append(f"- At ε = {eps}: exactly verified annealed→ReLU {pct('annealed→ReLU', 'verified'):.0f}%, direct swap "
                   f"{pct('direct swap', 'verified'):.0f}%, ReLU scratch {pct('ReLU scratch', 'verified'):.0f}% of points "
                   f"(timeouts {pct('annealed→ReLU', 'timeout'):.0f}%, {pct('direct swap', 'timeout'):.0f}%, "
                   f"{pct('ReLU scratch', 'timeout'):.0f}%); the GELU model has bounds only: IBP certifies "
                   f"{pct('GELU', 'ibp'):.0f}%.")
    if "sparsity" in sections:
        z = {m: avg(m, "sparsity", lambda d: d.get("zero_fraction", math.nan)) for m in sections["sparsity"]}
        out.append("- Exact zeros in ReLU outputs: " + ", ".join(f"{m} {100 * v:.0f}%" for m, v in z.items()
                                                                if not math.isnan(v)) + "; GELU has none.")
    return out + [""]
