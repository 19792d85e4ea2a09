"""An ONNX graph read back as the plain chain the verifier models — Flatten → Linear → ReLU → … → Linear — or
refused, naming the operator it does not model (the ``[deploy]`` extra: onnx).

Read: ``Flatten``; ``Gemm`` (α = β = 1, the weight an initializer, transposed or not); ``MatMul`` by an
initializer, optionally followed by ``Add`` of an initializer (a bias); ``Relu``; ``Identity``. Every node must
take the previous one's output: a branch, a second input or any other operator is refused, never approximated.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

__all__ = ["load_onnx_chain", "OnnxChainError"]


class OnnxChainError(ValueError):
    """An ONNX graph that is not a chain the verifier models; the message names the node."""


def load_onnx_chain(path: str | Path) -> nn.Sequential:
    """The network of the ONNX file at ``path`` as an ``nn.Sequential`` of ``nn.Flatten``, ``nn.Linear`` and
    ``nn.ReLU``, in float32 (see the module's docstring for what is read)."""
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError:
        raise OnnxChainError("reading ONNX needs the onnx package: pip install 'lambda-gelu[deploy]'") from None
    try:
        model = onnx.load(str(path))
    except Exception as e:  # noqa: BLE001 - a file onnx cannot read: one line, whatever the cause
        first = str(e).splitlines()[0] if str(e) else ""
        raise OnnxChainError(f"cannot read {path} as ONNX ({type(e).__name__}: {first})") from None
    graph = model.graph
    weights = {t.name: numpy_helper.to_array(t).astype(np.float32) for t in graph.initializer}
    inputs = [i.name for i in graph.input if i.name not in weights]
    if len(inputs) != 1 or len(graph.output) != 1:
        raise OnnxChainError(f"the graph has {len(inputs)} inputs and {len(graph.output)} outputs: a chain has one "
                             "of each")
    current, layers, pending = inputs[0], [], None  # pending: a MatMul's Linear waiting for its bias

    def take(node, index=0):
        if not node.input or node.input[index] != current:
            raise OnnxChainError(f"node {node.name or node.op_type} ({node.op_type}) does not take the previous "
                                 "node's output: only a plain chain is modelled")

    def const(node, name):
        if name not in weights:
            raise OnnxChainError(f"node {node.name or node.op_type} ({node.op_type}) multiplies by {name!r}, which "
                                 "is not a constant of the graph")
        return weights[name]

    for node in graph.node:
        op = node.op_type
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if op != "Add" and pending is not None:
            layers.append(pending)
            pending = None
        if op == "Flatten":
            take(node)
            if attrs.get("axis", 1) != 1:
                raise OnnxChainError(f"Flatten with axis={attrs['axis']}: only axis 1 (keep the batch) is modelled")
            layers.append(nn.Flatten())
        elif op == "Gemm":
            take(node)
            if attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0 or attrs.get("transA", 0):
                raise OnnxChainError(f"Gemm {node.name} with alpha, beta or transA other than 1, 1, 0 is not modelled")
            w = const(node, node.input[1])
            w = w if attrs.get("transB", 0) else w.T  # nn.Linear keeps (out, in)
            b = const(node, node.input[2]) if len(node.input) > 2 and node.input[2] else None
            layers.append(_linear(w, b))
        elif op == "MatMul":
            take(node)
            pending = _linear(const(node, node.input[1]).T, None)
        elif op == "Add":
            if pending is None:
                raise OnnxChainError(f"Add {node.name} not after a MatMul: only a bias is modelled")
            first, second = node.input
            bias = second if first == current else first if second == current else None
            if bias is None:
                raise OnnxChainError(f"Add {node.name} does not take the previous node's output")
            b = const(node, bias).reshape(-1)
            if b.size != pending.out_features:
                raise OnnxChainError(f"Add {node.name} adds {b.size} values to {pending.out_features} outputs")
            pending.bias = nn.Parameter(torch.from_numpy(b.copy()), requires_grad=False)
            layers.append(pending)
            pending = None
        elif op == "Relu":
            take(node)
            layers.append(nn.ReLU())
        elif op == "Identity":
            take(node)
        else:
            raise OnnxChainError(f"operator {op} (node {node.name or '?'}) is not modelled by the verifier: it reads "
                                 "Flatten, Gemm, MatMul (+ Add), Relu and Identity chains only")
        current = node.output[0]
    if pending is not None:
        layers.append(pending)
    if current != graph.output[0].name:
        raise OnnxChainError("the graph's output is not its last node's: only a plain chain is modelled")
    if not any(isinstance(m, nn.Linear) for m in layers):
        raise OnnxChainError("the graph has no linear layer")
    return nn.Sequential(*layers).eval()


def _linear(w: np.ndarray, b: np.ndarray | None) -> nn.Linear:
    if w.ndim != 2:
        raise OnnxChainError(f"a weight of shape {w.shape} is not a matrix")
    layer = nn.Linear(w.shape[1], w.shape[0], bias=True)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(np.ascontiguousarray(w)))
        if b is None:
            layer.bias.zero_()
        else:
            layer.bias.copy_(torch.from_numpy(b.reshape(-1).copy()))
    layer.requires_grad_(False)
    return layer
