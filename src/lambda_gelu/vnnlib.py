"""Local-robustness properties in VNN-LIB, the interchange of VNN-COMP (read by α,β-CROWN, Marabou, NNV, PyRAT),
written beside a network's ONNX and read back into :func:`lambda_gelu.verify.verify_point`.

A property states the *unsafe* outputs; a verifier answers ``sat`` (some input in the box reaches them: a
counterexample), ``unsat`` (none does: the network is robust there) or ``unknown``. For classification
robustness, VNN-COMP's benchmarks write the input box and the disjunction "some other class scores at least
the label's":

    (declare-const X_0 Real) ... (declare-const Y_0 Real) ...
    (assert (<= X_0 0.52)) (assert (>= X_0 0.48)) ...
    (assert (or (and (>= Y_1 Y_0)) (and (>= Y_2 Y_0)) ...))

That subset is what :func:`read_robustness` reads: one lower and one upper bound per input, and output
constraints that are all ``Y_k >= Y_label`` for one label (a single comparison, a disjunction of them, with or
without ``and`` around each). Anything else — a linear combination, a constant on the output side, an input
constraint that is not a bound — is refused with the construct named, never approximated.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["RobustnessProperty", "write_robustness", "read_robustness", "VNNLibError", "VERDICTS"]

VERDICTS = {"verified": "unsat", "falsified": "sat", "timeout": "unknown"}  # VerifyResult.status → VNN-COMP's word


class VNNLibError(ValueError):
    """A VNN-LIB file this reader does not support or cannot parse; the message names the construct."""


@dataclass
class RobustnessProperty:
    lo: np.ndarray         # the input box, flat
    hi: np.ndarray
    label: int             # the class every input of the box must keep
    num_classes: int


def write_robustness(path: str | Path, lo, hi, label: int, num_classes: int) -> Path:
    """Write "every x in [lo, hi] is classified ``label``" as a VNN-LIB file (the unsafe set: some other class
    scores at least as high). Numbers are written with 17 significant digits, so they read back exactly."""
    lo, hi = np.asarray(lo, dtype=np.float64).ravel(), np.asarray(hi, dtype=np.float64).ravel()
    if lo.shape != hi.shape or not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi)) and np.all(lo <= hi)):
        raise ValueError("the box needs finite lo ≤ hi of one shape")
    if not 0 <= label < num_classes or num_classes < 2:
        raise ValueError(f"label must be a class in [0, {num_classes}) of at least 2, got {label}")
    lines = [f"; local robustness: every input in the box is classified {label}", ""]
    lines += [f"(declare-const X_{i} Real)" for i in range(lo.size)] + [""]
    lines += [f"(declare-const Y_{j} Real)" for j in range(num_classes)] + [""]
    for i, (a, b) in enumerate(zip(lo, hi)):
        lines += [f"(assert (<= X_{i} {_number(b)}))", f"(assert (>= X_{i} {_number(a)}))"]
    others = [k for k in range(num_classes) if k != label]
    lines += ["", "(assert (or"] + [f"    (and (>= Y_{k} Y_{label}))" for k in others] + ["))", ""]
    path = Path(path)
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def _number(v: float) -> str:
    return repr(float(v))  # shortest text that reads back to the same double


_TOKEN = re.compile(r"\(|\)|[^\s()]+")


def _parse(text: str) -> list:
    """The file's s-expressions, comments removed."""
    text = "\n".join(line.split(";", 1)[0] for line in text.splitlines())
    stack, top = [], []
    for tok in _TOKEN.findall(text):
        if tok == "(":
            stack.append(top)
            top = []
        elif tok == ")":
            if not stack:
                raise VNNLibError("unbalanced ')'")
            done, top = top, stack.pop()
            top.append(done)
        else:
            top.append(tok)
    if stack:
        raise VNNLibError("unbalanced '(': the file ends inside an expression")
    return top


