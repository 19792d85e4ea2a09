"""Small ONNX ReLU chains built node by node, so a test controls exactly what the verifier reads."""
import numpy as np


def chain_onnx(path, layers, dtype=np.float32, relu_domain="", input_shape=None):
    """Write Gemm → Relu → … → Gemm for ``layers`` [(W (out, in), b)], in ``dtype``, to ``path``."""
    import onnx
    from onnx import helper, numpy_helper
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes, inits, current = [], [], "x"
    for k, (W, b) in enumerate(layers):
        inits += [numpy_helper.from_array(np.asarray(W, dtype), f"W{k}"),
                  numpy_helper.from_array(np.asarray(b, dtype), f"b{k}")]
        nodes.append(helper.make_node("Gemm", [current, f"W{k}", f"b{k}"], [f"z{k}"], transB=1, name=f"gemm{k}"))
        current = f"z{k}"
        if k < len(layers) - 1:
            nodes.append(helper.make_node("Relu", [current], [f"a{k}"], name=f"relu{k}", domain=relu_domain))
            current = f"a{k}"
    n_in, n_out = np.shape(layers[0][0])[1], np.shape(layers[-1][0])[0]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", elem, input_shape or ["N", n_in])],
                              [helper.make_tensor_value_info(current, elem, ["N", n_out])], inits)
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(relu_domain, 1)] if relu_domain else [])
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def run_onnx(path, x: np.ndarray) -> np.ndarray:
    """ONNX Runtime's outputs of ``path`` for the rows of ``x`` (in the graph's own input dtype), as float64."""
    import onnxruntime as ort
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inp = session.get_inputs()[0]
    dtype = np.float16 if "float16" in inp.type else np.float32
    return session.run(None, {inp.name: np.asarray(x).astype(dtype)})[0].astype(np.float64)
