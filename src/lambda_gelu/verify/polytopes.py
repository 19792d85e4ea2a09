"""Properties decided over a ReLU network: does some input of a box drive the outputs into the unsafe set, a union of
polytopes {y : C·y ≤ d} (what a VNN-LIB file states, :func:`lambda_gelu.verify.vnnlib.read_property`)? The bounds, the exact
MILP and the rounding bound are :mod:`lambda_gelu.verify.bounds`' and :mod:`lambda_gelu.verify.milp`'s; this module searches, proves and checks witnesses.
"""
from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn as nn

from .bounds import _box, affine_layers, crown_bounds, float_error, unit_roundoff
from .milp import _SOLVER_TOL, VerifyResult, _milp_min

__all__ = ["verify_property"]



def _forward64(layers, x: np.ndarray) -> np.ndarray:
    """The ReLU chain in float64, on a row or a batch of rows."""
    a = np.asarray(x, float)
    for k, (W, b) in enumerate(layers):
        a = a @ W.T + b
        if k < len(layers) - 1:
            a = np.maximum(a, 0.0)
    return a


def _float32_inside(x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray | None:
    """The float32 point nearest ``x`` inside [lo, hi] (as float64 values), or None where the box holds no float32
    value: a runtime takes float32 inputs, so a counterexample must be one."""
    x32 = np.clip(x, lo, hi).astype(np.float32)
    x32 = np.where(x32 < lo, np.nextafter(x32, np.float32(np.inf)), x32)
    x32 = np.where(x32 > hi, np.nextafter(x32, np.float32(-np.inf)), x32)
    x64 = x32.astype(np.float64)
    return x64 if np.all(x64 >= lo) and np.all(x64 <= hi) else None


def verify_property(model: nn.Module, lo, hi, unsafe, time_limit: float = 60.0, attack: bool = True) -> VerifyResult:
    """Decide whether some input in the box [lo, hi] drives ``model``'s outputs into the unsafe set: a union of
    polytopes {y : C·y ≤ d}, ``unsafe`` a list of (C, d) (what :func:`lambda_gelu.verify.vnnlib.read_property` reads).

    "falsified": ``counterexample`` is a float32 input inside the box whose outputs lie in one polytope with room for
    any rounding a float forward of the network can make (:func:`float_error`), so every runtime reaches the unsafe
    set there, whatever order it adds in. "verified": no polytope is reachable even by the rounded forward (CROWN,
    then the exact MILP, each polytope widened by the rounding bound). "timeout": undecided — out of time, or the
    outputs reach a polytope only within the rounding — said in ``detail``; a polytope left undecided does not end
    the search, a later one may still be reached."""
    start = time.perf_counter()
    layers, act = affine_layers(model)
    if act != "relu":
        raise ValueError("exact verification needs a ReLU network: ReLU-ize it first (lambda_gelu.to_relu_)")
    lo, hi = _box(lo, hi)
    n, m = layers[0][0].shape[1], layers[-1][0].shape[0]
    if lo.size != n:
        raise ValueError(f"the box has {lo.size} values and the network takes {n} inputs: they must agree")
    polytopes = []
    for C, d in unsafe:
        C, d = np.atleast_2d(np.asarray(C, float)), np.atleast_1d(np.asarray(d, float))
        if C.shape != (d.size, m) or not (np.isfinite(C).all() and np.isfinite(d).all()):
            raise ValueError(f"an unsafe polytope needs finite C of shape (k, {m}) and d of k values, got "
                             f"{C.shape} and {d.shape}")
        polytopes.append((C, d))
    if not polytopes:
        raise ValueError("the unsafe set is empty: there is nothing to verify")
    spec = np.vstack([C for C, _ in polytopes])
    bounds, spec_lower = crown_bounds(layers, lo, hi, spec)
    # room a witness must leave: the float forward's rounding, and our float64 forward's own
    rounding = float_error(layers, bounds, lo, hi, unit_roundoff(model), spec)
    room = rounding + float_error(layers, bounds, lo, hi, 2.0 ** -53, spec)
    cuts = np.cumsum([0] + [len(d) for _, d in polytopes])
    parts = [slice(cuts[p], cuts[p + 1]) for p in range(len(polytopes))]

    def done(status, method, **kw):
        return VerifyResult(status, method, time.perf_counter() - start, **kw)

    def reached(x, p=None):
        """x's float32 point, if its outputs lie in polytope p (any, if None) with room to spare; else None."""
        x32 = _float32_inside(x, lo, hi)
        if x32 is None:
            return None
        y = _forward64(layers, x32)
        for q in range(len(polytopes)) if p is None else (p,):
            C, d = polytopes[q]
            if np.all(C @ y + room[parts[q]] <= d):
                return x32, q
        return None

    if attack:
        found = _search(layers, lo, hi, polytopes, [room[s] for s in parts], reached)
        if found is not None:
            return done("falsified", "attack", counterexample=found[0], detail={"polytope": found[1]})
    # a polytope is out of reach when one of its rows cannot hold even with the rounding added
    out = [bool(np.any(spec_lower[s] > polytopes[p][1] + rounding[s])) for p, s in enumerate(parts)]
    if all(out):
        return done("verified", "crown")
    slack = [float(np.max(spec_lower[s] - polytopes[p][1] - rounding[s])) for p, s in enumerate(parts)]
    unstable, undecided = 0, None
    for p in sorted((p for p in range(len(polytopes)) if not out[p]), key=lambda p: slack[p]):
        remaining = time_limit - (time.perf_counter() - start)
        if remaining <= 0:
            return done("timeout", "milp", unstable=unstable, detail=undecided or {
                "polytope": p, "note": "out of time before this polytope's MILP"})
        C, d = polytopes[p]
        value, proven, cand, status, unstable = _milp_min(C, layers, bounds, lo, hi, remaining, d=d + rounding[parts[p]])
        if status == 0 and proven is not None and proven > _SOLVER_TOL:
            continue  # out of reach, with the rounding added
        if cand is not None and value is not None and value <= 0:
            found = reached(cand, p)
            if found is not None:
                return done("falsified", "milp", counterexample=found[0], unstable=unstable,
                            detail={"polytope": p, "depth": -value})
        if undecided is None:
            undecided = {"polytope": p, "value": value}
            undecided["note"] = ("the MILP stopped before proving its optimum (out of time)" if status != 0 else
                                 "the outputs reach this polytope only within the floating-point rounding bound")
    if undecided is not None:
        return done("timeout", "milp", unstable=unstable, detail=undecided)
    return done("verified", "milp", unstable=unstable)


def _search(layers, lo, hi, polytopes, room, reached, samples: int = 256, steps: int = 40, seed: int = 0):
    """A falsification search: random points of the box, then projected sign-gradient descent on the deepest
    violation max_r (c_r·y − d_r + room_r) of the three most promising polytopes; (point, polytope) or None."""
    rng = np.random.default_rng(seed)
    xs = np.vstack([(lo + hi) / 2, lo + (hi - lo) * rng.random((samples, lo.size))])
    ys = _forward64(layers, xs)
    depth = np.stack([np.max(ys @ C.T - d + r, axis=1) for (C, d), r in zip(polytopes, room)])  # (polytope, point)
    p, i = np.unravel_index(np.argmin(depth), depth.shape)
    if depth[p, i] <= 0 and (found := reached(xs[i], int(p))) is not None:
        return found
    Ws = [(torch.from_numpy(W), torch.from_numpy(b)) for W, b in layers]
    lo_t, hi_t = torch.from_numpy(lo), torch.from_numpy(hi)
    for p in np.argsort(depth.min(axis=1))[:3]:
        C, d = torch.from_numpy(polytopes[p][0]), torch.from_numpy(polytopes[p][1] - room[p])
        x = torch.from_numpy(xs[int(np.argmin(depth[p]))].copy())
        step = (hi_t - lo_t) / 8
        for t in range(steps):
            x.requires_grad_(True)
            a = x
            for k, (W, b) in enumerate(Ws):
                a = a @ W.T + b
                a = torch.relu(a) if k < len(Ws) - 1 else a
            violation = torch.max(C @ a - d)
            if violation.item() <= 0 and (found := reached(x.detach().numpy(), int(p))) is not None:
                return found
            (grad,) = torch.autograd.grad(violation, x)
            x = torch.minimum(torch.maximum(x.detach() - step * grad.sign(), lo_t), hi_t)
            if t % 10 == 9:
                step = step / 2
    return None
