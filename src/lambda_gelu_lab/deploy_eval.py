"""``lambda-gelu deploy``: the payoff of ReLU-ization, measured on the protocol's stored models.

For every seed that has the GELU, annealed λ-GELU and ReLU runs of a task, four deployable models:
the GELU original, its direct swap to ReLU, the annealed λ-GELU → ReLU, and ReLU from scratch. Each
is exported to ONNX, statically quantized to int8 with ONNX Runtime and evaluated; its ReLU layers'
sparsity is measured; and a fixed sample of test points is verified at several L∞ radii. Latency
is measured for one seed, all models side by side. Results go to the store's ``deploy`` table.
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import lambda_gelu as lg
from lambda_gelu.deploy import onnx as deploy
from lambda_gelu.verify import bounds, milp

from .arms import ARMS
from .config import RunConfig
from .data import DataError
from .store import Store
from .tasks import TASKS, Task
from .train import build_model, evaluate, relu_ize_

MODELS = (  # (name, arm it comes from, ReLU-ize it)
    ("GELU", "gelu", False),
    ("direct swap", "gelu", True),
    ("annealed→ReLU", "lambda-harden", True),
    ("ReLU scratch", "relu", False),
)
EPSILONS = (0.005, 0.01, 0.02)

def load_model(store: Store, run: dict, task: Task, splits) -> torch.nn.Module:
    from safetensors.torch import load_file
    if not run["weights"]:
        raise DataError(f"run {run['id']} ({run['task']} {run['variant']} seed {run['seed']}) was stored without "
                        "weights (--no-weights); delete it from the store and rerun it to deploy it")
    weights = store.dir / run["weights"]
    if not weights.is_file():
        raise DataError(f"run {run['id']} ({run['task']} {run['variant']} seed {run['seed']}): its weights file "
                        f"{weights} is missing; restore it, or delete the run from the store and rerun it")
    cfg = RunConfig(**run["config"])
    model = build_model(task, splits, cfg)
    model.load_state_dict(load_file(str(weights)))
    if ARMS[cfg.arm].stored_as_relu:
        relu_ize_(model)
    return model.eval()


def _box(task: Task, x: torch.Tensor, eps: float):
    lo, hi = x - eps * task.eps_scale, x + eps * task.eps_scale
    if task.input_domain is not None:
        lo, hi = lo.clamp(*task.input_domain), hi.clamp(*task.input_domain)
    return lo.numpy().ravel(), hi.numpy().ravel()


def _verification(model, act, task, splits, points, time_limit) -> dict:
    layers, _ = bounds.affine_layers(model)
    unit = bounds.unit_roundoff(model)
    out = {}
    for eps in EPSILONS:
        counts = {"points": points, "correct": 0, "ibp": 0, "crown": 0, "verified": 0, "falsified": 0, "timeout": 0,
                  "seconds": 0.0}
        for i in range(points):
            x, y = splits.x_test[i], int(splits.y_test[i])
            with torch.no_grad():
                if model(x.unsqueeze(0)).argmax().item() != y:
                    continue
            counts["correct"] += 1
            lo, hi = _box(task, x, eps)
            spec = bounds._margin_spec(y, layers[-1][0].shape[0])
            ibp = bounds.interval_bounds(layers, act, lo, hi)
            ibp_lower = spec @ ((ibp[-1][0] + ibp[-1][1]) / 2) - np.abs(spec) @ ((ibp[-1][1] - ibp[-1][0]) / 2)
            if act != "relu":  # GELU: bounds in exact arithmetic (its float rounding is not bounded)
                counts["ibp"] += bool(np.all(ibp_lower > 0))
                continue
            # ReLU: a margin must also exceed what the float forward can round, as verify_point asks
            rounding = lambda box: bounds.float_error(layers, box, lo, hi, unit, spec)  # noqa: E731
            counts["ibp"] += bool(np.all(ibp_lower > rounding(ibp)))
            crown, crown_lower = bounds.crown_bounds(layers, lo, hi, spec)
            counts["crown"] += bool(np.all(crown_lower > rounding(crown)))
            r = milp.verify_point(model, x, y, lo, hi, time_limit=time_limit)
            counts[r.status] += 1
            counts["seconds"] += r.seconds
        out[str(eps)] = counts
    return out


def _sparsity(model, splits) -> dict | None:
    if not any(isinstance(m, torch.nn.ReLU) for m in model.modules()):
        return None
    stats = deploy.activation_sparsity(model, splits.x_test.split(1000))
    return {"layers": stats,
            "zero_fraction": float(np.mean([s["zero_fraction"] for s in stats.values()])),
            "dead_fraction": float(np.mean([s["dead_fraction"] for s in stats.values()]))}


def _int8(model, splits, workdir: Path, tag: str) -> dict:
    fp32_path, int8_path = workdir / f"{tag}.onnx", workdir / f"{tag}.int8.onnx"
    exported = deploy.export_onnx(model, splits.x_train[:1], fp32_path, allow_smooth=True)
    calibration = [splits.x_train[i:i + 128].numpy() for i in range(0, 1024, 128)]
    q = deploy.quantize_int8(fp32_path, int8_path, calibration)
    runner = deploy.OnnxRunner(int8_path)
    pred = np.concatenate([runner(x.numpy()).argmax(1) for x in splits.x_test.split(1000)])
    return {"int8_acc": float((pred == splits.y_test.numpy()).mean()), "float_ops": q["float_ops"],
            "int8_op_counts": q["op_counts"], "fp32_nonlinear_ops": exported.nonlinear_ops,
            "paths": (str(fp32_path), str(int8_path))}


def measure_latency(paths: dict[str, tuple[str, str]], sample: np.ndarray, reps: int = 30) -> list[dict]:
    """Median milliseconds per batch of every model's fp32 and int8 ONNX graphs, timed round-robin."""
    rows = []
    for threads in (1, 2):
        for batch in (1, 256):
            x = np.ascontiguousarray(sample[:batch], dtype=np.float32)
            runners = {(name, kind): deploy.OnnxRunner(p, threads) for name, pair in paths.items()
                       for kind, p in zip(("fp32", "int8"), pair)}
            times = deploy.time_interleaved({k: (lambda r=r: r(x)) for k, r in runners.items()}, rounds=reps)
            for (name, kind), ts in times.items():
                rows.append({"threads": threads, "batch": batch, "model": name, "kind": kind,
                             "ms": 1e3 * float(np.median(ts))})
    return rows


