"""Deployment of ReLU-ized models: ONNX export with a graph check, int8 quantization with ONNX Runtime
(static and fully integer for MLPs, dynamic for transformers), latency timed side by side, and activation
sparsity. Needs the ``[deploy]`` extra (onnx, onnxruntime); Hugging Face checkpoints: :mod:`lambda_gelu.deploy.checkpoint`.

The point of ReLU-ization shows in the graph: ONNX Runtime's static int8 quantization turns a ReLU
MLP into integer ``QGemm`` nodes with one ``QuantizeLinear`` at the input and one
``DequantizeLinear`` at the output, while every GELU stays a float ``Erf``/``Div``/``Mul`` island
with quantize/dequantize pairs around it. :func:`float_ops` lists such islands.
"""
from __future__ import annotations

import collections
import os
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn

from ..core.convert import eval_mode
from ..inference.sparse import activation_sparsity  # measured beside int8 and verification; lives with the sparse path
from ..timing import time_interleaved  # noqa: F401 - part of this module's API: the latency of the graphs

__all__ = ["export_onnx", "onnx_op_counts", "float_ops", "quantize_int8", "quantize_dynamic_int8", "OnnxRunner",
           "time_interleaved", "export_mismatch", "EXPORT_TOLERANCE", "activation_sparsity", "SMOOTH_OPS"]

# smooth nonlinearities: activations a GELU-to-ReLU conversion should have removed, and the softmax and
# normalisation ops that stay smooth in a ReLU network (attention, LayerNorm); none piecewise linear
SMOOTH_OPS = ("Erf", "Gelu", "Tanh", "Sigmoid", "Exp", "Softplus", "FastGelu", "BiasGelu", "Elu", "Selu", "Celu",
              "Mish", "HardSwish", "Softsign", "Log", "Sqrt", "Reciprocal", "Pow", "Sin", "Cos", "Softmax",
              "LogSoftmax", "LayerNormalization", "SimplifiedLayerNormalization", "GroupNormalization",
              "InstanceNormalization", "LpNormalization")
# ops that only move or relabel data, or are the quantization boundary itself
_NEUTRAL_OPS = {"Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Constant", "Shape",
                "Gather", "Concat", "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}
_PIECEWISE_LINEAR = {"Relu", "Max", "Min", "Clip", "MaxPool", "LeakyRelu", "PRelu"}


def _onnx():
    try:
        import onnx
        return onnx
    except ImportError as e:
        raise ImportError("lambda_gelu.deploy.onnx needs the [deploy] extra: pip install 'lambda-gelu[deploy]'") from e


def onnx_op_counts(model_or_path) -> dict[str, int]:
    """How many nodes of each op type an ONNX model (path or ModelProto) has."""
    onnx = _onnx()
    proto = onnx.load(str(model_or_path)) if isinstance(model_or_path, (str, os.PathLike)) else model_or_path
    return dict(collections.Counter(n.op_type for n in proto.graph.node))


@dataclass
class ExportReport:
    path: str
    op_counts: dict[str, int]
    nonlinear_ops: dict[str, int]   # every op that is not affine or data movement (Relu included)
    smooth_ops: dict[str, int]      # the ones an integer-only / piecewise-linear runtime cannot take


# an export must compute what torch computes: float32 kernels that add in another order differ by ~1e-6 of an
# output's scale, a graph that computes something else (a constant folded from the example, a mode missed) by O(1)
EXPORT_TOLERANCE = 1e-3


def export_mismatch(path: str | os.PathLike, feeds: Mapping[str, np.ndarray], expected: Iterable[np.ndarray],
                    where: Iterable[np.ndarray | None] | None = None) -> float:
    """The largest difference between ONNX Runtime's outputs of ``path`` on ``feeds`` and ``expected`` (torch's),
    relative to each output's largest magnitude; ``where`` masks the entries that count (e.g. real tokens)."""
    got = OnnxRunner(path, threads=1)(feeds)
    expected = list(expected)
    masks = [None] * len(expected) if where is None else list(where)
    worst = 0.0
    for a, b, m in zip(got, expected, masks):
        a, b = (a, b) if m is None else (a[m], b[m])
        worst = max(worst, float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)) if b.size else 0.0)
    return worst


