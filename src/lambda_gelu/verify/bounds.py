"""Bounds on a ReLU MLP's outputs over a box of inputs: interval and CROWN (fast, incomplete), and the rounding a
float forward can add to them. Depends on numpy only (torch.fx to read the network).

The network is a chain Flatten → Linear → ReLU → ... → Linear (exact GELU for the interval bounds
only), read from its traced forward (see :func:`affine_layers`: anything else is refused, never
approximated). The network that runs is the floating-point one, not the exact one: :func:`float_error` bounds
the rounding its float forward can make on the box, valid for any summation order, so on every CPU.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.modules.module as _module  # the global hook registries

from ..core.convert import _plain

__all__ = ["affine_layers", "interval_bounds", "crown_bounds", "float_error", "unit_roundoff"]

_LARGEST = 1e30  # the widest box the bounds are computed on: beyond it, float64 products overflow


class _Tracer(torch.fx.Tracer):
    """torch.fx's tracer, with λ-GELU layers kept whole so that they can be named in the refusal."""

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return type(m).__module__.startswith("lambda_gelu") or super().is_leaf_module(m, qualname)


def _kind(node: torch.fx.Node, modules: dict[str, nn.Module]) -> str | None:
    """What a traced operation is to the verifier: linear, relu, gelu, flatten, identity, or None."""
    F = nn.functional
    if node.op == "call_module":
        m = modules[node.target]
        if _plain(m, nn.Linear):
            return "linear"
        if _plain(m, nn.ReLU):
            return "relu"
        if _plain(m, nn.GELU) and m.approximate == "none":
            return "gelu"
        if _plain(m, nn.Flatten) and m.start_dim == 1 and m.end_dim == -1:
            return "flatten"
        if _plain(m, nn.Identity) or (_plain(m, nn.Dropout) and not m.training):
            return "identity"
        return None
    if node.op == "call_function":
        if node.target in (F.relu, torch.relu) and not node.kwargs.get("inplace", False):
            return "relu"
        if node.target is F.gelu and node.kwargs.get("approximate", "none") == "none":
            return "gelu"
        if node.target is torch.flatten and tuple(node.args[1:]) + tuple(node.kwargs.values()) in ((1,), (1, -1)):
            return "flatten"
    if node.op == "call_method":
        if node.target == "relu":
            return "relu"
        if node.target == "flatten" and tuple(node.args[1:]) + tuple(node.kwargs.values()) in ((1,), (1, -1)):
            return "flatten"
    return None


