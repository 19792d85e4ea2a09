"""Exact robustness verification of ReLU MLPs by a mixed-integer program (complete), with scipy's HiGHS.

A property is: for every input x in the box [lo, hi] (an L∞ ball intersected with the data domain),
logit[label] > logit[k] for every other class k. Exact MILP (big-M, the standard encoding): for a hidden unit
with pre-activation bounds l < 0 < u, a = ReLU(z) is exactly {a ≥ 0, a ≥ z, a ≤ u·δ, a ≤ z − l·(1 − δ),
δ ∈ {0, 1}}; stable units (u ≤ 0 or l ≥ 0) need no binary. The tighter the bounds, the smaller M and the fewer
binaries, so the MILP takes its bounds from CROWN (:mod:`lambda_gelu.verify.bounds`). Minimising
logit[label] − logit[k] over that set is exact: a minimum > 0 for every k proves the property, and a minimiser
< 0 is a counterexample, which is checked with a forward pass of the float network before it is reported.

A verdict of "verified" asks each margin to exceed the rounding its float forward can make on the box
(:func:`~lambda_gelu.verify.bounds.float_error`) and, from the MILP, the solver's proven bound (not its best
solution) to exceed that too. A margin inside the rounding is left undecided.
"""
from __future__ import annotations

import math
import operator
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn

from .bounds import _box, _margin_spec, affine_layers, crown_bounds, float_error, unit_roundoff

__all__ = ["verify_point", "VerifyResult", "pgd_attack"]

_SOLVER_TOL = 1e-6  # HiGHS's default feasibility tolerances are 1e-7 (primal) and 1e-6 (integrality)


@dataclass
class VerifyResult:
    status: str                    # "verified", "falsified" or "timeout"
    method: str                    # what decided it: "attack", "ibp", "crown", "milp"
    seconds: float
    counterexample: np.ndarray | None = None
    unstable: int = 0              # hidden units the MILP needed a binary for
    detail: dict = field(default_factory=dict)


def pgd_attack(model: nn.Module, x: torch.Tensor, label: int, lo, hi, steps: int = 40, restarts: int = 2,
               seed: int = 0) -> torch.Tensor | None:
    """Projected gradient descent on the margin inside the box; an input classified ≠ label, or None."""
    g = torch.Generator().manual_seed(seed)
    lo_t, hi_t = torch.as_tensor(lo, dtype=x.dtype).view_as(x), torch.as_tensor(hi, dtype=x.dtype).view_as(x)
    step = (hi_t - lo_t) / 8
    for r in range(restarts):
        xa = x.clone() if r == 0 else lo_t + (hi_t - lo_t) * torch.rand(x.shape, generator=g, dtype=x.dtype)
        for _ in range(steps):
            xa.requires_grad_(True)
            logits = model(xa.unsqueeze(0))[0]
            other = logits.clone()
            other[label] = -math.inf
            margin = logits[label] - other.max()
            if margin.item() < 0:
                return xa.detach()
            (grad,) = torch.autograd.grad(margin, xa)
            xa = torch.minimum(torch.maximum(xa.detach() - step * grad.sign(), lo_t), hi_t)
        if model(xa.unsqueeze(0))[0].argmax().item() != label:
            return xa.detach()
    return None


