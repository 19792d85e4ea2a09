"""Properties in VNN-LIB, the interchange of VNN-COMP (read by α,β-CROWN, Marabou, NNV, PyRAT), written beside a
network's ONNX and read back for :func:`lambda_gelu.verify.verify_property`.

A property states the *unsafe* outputs; a verifier answers ``sat`` (some input in the box reaches them: a
counterexample), ``unsat`` (none does) or ``unknown``. Its asserts hold together (SMT-LIB's semantics): the unsafe
set is the conjunction of every assert, each of which may be a disjunction of conjunctions. VNN-COMP's
classification-robustness benchmarks, for instance, write the input box and "some other class scores at least
the label's":

    (declare-const X_0 Real) ... (declare-const Y_0 Real) ...
    (assert (<= X_0 0.52)) (assert (>= X_0 0.48)) ...
    (assert (or (and (>= Y_1 Y_0)) (and (>= Y_2 Y_0)) ...))

What :func:`read_property` reads: one lower and one upper bound per input, each a top-level assert
``(<= X_i c)`` / ``(>= X_i c)``; output constraints built from ``and``, ``or`` and the comparisons ``<=``,
``>=`` between linear expressions of the outputs (numbers, ``Y_j``, ``+``, ``-``, ``*`` by a number). They are
brought to one disjunction of polytopes {y : C·y ≤ d}. Anything else — an input inside ``or``, a strict or
negated comparison, a product of two outputs — is refused with the construct named, never approximated.

The file is read as a stream with bounds on its size, nesting, token length and the number of polytopes, so a
hostile file ends in one :class:`VNNLibError` line within bounded memory, never a traceback.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["Property", "RobustnessProperty", "write_robustness", "read_property", "read_robustness",
           "VNNLibError", "VERDICTS", "LIMITS"]

VERDICTS = {"verified": "unsat", "falsified": "sat", "timeout": "unknown"}  # VerifyResult.status → VNN-COMP's word

# What a property file may hold; past any of these it is refused in one line, having read no more than that.
LIMITS = {
    "chars": 1 << 28,             # characters in the file (256 Mi)
    "token": 1 << 10,             # characters in one name or number
    "depth": 64,                  # nesting of parentheses
    "expression": 1 << 20,        # tokens in one top-level expression
    "disjuncts": 1 << 14,         # polytopes in the unsafe set, once the asserts are multiplied out
}
_CHUNK = 1 << 20


class VNNLibError(ValueError):
    """A VNN-LIB file this reader does not support or cannot parse; the message names the construct."""


@dataclass
class Property:
    lo: np.ndarray                           # the input box, flat, float64
    hi: np.ndarray
    num_outputs: int                         # the outputs Y_0 … Y_{m-1} it declares
    unsafe: list[tuple[np.ndarray, np.ndarray]]  # the unsafe set: a union of {y : C·y ≤ d}, each (C (k×m), d (k))

    @property
    def num_inputs(self) -> int:
        return self.lo.size


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


# ---------------------------------------------------------------------------------------------------- reading

_TOKEN = re.compile(r"\(|\)|;[^\n]*|[^\s();]+")


def _tokens(stream):
    """The tokens of a text stream, comments dropped, read a chunk at a time: a token or a comment may span
    chunks; a token longer than LIMITS['token'] or a file longer than LIMITS['chars'] is refused."""
    carry, in_comment, read = "", False, 0
    while True:
        chunk = stream.read(_CHUNK)
        read += len(chunk)
        if read > LIMITS["chars"]:
            raise VNNLibError(f"the file is longer than {LIMITS['chars']:,} characters: not a property this reader "
                              "takes")
        end = not chunk
        text, carry, pos = carry + chunk, "", 0
        if in_comment:
            newline = text.find("\n")
            if newline < 0:
                if end:
                    return
                continue
            pos, in_comment = newline + 1, False
        for m in _TOKEN.finditer(text, pos):
            tok = m.group()
            if m.end() == len(text) and not end and tok not in "()":  # may go on in the next chunk
                if tok[0] == ";":
                    in_comment = True
                else:
                    carry = tok
                break
            if tok[0] != ";":
                yield tok
        if len(carry) > LIMITS["token"]:
            raise VNNLibError(f"a name or number longer than {LIMITS['token']} characters: not VNN-LIB text")
        if end:
            return


def _expressions(tokens):
    """Each top-level s-expression as nested lists, as soon as it closes (bounded depth and size)."""
    stack, top, count = [], None, 0
    for tok in tokens:
        if len(tok) > LIMITS["token"]:
            raise VNNLibError(f"a name or number longer than {LIMITS['token']} characters: not VNN-LIB text")
        count += 1
        if count > LIMITS["expression"]:
            raise VNNLibError(f"an expression of more than {LIMITS['expression']:,} tokens: too large to read")
        if tok == "(":
            if len(stack) >= LIMITS["depth"]:
                raise VNNLibError(f"expressions nested deeper than {LIMITS['depth']} levels")
            stack.append(top)
            top = []
        elif tok == ")":
            if not stack:
                raise VNNLibError("unbalanced ')'")
            done, top = top, stack.pop()
            if top is None:
                yield done
                count = 0
            else:
                top.append(done)
        elif not stack:
            raise VNNLibError(f"a top-level {tok!r} that is not an expression")
        else:
            top.append(tok)
    if stack:
        raise VNNLibError("unbalanced '(': the file ends inside an expression")


def read_property(path: str | Path, num_inputs: int | None = None, num_outputs: int | None = None) -> Property:
    """The property of a VNN-LIB file (the subset in the module's docstring). Given the network's
    ``num_inputs`` and ``num_outputs``, a property that declares other counts is refused as soon as it is read."""
    try:
        with open(path, encoding="utf-8") as stream:
            return _read(stream, num_inputs, num_outputs)
    except (OSError, UnicodeDecodeError) as e:
        raise VNNLibError(f"cannot read {path} as text ({e})") from None


def _read(stream, num_inputs, num_outputs) -> Property:
    xs, ys, lo, hi, unsafe = set(), set(), {}, {}, [[]]  # unsafe: a disjunction of conjunctions of rows
    for expr in _expressions(_tokens(stream)):
        head = expr[0] if expr else None
        if head == "declare-const":
            if len(expr) != 3 or expr[2] != "Real" or not _is_var(expr[1], "[XY]"):
                raise VNNLibError(f"declaration {_show(expr)}: only 'X_i Real' and 'Y_j Real' are supported")
            kind, index = expr[1][0], int(expr[1][2:])
            limit = num_inputs if kind == "X" else num_outputs
            if limit is not None and index >= limit:
                raise VNNLibError(f"the property declares {expr[1]}, but the network has {limit} "
                                  f"{'inputs' if kind == 'X' else 'outputs'}")
            (xs if kind == "X" else ys).add(index)
        elif head == "assert":
            if len(expr) != 2:
                raise VNNLibError(f"assert {_show(expr)}: one formula per assert")
            if not _bound(expr[1], xs, lo, hi):
                unsafe = _conjoin(unsafe, _dnf(expr[1], ys))
        else:
            raise VNNLibError(f"command {_show(head) if head else '()'!r} is not supported (only declare-const and "
                              "assert)")
    n, m = len(xs), len(ys)
    if xs != set(range(n)) or ys != set(range(m)) or n == 0 or m == 0:
        raise VNNLibError("the inputs X_0 … X_{n-1} and outputs Y_0 … Y_{m-1} must all be declared")
    for kind, declared, expected in (("inputs", n, num_inputs), ("outputs", m, num_outputs)):
        if expected is not None and declared != expected:
            raise VNNLibError(f"the property declares {declared} {kind}, but the network has {expected}")
    missing = [i for i in range(n) if i not in lo or i not in hi]
    if missing:
        raise VNNLibError(f"input X_{missing[0]} has no {'lower' if missing[0] not in lo else 'upper'} bound: "
                          "the verifier needs a bounded box")
    if unsafe == [[]]:
        raise VNNLibError("no output constraint: a property states the unsafe outputs")
    bounds_lo = np.array([lo[i] for i in range(n)])
    bounds_hi = np.array([hi[i] for i in range(n)])
    if np.any(bounds_lo > bounds_hi):
        raise VNNLibError(f"input X_{int(np.argmax(bounds_lo > bounds_hi))} has lower bound above its upper bound")
    polytopes = []
    for rows in unsafe:
        C = np.zeros((len(rows), m))
        d = np.empty(len(rows))
        for r, (coeffs, bound) in enumerate(rows):
            for j, c in coeffs.items():
                C[r, j] = c
            d[r] = bound
        polytopes.append((C, d))
    return Property(bounds_lo, bounds_hi, m, polytopes)


def _bound(formula, xs: set, lo: dict, hi: dict) -> bool:
    """Record ``formula`` if it is an input bound X_i <= c or X_i >= c (either side); False if it names no input."""
    if not _mentions(formula, "X"):
        return False
    if isinstance(formula, list) and len(formula) > 1 and formula[0] == "and":
        for f in formula[1:]:  # a conjunction of input bounds: each one a bound
            if not _bound(f, xs, lo, hi):
                raise VNNLibError(f"constraint {_show(formula)} mixes inputs and outputs: inputs take only bounds")
        return True
    if isinstance(formula, list) and len(formula) == 3 and formula[0] in ("<=", ">="):
        a, b = formula[1], formula[2]
        if _is_var(a, "X") and _is_num(b) or _is_var(b, "X") and _is_num(a):
            var, value, upper = (a, b, formula[0] == "<=") if _is_var(a, "X") else (b, a, formula[0] == ">=")
            i, v = int(var[2:]), float(value)
            if i not in xs:
                raise VNNLibError(f"input {var} is bounded but not declared")
            if not math.isfinite(v) or abs(v) > 1e30:
                raise VNNLibError(f"bound {_show(formula)} is not a finite number of at most 1e30 in size")
            target = hi if upper else lo
            if i in target:
                raise VNNLibError(f"input {var} has two {'upper' if upper else 'lower'} bounds")
            target[i] = v
            return True
    raise VNNLibError(f"constraint {_show(formula)} is not supported: inputs take only bounds 'X_i <= c' / "
                      "'X_i >= c', each its own assert")


def _mentions(formula, prefix: str) -> bool:
    if isinstance(formula, str):
        return _is_var(formula, prefix)
    return any(_mentions(f, prefix) for f in formula)


def _conjoin(a: list, b: list) -> list:
    """(∨ A) ∧ (∨ B) as one disjunction: every conjunction of A with every one of B."""
    if len(a) * len(b) > LIMITS["disjuncts"]:
        raise VNNLibError(f"the asserts multiply out to {len(a) * len(b):,} polytopes, more than the "
                          f"{LIMITS['disjuncts']:,} this verifier takes")
    return [x + y for x in a for y in b]


def _dnf(formula, ys: set) -> list:
    """``formula`` over the outputs as a disjunction of conjunctions of rows (coeffs {j: c}, d): Σ c_j·Y_j ≤ d."""
    if isinstance(formula, list) and formula and formula[0] in ("and", "or") and len(formula) > 1:
        parts = [_dnf(f, ys) for f in formula[1:]]
        if formula[0] == "or":
            out = [conj for part in parts for conj in part]
            if len(out) > LIMITS["disjuncts"]:
                raise VNNLibError(f"a disjunction of more than {LIMITS['disjuncts']:,} polytopes")
            return out
        out = [[]]
        for part in parts:
            out = _conjoin(out, part)
        return out
    if isinstance(formula, list) and len(formula) == 3 and formula[0] in ("<=", ">="):
        small, big = (formula[1], formula[2]) if formula[0] == "<=" else (formula[2], formula[1])
        coeffs, const = _linear(small, ys, formula)
        minus, minus_const = _linear(big, ys, formula)
        for j, c in minus.items():
            coeffs[j] = coeffs.get(j, 0.0) - c
        return [[({j: c for j, c in coeffs.items() if c != 0.0}, minus_const - const)]]
    raise VNNLibError(f"constraint {_show(formula)} is not supported: output constraints are 'and', 'or', '<=' and "
                      "'>=' of linear expressions in Y_j")


def _linear(term, ys: set, where) -> tuple[dict, float]:
    """A linear expression in the outputs as ({j: coefficient}, constant)."""
    if _is_num(term):
        value = float(term)
        if not math.isfinite(value) or abs(value) > 1e30:
            raise VNNLibError(f"number {term} in {_show(where)} is not finite, or over 1e30 in size")
        return {}, value
    if _is_var(term, "Y"):
        j = int(term[2:])
        if j not in ys:
            raise VNNLibError(f"output {term} is used but not declared")
        return {j: 1.0}, 0.0
    if isinstance(term, list) and len(term) >= 2 and term[0] in ("+", "-", "*"):
        parts = [_linear(t, ys, where) for t in term[1:]]
        if term[0] == "*":
            if len(parts) != 2 or (parts[0][0] and parts[1][0]):
                raise VNNLibError(f"{_show(term)} in {_show(where)} is not linear: '*' takes a number and one term")
            (ca, ka), (cb, kb) = parts
            scale, (coeffs, const) = (ka, (cb, kb)) if not ca else (kb, (ca, ka))
            return {j: scale * c for j, c in coeffs.items()}, scale * const
        signs = [-1.0] if term[0] == "-" and len(parts) == 1 else \
            [1.0] + [-1.0 if term[0] == "-" else 1.0] * (len(parts) - 1)
        coeffs, const = {}, 0.0
        for sign, (c, k) in zip(signs, parts):
            for j, v in c.items():
                coeffs[j] = coeffs.get(j, 0.0) + sign * v
            const += sign * k
        return coeffs, const
    raise VNNLibError(f"term {_show(term)} in {_show(where)} is not supported: a number, Y_j, or '+', '-', '*' of "
                      "them (inputs appear only in their bounds)")


def read_robustness(path: str | Path) -> RobustnessProperty:
    """A classification-robustness property: the unsafe set "some class k ≠ label has Y_k ≥ Y_label", for every
    other class, and nothing else (the form :func:`write_robustness` writes); any other property is refused."""
    prop = read_property(path)
    m = prop.num_outputs
    rows = []
    for C, d in prop.unsafe:
        if len(d) != 1 or d[0] != 0 or np.count_nonzero(C[0]) != 2 or sorted(C[0][C[0] != 0]) != [-1.0, 1.0]:
            raise VNNLibError("not a classification-robustness property: each unsafe case must be one "
                              "'Y_k >= Y_label'")
        rows.append((int(np.argmax(C[0] < 0)), int(np.argmax(C[0] > 0))))  # (k, label): Y_label − Y_k ≤ 0
    labels = {label for _, label in rows}
    if len(labels) != 1 or {k for k, _ in rows} != set(range(m)) - labels:
        raise VNNLibError("not a classification-robustness property: the unsafe cases must name every other class "
                          "against one label")
    return RobustnessProperty(prop.lo, prop.hi, labels.pop(), m)


def _is_var(tok, prefix: str) -> bool:
    return isinstance(tok, str) and re.fullmatch(prefix + r"_\d{1,9}", tok) is not None


def _is_num(tok) -> bool:
    if not isinstance(tok, str) or not re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", tok):
        return False
    return True


def _show(expr) -> str:
    """An expression as text, cut at 80 characters (built piece by piece: a huge one costs no more)."""
    out, stack = [], [expr]
    while stack and sum(map(len, out)) <= 80:
        e = stack.pop()
        if isinstance(e, str):
            out.append(e)
        else:
            stack.append(")")
            stack.extend(reversed([x for item in e for x in (item, " ")][:-1]))
            out.append("(")
    text = "".join(out)
    return text if len(text) <= 80 and not stack else text[:77] + "..."