def affine_layers(model: nn.Module) -> tuple[list[tuple[np.ndarray, np.ndarray]], str]:
    """The (W, b) of each Linear, in float64, and the activation between them ('relu' or 'gelu').

    Sound by construction: the forward is traced (torch.fx) and must be one strict chain — input,
    optionally a flatten of all but the batch dimension, then Linear, activation, Linear, ...,
    Linear, output — each operation consuming only the previous one's result, which nothing else
    uses. Identity and eval-mode Dropout are passed over. Anything else (a residual connection, two
    Linears in a row, a module or function the verifier does not model, a mix of activations, a
    forward hook, which tracing does not see) is refused with a ValueError naming it, rather than
    verified as something it is not.
    """
    def refuse(why: str):
        raise ValueError(f"cannot verify this model: {why}. The verifier handles a chain input → [Flatten] → Linear "
                         "→ activation → ... → Linear with one kind of activation (ReLU; exact GELU for interval "
                         "bounds only)")

    hooked = [repr(name) if name else "the model itself" for name, m in model.named_modules()
              if m._forward_hooks or m._forward_pre_hooks]
    if hooked:  # a hook runs when the model is called, not in the traced forward: what it changes would go unseen
        refuse(f"{hooked[0]} has forward hooks, which may change what it computes and which its traced forward "
               "does not show; remove them first (torch.nn.utils.prune.remove makes a pruning permanent)")
    if _module._global_forward_hooks or _module._global_forward_pre_hooks:
        refuse("global module forward hooks are registered (torch.nn.modules.module.register_module_forward_hook "
               "or _pre_hook), which may change what every module computes; remove them first")
    try:
        graph = _Tracer().trace(model)
    except Exception as e:
        refuse(f"its forward cannot be traced with torch.fx ({type(e).__name__}: {e})")
    modules = dict(model.named_modules())
    layers, acts, prev, expect = [], set(), None, "linear"
    for node in graph.nodes:
        what = f"'{node.target}'" if node.op == "call_module" else f"{node.op} {getattr(node.target, '__name__', node.target)}"
        if node.op == "placeholder":
            if prev is not None:
                refuse("its forward takes more than one input")
            prev = node
            continue
        if node.op != "output" and (node.all_input_nodes != [prev] or len(prev.users) != 1):
            refuse(f"{what} is not the sole consumer of the previous operation (a branch or a residual connection)")
        if node.op == "output":
            if node.args[0] is not prev or len(prev.users) != 1:
                refuse("its output is not the last operation of the chain")
            if expect != "activation":
                refuse("it does not end with a Linear layer")
            break
        kind = _kind(node, modules)
        if kind is None:
            m = modules.get(node.target) if node.op == "call_module" else None
            hint = " (ReLU-ize it first: lambda_gelu.to_relu_)" if m is not None and "lambda_gelu" in type(m).__module__ else ""
            hint = " (call model.eval() first)" if isinstance(m, nn.Dropout) else hint
            kind_of = "" if m is None else f" is a {type(m).__name__}"
            if m is not None and not type(m).__module__.startswith("torch.nn.modules"):
                kind_of += f" (from {type(m).__module__})"  # e.g. torch.ao's quantization-aware Linear
            refuse(f"{what}{kind_of} that it does not model{hint}")
        if kind == "flatten" and (layers or expect != "linear"):
            refuse(f"{what} flattens after the first Linear layer")
        if kind == "linear":
            if expect != "linear":
                refuse(f"{what} follows another Linear layer with no activation between them")
            m = modules[node.target]
            b = m.bias.detach() if m.bias is not None else torch.zeros(m.out_features)
            W, b = m.weight.detach().double().numpy(), b.double().numpy()
            if not (np.isfinite(W).all() and np.isfinite(b).all()):
                refuse(f"{what} has non-finite weights or bias (inf or NaN)")
            layers.append((W, b))
            expect = "activation"
        elif kind in ("relu", "gelu"):
            if expect != "activation":
                refuse(f"{what} is an activation that does not follow a Linear layer")
            acts.add(kind)
            expect = "linear"
        prev = node
    if len(acts) != 1:
        refuse(f"found activations {sorted(acts)}; exactly one kind is needed")
    return layers, acts.pop()


def _gelu(z):
    from scipy.special import ndtr
    return z * ndtr(z)


_GELU_ARGMIN = -0.7517916  # GELU is decreasing below this point and increasing above


def _act_interval(l, u, act):
    if act == "relu":
        return np.maximum(l, 0), np.maximum(u, 0)
    lo = np.minimum(_gelu(l), _gelu(u))
    lo = np.where((l < _GELU_ARGMIN) & (u > _GELU_ARGMIN), _gelu(np.float64(_GELU_ARGMIN)), lo)
    return lo, np.maximum(_gelu(l), _gelu(u))


def _box(lo, hi) -> tuple[np.ndarray, np.ndarray]:
    """``lo`` and ``hi`` as flat float arrays, checked: finite, and lo ≤ hi (an empty box would verify anything)."""
    lo, hi = np.asarray(lo, float).ravel(), np.asarray(hi, float).ravel()
    if lo.shape != hi.shape:
        raise ValueError(f"the box's lo and hi have {lo.size} and {hi.size} values: they must agree")
    if not (np.isfinite(lo).all() and np.isfinite(hi).all()):
        raise ValueError("the box [lo, hi] must be finite (inf or NaN found): clip it to the data domain")
    if max(np.abs(lo).max(initial=0), np.abs(hi).max(initial=0)) > _LARGEST:
        raise ValueError(f"the box [lo, hi] reaches beyond ±{_LARGEST:g}, where its bounds overflow: clip it to the "
                         "data domain")
    if (lo > hi).any():
        i = int(np.argmax(lo > hi))
        raise ValueError(f"the box is empty: lo[{i}] = {lo[i]:g} > hi[{i}] = {hi[i]:g}; it needs lo ≤ hi elementwise")
    return lo, hi


