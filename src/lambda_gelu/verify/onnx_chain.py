"""An ONNX graph read back as the plain chain the verifier models — Flatten → Linear → ReLU → … → Linear — or
refused, naming the operator it does not model (the ``[deploy]`` extra: onnx).

Read: ``Flatten``; ``Gemm`` (α = β = 1, the weight an initializer, transposed or not); ``MatMul`` by an
initializer, optionally followed by ``Add`` of an initializer (a bias); ``Relu``; ``Identity`` (of the chain, or
of an initializer, as torch's exporter writes shared weights). Every node must take the previous one's output, in
float32, of the standard ONNX domain: a branch, a second input, another dtype (float16 rounds otherwise than the
verifier's bound) or any other operator is refused, never approximated. External data is read only from regular
files inside the model's own folder, whatever the installed onnx would follow.
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
    model = _load(onnx, Path(path))
    graph = model.graph
    for t in graph.initializer:
        if t.data_type != onnx.TensorProto.FLOAT:
            raise OnnxChainError(f"initializer {t.name!r} is {_dtype(onnx, t.data_type)}: the verifier models "
                                 "float32 networks only")
    weights = {t.name: numpy_helper.to_array(t).astype(np.float32) for t in graph.initializer}
    inputs = [i for i in graph.input if i.name not in weights]
    if len(inputs) != 1 or len(graph.output) != 1:
        raise OnnxChainError(f"the graph has {len(inputs)} inputs and {len(graph.output)} outputs: a chain has one "
                             "of each")
    for value in (inputs[0], graph.output[0]):
        elem = value.type.tensor_type.elem_type
        if elem != onnx.TensorProto.FLOAT:
            raise OnnxChainError(f"{value.name!r} is {_dtype(onnx, elem)}: the verifier models float32 networks "
                                 "only")
    current, layers, pending = inputs[0].name, [], None  # pending: a MatMul's Linear waiting for its bias

    def take(node, count=1):
        if len(node.input) != count or node.input[0] != current or len(node.output) != 1:
            raise OnnxChainError(f"node {node.name or node.op_type} ({node.op_type}) does not take the previous "
                                 "node's output alone: only a plain chain is modelled")

    def const(node, name):
        if name not in weights:
            raise OnnxChainError(f"node {node.name or node.op_type} ({node.op_type}) multiplies by {name!r}, which "
                                 "is not a constant of the graph")
        return weights[name]

    for node in graph.node:
        op = node.op_type
        if node.domain not in ("", "ai.onnx"):
            raise OnnxChainError(f"node {node.name or op} is {op} of the domain {node.domain!r}: the verifier "
                                 "models only the standard ONNX operators")
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if op == "Identity" and len(node.input) == 1 and node.input[0] in weights:
            weights[node.output[0]] = weights[node.input[0]]  # torch's exporter shares equal initializers so
            continue
        if op != "Add" and pending is not None:
            layers.append(pending)
            pending = None
        if op == "Flatten":
            take(node)
            if attrs.get("axis", 1) != 1:
                raise OnnxChainError(f"Flatten with axis={attrs['axis']}: only axis 1 (keep the batch) is modelled")
            layers.append(nn.Flatten())
        elif op == "Gemm":
            take(node, len(node.input))
            if len(node.input) not in (2, 3):
                raise OnnxChainError(f"Gemm {node.name} takes {len(node.input)} inputs")
            if attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0 or attrs.get("transA", 0):
                raise OnnxChainError(f"Gemm {node.name} with alpha, beta or transA other than 1, 1, 0 is not modelled")
            w = const(node, node.input[1])
            w = w if attrs.get("transB", 0) else w.T  # nn.Linear keeps (out, in)
            b = const(node, node.input[2]) if len(node.input) > 2 and node.input[2] else None
            layers.append(_linear(w, b, node))
        elif op == "MatMul":
            take(node, 2)
            pending = _linear(const(node, node.input[1]).T, None, node)
        elif op == "Add":
            if pending is None:
                raise OnnxChainError(f"Add {node.name} not after a MatMul: only a bias is modelled")
            first, second = node.input
            bias = second if first == current else first if second == current else None
            if bias is None:
                raise OnnxChainError(f"Add {node.name} does not take the previous node's output")
            pending = _linear(pending.weight.detach().numpy(), const(node, bias), node)
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
    linears = [m for m in layers if isinstance(m, nn.Linear)]
    if not linears:
        raise OnnxChainError("the graph has no linear layer")
    for a, b in zip(linears, linears[1:]):
        if b.in_features != a.out_features:
            raise OnnxChainError(f"a layer of {a.out_features} outputs feeds one of {b.in_features} inputs")
    dims = [d.dim_value if d.HasField("dim_value") else None for d in inputs[0].type.tensor_type.shape.dim]
    flat = isinstance(layers[0], nn.Flatten)
    if len(dims) < 2 or (not flat and len(dims) != 2) or None in dims[1:] or \
            int(np.prod(dims[1:])) != linears[0].in_features:
        raise OnnxChainError(f"the input's shape {['?' if d is None else d for d in dims]} does not give one row of "
                             f"{linears[0].in_features} values a sample (a batch dimension, then fixed sizes)")
    return nn.Sequential(*layers).eval()


def _load(onnx, path: Path):
    """The ONNX model at ``path``, its external data read only from regular files inside its own folder."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # noqa: BLE001 - a file onnx cannot read: one line, whatever the cause
        first = str(e).splitlines()[0] if str(e) else ""
        raise OnnxChainError(f"cannot read {path} as ONNX ({type(e).__name__}: {first})") from None
    folder = path.resolve().parent
    external = [t for t in onnx.external_data_helper._get_all_tensors(model)
                if t.data_location == onnx.TensorProto.EXTERNAL]
    for t in external:
        location = {e.key: e.value for e in t.external_data}.get("location", "")
        target = folder / location
        if Path(location).is_absolute() or not target.resolve().is_relative_to(folder) or target.is_symlink() \
                or not target.is_file():
            raise OnnxChainError(f"tensor {t.name!r} keeps its data in {location!r}, which is not a regular file "
                                 f"inside {folder}: refused")
    if external:
        try:
            onnx.load_external_data_for_model(model, str(folder))
        except Exception as e:  # noqa: BLE001
            raise OnnxChainError(f"cannot read the external data of {path} ({type(e).__name__}: {e})") from None
    return model


def _dtype(onnx, elem: int) -> str:
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(elem).name
    except Exception:  # noqa: BLE001 - an undefined or non-numeric element type
        return f"element type {elem}"


def _linear(w: np.ndarray, b: np.ndarray | None, node) -> nn.Linear:
    if w.ndim != 2:
        raise OnnxChainError(f"{node.op_type} {node.name}: a weight of shape {w.shape} is not a matrix")
    if b is not None and b.size not in (1, w.shape[0]) or b is not None and b.ndim > 2:
        raise OnnxChainError(f"{node.op_type} {node.name} adds a bias of shape {b.shape} to {w.shape[0]} outputs")
    if b is not None and b.size == 1:
        b = np.full(w.shape[0], b.reshape(-1)[0], dtype=np.float32)  # broadcast, as ONNX does
    layer = nn.Linear(w.shape[1], w.shape[0], bias=True)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(np.ascontiguousarray(w)))
        if b is None:
            layer.bias.zero_()
        else:
            layer.bias.copy_(torch.from_numpy(b.reshape(-1).copy()))
    layer.requires_grad_(False)
    return layer