def _milp_min(c_out, layers, bounds, lo, hi, time_limit, d=None):
    """min c_out·logits over the exact MILP encoding; returns (value, proven, x, status, unstable count).

    Given a matrix ``c_out`` (rows c_r) and ``d``, the minimum is that of max_r (c_r·logits − d_r), through one more
    variable s ≥ c_r·logits − d_r for every row: the deepest point of the polytope {C·logits ≤ d} (value ≤ 0 inside
    it), or, when the polytope is out of reach, a proof of it (value > 0)."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    sizes = [len(lo)] + [W.shape[0] for W, _ in layers[:-1]]
    offsets = np.cumsum([0] + sizes)          # x, a_1, ..., a_{L-1}
    unstable_idx = []
    for j, (l, u) in enumerate(bounds[:-1]):
        unstable_idx += [(j, i) for i in np.flatnonzero((l < 0) & (u > 0))]
    n_cont = offsets[-1]
    several = np.ndim(c_out) == 2
    n = n_cont + len(unstable_idx) + several  # with several rows, s is the last variable
    delta_of = {key: n_cont + k for k, key in enumerate(unstable_idx)}
    var_lo, var_hi = np.zeros(n), np.ones(n)
    var_lo[:len(lo)], var_hi[:len(lo)] = lo, hi
    rows, cols, vals, r_lo, r_hi = [], [], [], [], []
    r = 0

    def add(entries, low, high):
        nonlocal r
        for col, v in entries:
            rows.append(r), cols.append(col), vals.append(v)
        r_lo.append(low), r_hi.append(high)
        r += 1

    for j in range(len(layers) - 1):
        W, b = layers[j]
        l, u = bounds[j]
        prev = range(offsets[j], offsets[j + 1])
        for i in range(W.shape[0]):
            a = offsets[j + 1] + i
            nz = np.flatnonzero(W[i])
            minus_e = [(prev[q], -W[i, q]) for q in nz]   # −(W·a_prev) terms
            if u[i] <= 0:
                var_lo[a] = var_hi[a] = 0.0
            elif l[i] >= 0:
                var_lo[a], var_hi[a] = l[i], u[i]
                add([(a, 1.0)] + minus_e, b[i], b[i])                       # a − W·a_prev = b
            else:
                var_lo[a], var_hi[a] = 0.0, u[i]
                d_ = delta_of[(j, i)]
                add([(a, 1.0)] + minus_e, b[i], np.inf)                     # a ≥ z
                add([(a, 1.0), (d_, -u[i])], -np.inf, 0.0)                  # a ≤ u·δ
                add([(a, 1.0), (d_, -l[i])] + minus_e, -np.inf, b[i] - l[i])  # a ≤ z − l(1 − δ)
    WL, bL = layers[-1]
    cost = np.zeros(n)
    integrality = np.zeros(n)
    integrality[n_cont:n_cont + len(unstable_idx)] = 1
    last = range(offsets[-2], offsets[-1])
    if several:
        C, d = np.asarray(c_out, float), np.asarray(d, float)
        var_lo[-1], var_hi[-1], cost[-1], offset = -np.inf, np.inf, 1.0, 0.0
        for c_row, d_row in zip(C @ WL, d - C @ bL):                         # c·W_L·a − s ≤ d − c·b_L
            add([(last[q], c_row[q]) for q in np.flatnonzero(c_row)] + [(n - 1, -1.0)], -np.inf, d_row)
    else:
        cost[offsets[-2]:offsets[-1]] = c_out @ WL
        offset = float(c_out @ bL)
    A = coo_matrix((vals, (rows, cols)), shape=(r, n)).tocsr()
    res = milp(cost, constraints=LinearConstraint(A, r_lo, r_hi), integrality=integrality,
               bounds=Bounds(var_lo, var_hi), options={"time_limit": time_limit, "disp": False})
    value = None if res.x is None else float(res.fun + offset)
    x = None if res.x is None else res.x[:len(lo)]
    # the proven lower bound of the minimum: the best solution found exceeds it by up to the solver's gap
    dual = getattr(res, "mip_dual_bound", None)
    proven = value if not integrality.any() else (None if dual is None or not np.isfinite(dual)
                                                   else float(dual + offset))
    return value, proven, x, res.status, len(unstable_idx)


def verify_point(model: nn.Module, x: torch.Tensor, label: int, lo, hi, time_limit: float = 60.0,
                 attack: bool = True) -> VerifyResult:
    """Decide whether ``model`` classifies every input in [lo, hi] as ``label``.

    Tiers, cheapest first: a PGD attack (falsifies), CROWN bounds (verifies), then the exact MILP,
    one per competing class, within ``time_limit`` seconds in all. ``x`` is the clean input (for the
    attack), ``lo``/``hi`` flat arrays of the input box (finite, lo ≤ hi). "verified" holds for the
    network's floating-point forward: every margin exceeds :func:`float_error`; "timeout" is undecided
    (out of time, or a margin that is positive but not beyond the rounding, said in ``detail``). A class
    left undecided does not end the search: a later class may still falsify the property.
    """
    start = time.perf_counter()
    layers, act = affine_layers(model)
    if act != "relu":
        raise ValueError("exact verification needs a ReLU network: ReLU-ize it first (lambda_gelu.to_relu_)")
    lo, hi = _box(lo, hi)
    if not (lo.shape == (x.numel(),) == (layers[0][0].shape[1],)):
        raise ValueError(f"the input has {x.numel()} values, the box {lo.size} and the first Linear layer "
                         f"takes {layers[0][0].shape[1]}: they must agree (flatten the input in the model)")
    num_classes = layers[-1][0].shape[0]
    try:
        index = None if isinstance(label, bool) else operator.index(label)
    except TypeError:
        index = None
    if index is None or not 0 <= index < num_classes:
        raise ValueError(f"label is the index of the class to verify, an integer in [0, {num_classes}); got {label!r}")
    label = index

    def falsified(cand, method, detail=None):
        xt = torch.as_tensor(cand, dtype=torch.float32).view_as(x)
        with torch.no_grad():
            pred = model(xt.unsqueeze(0))[0].argmax().item()
        inside = bool(np.all(cand >= lo - 1e-6) and np.all(cand <= hi + 1e-6))
        if pred != label and inside:
            return VerifyResult("falsified", method, time.perf_counter() - start, np.asarray(cand), detail=detail or {})
        return None

    if attack:
        adv = pgd_attack(model, x.float(), label, lo.reshape(x.shape), hi.reshape(x.shape))
        if adv is not None:
            found = falsified(adv.numpy().ravel(), "attack")
            if found:
                return found
    spec = _margin_spec(label, num_classes)
    bounds, spec_lower = crown_bounds(layers, lo, hi, spec)
    rounding = float_error(layers, bounds, lo, hi, unit_roundoff(model), spec)  # what the float forward may round
    if np.all(spec_lower > rounding):
        return VerifyResult("verified", "crown", time.perf_counter() - start)
    others = [k for k in range(num_classes) if k != label]
    unstable, undecided = 0, None  # why the first undecided class is; the next ones may still falsify

    def timeout(detail):
        return VerifyResult("timeout", "milp", time.perf_counter() - start, unstable=unstable, detail=detail)

    for row in np.argsort(spec_lower - rounding):  # most likely violated first
        if spec_lower[row] > rounding[row]:
            continue
        remaining = time_limit - (time.perf_counter() - start)
        if remaining <= 0:
            return timeout(undecided or {"class": others[row], "note": "out of time before this class's MILP"})
        value, proven, cand, status, unstable = _milp_min(spec[row], layers, bounds, lo, hi, remaining)
        if status == 0 and proven is not None and proven > rounding[row] + _SOLVER_TOL:
            continue  # proven for this class
        if value is not None and value < 0 and cand is not None:
            found = falsified(cand, "milp", {"class": others[row], "margin": value})
            if found:
                found.unstable = unstable
                return found
        if undecided is None:
            undecided = {"class": others[row], "margin": value}
            if status != 0:
                undecided["note"] = "the MILP stopped before proving its minimum (out of time)"
            elif value is not None and value > 0:
                undecided.update(note="the minimum margin is positive but not proven to exceed the floating-point "
                                 "rounding bound", rounding=float(rounding[row]))
            else:
                undecided["note"] = "MILP optimum < 0 but the float network disagrees (numerics)"
    if undecided is not None:
        return timeout(undecided)
    return VerifyResult("verified", "milp", time.perf_counter() - start, unstable=unstable)