def read_robustness(path: str | Path) -> RobustnessProperty:
    """The classification-robustness property of a VNN-LIB file (the subset in the module's docstring)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise VNNLibError(f"cannot read {path} as text ({e})") from None
    xs, ys, lo, hi, outputs = set(), set(), {}, {}, []
    for expr in _parse(text):
        if not isinstance(expr, list) or not expr:
            raise VNNLibError(f"a top-level {expr!r} that is not an expression")
        head = expr[0]
        if head == "declare-const":
            if len(expr) != 3 or expr[2] != "Real" or not re.fullmatch(r"[XY]_\d+", expr[1]):
                raise VNNLibError(f"declaration {_show(expr)}: only 'X_i Real' and 'Y_j Real' are supported")
            (xs if expr[1][0] == "X" else ys).add(int(expr[1][2:]))
        elif head == "assert":
            if len(expr) != 2:
                raise VNNLibError(f"assert {_show(expr)}: one formula per assert")
            _assertion(expr[1], lo, hi, outputs)
        else:
            raise VNNLibError(f"command {head!r} is not supported (only declare-const and assert)")
    n, m = len(xs), len(ys)
    if xs != set(range(n)) or ys != set(range(m)) or n == 0 or m < 2:
        raise VNNLibError("the inputs X_0 … X_{n-1} and outputs Y_0 … Y_{m-1} must be declared, with m ≥ 2")
    missing = [i for i in range(n) if i not in lo or i not in hi]
    if missing:
        raise VNNLibError(f"input X_{missing[0]} has no {'lower' if missing[0] not in lo else 'upper'} bound: "
                          "a robustness property bounds every input")
    if not outputs:
        raise VNNLibError("no output constraint: a robustness property states the unsafe outputs")
    undeclared = sorted({v for pair in outputs for v in pair} - ys)
    if undeclared:
        raise VNNLibError(f"output Y_{undeclared[0]} is used but not declared")
    labels = {b for _, b in outputs}
    others = {a for a, _ in outputs}
    if len(labels) != 1:
        raise VNNLibError(f"output constraints compare against several outputs ({sorted(labels)}): only "
                          "'Y_k >= Y_label' for one label is supported")
    (label,) = labels
    if others != set(range(m)) - {label}:
        raise VNNLibError(f"the unsafe set names classes {sorted(others)} against {label}, not every other class: "
                          "only full classification robustness is supported")
    bounds_lo = np.array([lo[i] for i in range(n)])
    bounds_hi = np.array([hi[i] for i in range(n)])
    if np.any(bounds_lo > bounds_hi):
        raise VNNLibError(f"input X_{int(np.argmax(bounds_lo > bounds_hi))} has lower bound above its upper bound")
    return RobustnessProperty(bounds_lo, bounds_hi, label, m)


def _assertion(formula, lo: dict, hi: dict, outputs: list) -> None:
    if isinstance(formula, list) and formula and formula[0] in ("<=", ">=") and len(formula) == 3:
        a, b = formula[1], formula[2]
        if _is_var(a, "X") and _is_num(b) or _is_var(b, "X") and _is_num(a):
            var, value, upper = (a, b, formula[0] == "<=") if _is_var(a, "X") else (b, a, formula[0] == ">=")
            i, v = int(var[2:]), float(value)
            if not math.isfinite(v):
                raise VNNLibError(f"bound {_show(formula)} is not finite")
            target = hi if upper else lo
            if i in target:
                raise VNNLibError(f"input {var} has two {'upper' if upper else 'lower'} bounds")
            target[i] = v
            return
    outputs.extend(_disjuncts(formula))


def _disjuncts(formula) -> list[tuple[int, int]]:
    """[(k, label)] for a formula that is Y_k >= Y_label, or a disjunction of such (each possibly in an 'and')."""
    if isinstance(formula, list) and formula and formula[0] == "or":
        return [pair for f in formula[1:] for pair in _disjuncts(f)]
    if isinstance(formula, list) and len(formula) == 2 and formula[0] == "and":
        return _disjuncts(formula[1])
    if isinstance(formula, list) and len(formula) == 3 and formula[0] in ("<=", ">="):
        a, b = formula[1], formula[2]
        if _is_var(a, "Y") and _is_var(b, "Y"):
            big, small = (a, b) if formula[0] == ">=" else (b, a)
            return [(int(big[2:]), int(small[2:]))]
    raise VNNLibError(f"constraint {_show(formula)} is not supported: output constraints must be 'Y_k >= Y_label' "
                      "(or a disjunction of them); input constraints bounds 'X_i <= c' / 'X_i >= c'")


def _is_var(tok, prefix: str) -> bool:
    return isinstance(tok, str) and re.fullmatch(prefix + r"_\d+", tok) is not None


def _is_num(tok) -> bool:
    if not isinstance(tok, str):
        return False
    try:
        float(tok)
    except ValueError:
        return False
    return True


def _show(expr) -> str:
    text = expr if isinstance(expr, str) else "(" + " ".join(_show(e) for e in expr) + ")"
    return text if len(text) <= 80 else text[:77] + "..."