def interval_bounds(layers, act, lo, hi):
    """Interval bound propagation: pre-activation [l, u] of every layer (the last is the logits)."""
    bounds = []
    a_lo, a_hi = _box(lo, hi)
    for i, (W, b) in enumerate(layers):
        mid, rad = (a_hi + a_lo) / 2, (a_hi - a_lo) / 2
        zm, zr = W @ mid + b, np.abs(W) @ rad
        bounds.append((zm - zr, zm + zr))
        if i < len(layers) - 1:
            a_lo, a_hi = _act_interval(zm - zr, zm + zr, act)
    return bounds


def unit_roundoff(model: nn.Module) -> float:
    """The unit roundoff u of the arithmetic ``model``'s Linear layers run in (the coarsest of their
    dtypes): 2⁻²⁴ for float32, 2⁻⁵³ for float64. A ValueError while torch may run float32 products in
    reduced precision (``torch.set_float32_matmul_precision`` other than "highest"), whose rounding
    the verifier does not bound."""
    dtypes = {m.weight.dtype for m in model.modules() if isinstance(m, nn.Linear)}
    if torch.float32 in dtypes and torch.get_float32_matmul_precision() != "highest":
        raise ValueError(f"torch.get_float32_matmul_precision() is {torch.get_float32_matmul_precision()!r}: float32 "
                         "products may run in reduced precision, which the verifier cannot bound; verify with "
                         "torch.set_float32_matmul_precision('highest')")
    return max(torch.finfo(d).eps / 2 for d in dtypes)


def float_error(layers, bounds, lo, hi, unit: float, spec: np.ndarray | None = None) -> np.ndarray:
    """A bound on |computed − exact| of each row of ``spec``·logits (of each logit if ``spec`` is None) over
    the box [lo, hi], when the ReLU chain runs in floating point of unit roundoff ``unit``.

    Layer k's sums, in any order, with or without fused multiply-adds, round by at most
    δₖ = γₙ·(|W|·|â| + |b|) (γₙ = n·u / (1 − n·u), n the terms; Higham, *Accuracy and Stability of
    Numerical Algorithms*, §3.1), â the computed input. The error of c·logits is Σₖ Vₖ·(rounding of
    layer k) with Vₖ = c·W_L·D·W_{L−1}⋯W_{k+1}·D, each D diagonal with ReLU's secant slopes in [0, 1]:
    exactly 1 or 0 for a unit whose exact and computed values are sure to share a side. Vₖ is bounded
    backwards as an interval, as CROWN bounds a margin, which keeps the cancellation a product of
    absolute values |W| would lose. ``bounds``: every layer's pre-activation bounds over the box
    (:func:`interval_bounds` or :func:`crown_bounds`)."""
    lo, hi = _box(lo, hi)
    C = np.eye(layers[-1][0].shape[0]) if spec is None else np.atleast_2d(np.asarray(spec, float))
    # forward: each layer's own rounding δ, and a coarse bound of every unit's accumulated error
    mag, coarse, deltas, coarses = np.maximum(np.abs(lo), np.abs(hi)), np.zeros(lo.shape), [], []
    for k, (W, b) in enumerate(layers):
        n = W.shape[1] + 1  # the bias is one more term
        if n * unit >= 1:
            raise ValueError(f"layer {k} sums {n} terms, too many to bound their rounding at unit roundoff {unit:g}: "
                             "verify the network in a wider dtype (model.float())")
        absW = np.abs(W)
        delta = n * unit / (1 - n * unit) * (absW @ (mag + coarse) + np.abs(b))
        coarse = absW @ coarse + delta
        deltas.append(delta), coarses.append(coarse)
        if k < len(layers) - 1:
            mag = np.maximum(bounds[k][1], 0.0)  # |ReLU(z)| ≤ max(u, 0)
    # backward: Vₖ as an interval [v_lo, v_hi], one row per row of C
    v_lo = v_hi = C
    total = np.abs(C) @ deltas[-1]
    for k in range(len(layers) - 2, -1, -1):
        W = layers[k + 1][0]
        mid, rad = (v_lo + v_hi) / 2 @ W, (v_hi - v_lo) / 2 @ np.abs(W)
        g_lo, g_hi = mid - rad, mid + rad
        l, u = bounds[k]
        on, off = l - coarses[k] >= 0, u + coarses[k] <= 0  # exact and computed value both ≥ 0 / both ≤ 0
        v_lo = np.where(on, g_lo, np.where(off, 0.0, np.minimum(g_lo, 0.0)))
        v_hi = np.where(on, g_hi, np.where(off, 0.0, np.maximum(g_hi, 0.0)))
        total = total + np.maximum(-v_lo, v_hi) @ deltas[k]
    return total