def run_deploy(out_dir, task_names: list[str], seeds: int, points: int, time_limit: float, progress=True) -> None:
    with Store(out_dir) as store:
        _deploy(store, task_names, seeds, points, time_limit, progress)


def _deploy(store: Store, task_names, seeds, points, time_limit, progress) -> None:
    runs = store.runs()
    for name in task_names:
        task = TASKS[name]
        mine = [r for r in runs if r["task"] == name and r["variant"] in ("gelu", "lambda-harden", "relu")]
        if not mine:
            print(f"{name}: no stored runs in {store.path}; run `lambda-gelu lab run {name}` first", file=sys.stderr)
            continue
        base = max({r["base_hash"] for r in mine}, key=lambda b: sum(r["base_hash"] == b for r in mine))
        by = {(r["arm"], r["seed"]): r for r in mine if r["base_hash"] == base}
        complete = sorted(s for s in {s for _, s in by} if all((a, s) in by for _, a, _ in MODELS))[:seeds]
        splits = task.load(None)
        with tempfile.TemporaryDirectory() as tmp:
            latency_paths = {}
            for seed in complete:
                for model_name, arm, relu_ize in MODELS:
                    key = (name, base, seed, model_name)
                    done = store.deploy_sections(*key)
                    model = load_model(store, by[(arm, seed)], task, splits)
                    if relu_ize:
                        lg.to_relu_(model, include_gelu=True)
                    act = "relu" if relu_ize or arm == "relu" else "gelu"
                    sections = {}
                    if "int8" not in done or seed == complete[0]:
                        q = _int8(model, splits, Path(tmp), f"{seed}_{arm}_{relu_ize}")
                        q["fp32_acc"] = evaluate(model, splits.x_test, splits.y_test)[0]
                        if seed == complete[0]:
                            latency_paths[model_name] = q["paths"]
                        sections["int8"] = {k: v for k, v in q.items() if k != "paths"}
                    if "sparsity" not in done:
                        sections["sparsity"] = _sparsity(model, splits)
                    if "verify" not in done:
                        t0 = time.perf_counter()
                        sections["verify"] = _verification(model, act, task, splits, points, time_limit)
                        if progress:
                            print(f"{name} seed {seed} {model_name}: verified in {time.perf_counter() - t0:.0f}s",
                                  file=sys.stderr)
                    store.add_deploy(*key, {section: {**(data or {}), "points": points, "time_limit": time_limit}
                                            for section, data in sections.items() if section not in done})
            if latency_paths:
                rows = measure_latency(latency_paths, splits.x_test.numpy())
                store.replace_deploy_section(name, base, "latency", complete[0], "*", rows)
