"""What a ReLU model buys where it ships: ``onnx`` (ONNX export with a graph check, int8 with ONNX Runtime; the
``[deploy]`` extra), ``checkpoint`` (``lambda-gelu deploy DIR``: a converted checkpoint and its original measured
in ONNX Runtime), ``decoding`` (a converted causal LM's decoding speed in torch) and ``gguf`` (``lambda-gelu
export``: a converted Llama as a GGUF file that llama.cpp computes as the ReLU model). Nothing here is imported
until used.
"""


def __getattr__(name: str):  # what ``lambda_gelu.deploy`` held when it was one module (``onnx`` now), for one release
    import importlib
    onnx = importlib.import_module(f"{__name__}.onnx")
    if name in onnx.__all__:
        import warnings
        warnings.warn(f"lambda_gelu.deploy.{name} is now lambda_gelu.deploy.onnx.{name}", DeprecationWarning, stacklevel=2)
        return getattr(onnx, name)
    raise AttributeError(f"module 'lambda_gelu.deploy' has no attribute {name!r}")