def export_onnx(model: nn.Module, example: torch.Tensor, path: str | os.PathLike, opset: int = 17,
                allow_smooth: bool = False) -> ExportReport:
    """Export ``model`` (in eval mode, batch dimension dynamic) and check it: ONNX Runtime must compute torch's
    output, on a batch of another size and other values than ``example``, within :data:`EXPORT_TOLERANCE` of its
    scale, or ``ValueError`` says by how much.

    Raises ``ValueError`` naming the offending nodes if a smooth nonlinearity (``SMOOTH_OPS``: Erf,
    Gelu, Tanh, ..., Softmax, LayerNormalization) is left — a GELU or an un-converted λ-GELU, or a
    softmax or normalisation that no piecewise-linear runtime takes either — unless ``allow_smooth=True``
    (used to export the GELU baselines for comparison, or a ReLU transformer). Run
    :func:`lambda_gelu.to_relu_` first.
    """
    _onnx()
    with eval_mode(model), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(model, (example,), str(path), input_names=["input"], output_names=["output"],
                          dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}}, opset_version=opset,
                          dynamo=False)
    check = torch.cat([example, 0.5 * example.flip(0) + 0.25])  # another batch size and other values than traced
    with eval_mode(model), torch.no_grad():
        expected = model(check).numpy()
    off = export_mismatch(path, {"input": check.numpy()}, [expected])
    if not off <= EXPORT_TOLERANCE:
        raise ValueError(f"the ONNX export of {type(model).__name__} computes something else than torch: its "
                         f"output is {off:.2g} of the output's scale away (tolerance {EXPORT_TOLERANCE:g}) on inputs "
                         "it was not traced with")
    counts = onnx_op_counts(path)
    nonlinear = {k: v for k, v in counts.items() if k in _PIECEWISE_LINEAR or k in SMOOTH_OPS}
    smooth = {k: v for k, v in counts.items() if k in SMOOTH_OPS}
    if smooth and not allow_smooth:
        raise ValueError(f"the exported graph still has smooth nonlinearities {smooth}: ReLU-ize the model first "
                         "(lambda_gelu.to_relu_(model), or include_gelu=True for plain GELUs); a softmax or a "
                         "normalisation stays smooth in a ReLU network: export it with allow_smooth=True")
    return ExportReport(str(path), counts, nonlinear, smooth)


def float_ops(quantized_model_or_path) -> dict[str, int]:
    """Ops of a quantized ONNX graph that still compute in floating point: anything that is not an
    integer ``Q*``/``QLinear*`` op, a quantize/dequantize boundary, or data movement."""
    counts = onnx_op_counts(quantized_model_or_path)
    return {k: v for k, v in counts.items() if k not in _NEUTRAL_OPS and not k.startswith(("QLinear", "QGemm",
                                                                                             "QAttention", "ConvInteger",
                                                                                             "MatMulInteger"))}


def quantize_int8(fp32_path: str | os.PathLike, int8_path: str | os.PathLike, calibration: Iterable[np.ndarray]) -> dict:
    """Static int8 quantization with ONNX Runtime (QOperator format: uint8 activations, int8 weights,
    calibrated on ``calibration`` batches). Returns the op counts of the result and its float ops."""
    try:
        from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    except ImportError as e:
        raise ImportError("quantize_int8 needs onnxruntime: pip install 'lambda-gelu[deploy]'") from e

    class Reader(CalibrationDataReader):
        def __init__(self):
            self._it = iter(calibration)

        def get_next(self):
            batch = next(self._it, None)
            return None if batch is None else {"input": np.ascontiguousarray(batch, dtype=np.float32)}

    quantize_static(str(fp32_path), str(int8_path), Reader(), quant_format=QuantFormat.QOperator,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return {"op_counts": onnx_op_counts(int8_path), "float_ops": float_ops(int8_path)}


def quantize_dynamic_int8(fp32_path: str | os.PathLike, int8_path: str | os.PathLike) -> dict:
    """Dynamic int8 quantization with ONNX Runtime, as it is done for transformers: int8 weights with a scale
    per output channel for every MatMul/Gemm, activations quantized at run time per tensor. Returns the op
    counts of the result."""
    try:
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as e:
        raise ImportError("quantize_dynamic_int8 needs onnxruntime: pip install 'lambda-gelu[deploy]'") from e
    import logging
    quiet = logging.getLogger().level
    logging.getLogger().setLevel(logging.ERROR)  # its advice to pre-process the graph, printed on every call
    try:
        quantize_dynamic(str(fp32_path), str(int8_path), weight_type=QuantType.QInt8, per_channel=True,
                         op_types_to_quantize=["MatMul", "Gemm"], reduce_range=not _has_vnni())
    finally:
        logging.getLogger().setLevel(quiet)
    return {"op_counts": onnx_op_counts(int8_path)}


def _has_vnni() -> bool:
    """Whether the CPU has VNNI's int8 dot products. Without them ONNX Runtime's u8×s8 kernels (AVX2, AVX-512
    without VNNI) sum pairs of products into 16 bits, which saturate for 8-bit weights: its quantizer's
    ``reduce_range`` (7-bit weights) avoids that, as ONNX Runtime advises for such CPUs."""
    import platform
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return True  # the saturation is x86's: elsewhere ONNX Runtime's default
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return True  # not Linux: ONNX Runtime's default
    return any(flag in flags.split() for flag in ("avx512_vnni", "avx_vnni", "amx_int8"))


class OnnxRunner:
    """A small wrapper of an ONNX Runtime session with a fixed thread count. Its threads do not
    spin-wait between calls, so several sessions timed side by side do not steal each other's cores.

    Called with an array, it feeds the graph's one input (``input``) and returns the first output; called
    with a mapping of input names to arrays, it returns every output."""

    def __init__(self, path: str | os.PathLike, threads: int = 1):
        import onnxruntime as ort
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]

    def __call__(self, x):
        if isinstance(x, Mapping):
            return self.session.run(None, {k: np.ascontiguousarray(v) for k, v in x.items() if k in self.inputs})
        return self.session.run(None, {"input": np.ascontiguousarray(x, dtype=np.float32)})[0]