def _relaxation(l, u):
    """Linear bounds of ReLU on [l, u]: lower a ≥ α·z, upper a ≤ s·z + t (CROWN's adaptive α)."""
    active, unstable = l >= 0, (l < 0) & (u > 0)
    s = np.where(active, 1.0, 0.0)
    t = np.zeros_like(l)
    denom = np.where(unstable, u - l, 1.0)
    s = np.where(unstable, u / denom, s)
    t = np.where(unstable, -u * l / denom, t)
    alpha = np.where(active, 1.0, np.where(unstable, (u >= -l).astype(float), 0.0))
    return alpha, s, t


def _backward_bound(C, k, layers, bounds, lo, hi, lower: bool):
    """Bound C·z_k (z_k the pre-activation of layer k) over the box, given bounds of layers < k."""
    W, b = layers[k]
    const = C @ b
    M = C @ W
    for j in range(k - 1, -1, -1):
        alpha, s, t = _relaxation(*bounds[j])
        Mp, Mn = np.maximum(M, 0), np.minimum(M, 0)
        if lower:  # positive coefficients take the lower relaxation, negative ones the upper
            lam, const = Mp * alpha + Mn * s, const + Mn @ t
        else:
            lam, const = Mp * s + Mn * alpha, const + Mp @ t
        Wj, bj = layers[j]
        const = const + lam @ bj
        M = lam @ Wj
    Mp, Mn = np.maximum(M, 0), np.minimum(M, 0)
    return const + (Mp @ lo + Mn @ hi if lower else Mp @ hi + Mn @ lo)


def crown_bounds(layers, lo, hi, spec: np.ndarray | None = None):
    """CROWN linear bounds of every layer's pre-activations (each at least as tight as interval
    bounds), and, given ``spec`` (rows c), a lower bound of c·logits for each row. A ValueError where they
    overflow float64 (a box or weights too large), never a bound of inf."""
    lo, hi = _box(lo, hi)
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused below, not warned about
        ibp = interval_bounds(layers, "relu", lo, hi)
        bounds = []
        for k in range(len(layers)):
            if k == 0:
                bounds.append(ibp[0])
                continue
            eye = np.eye(layers[k][0].shape[0])
            l = _backward_bound(eye, k, layers, bounds, lo, hi, lower=True)
            u = _backward_bound(eye, k, layers, bounds, lo, hi, lower=False)
            bounds.append((np.maximum(l, ibp[k][0]), np.minimum(u, ibp[k][1])))
        spec_lower = None if spec is None else _backward_bound(spec, len(layers) - 1, layers, bounds, lo, hi,
                                                               lower=True)
    if not all(np.isfinite(l).all() and np.isfinite(u).all() for l, u in bounds) or (
            spec_lower is not None and not np.isfinite(spec_lower).all()):
        raise ValueError("the network's bounds over this box overflow float64: the box or the weights are too large "
                         "to verify")
    return bounds, spec_lower


def _margin_spec(label: int, num_classes: int) -> np.ndarray:
    rows = [k for k in range(num_classes) if k != label]
    C = np.zeros((len(rows), num_classes))
    C[np.arange(len(rows)), label] = 1.0
    C[np.arange(len(rows)), rows] = -1.0
    return C
