"""The modules that moved when the library was grouped by concern, importable by their old names for one release:
``import lambda_gelu.sparse`` gives a module that forwards every name to ``lambda_gelu.inference.sparse``, with a
``DeprecationWarning`` that names the new home."""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

MOVED = {  # old name → where it lives now
    "lambda_gelu.functional": "lambda_gelu.core.functional",
    "lambda_gelu.module": "lambda_gelu.core.module",
    "lambda_gelu.silu": "lambda_gelu.core.silu",
    "lambda_gelu.config": "lambda_gelu.core.config",
    "lambda_gelu.schedule": "lambda_gelu.core.schedule",
    "lambda_gelu.optim": "lambda_gelu.core.optim",
    "lambda_gelu.regularize": "lambda_gelu.core.regularize",
    "lambda_gelu.distributed": "lambda_gelu.core.distributed",
    "lambda_gelu.registry": "lambda_gelu.core.registry",
    "lambda_gelu.convert": "lambda_gelu.core.convert",
    "lambda_gelu.keep": "lambda_gelu.core.keep",
    "lambda_gelu.batches": "lambda_gelu.core.batches",
    "lambda_gelu._compiled": "lambda_gelu.core._compiled",
    "lambda_gelu.sparse": "lambda_gelu.inference.sparse",
    "lambda_gelu.sparse_gated": "lambda_gelu.inference.gated",
    "lambda_gelu.sparse_experts": "lambda_gelu.inference.experts",
    "lambda_gelu.screened_argmax": "lambda_gelu.inference.screened_argmax",
    "lambda_gelu.derived": "lambda_gelu.inference.derived",
    "lambda_gelu.hf.decode": "lambda_gelu.inference.decoder",
    "lambda_gelu.hf.layout": "lambda_gelu.inference.layout",
    "lambda_gelu.polytopes": "lambda_gelu.verify.polytopes",
    "lambda_gelu.vnnlib": "lambda_gelu.verify.vnnlib",
    "lambda_gelu.onnx_chain": "lambda_gelu.verify.onnx_chain",
    "lambda_gelu.hf.deploy": "lambda_gelu.deploy.checkpoint",
    "lambda_gelu.hf.decoding": "lambda_gelu.deploy.decoding",
    "lambda_gelu.hf.gguf_export": "lambda_gelu.deploy.gguf",
    "lambda_gelu.hf.errors": "lambda_gelu.errors",
}


class _OldNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def create_module(self, spec):
        return None  # a plain module, filled by exec_module

    def exec_module(self, module: types.ModuleType) -> None:
        new = MOVED[module.__name__]
        warnings.warn(f"{module.__name__} is now {new}; the old name goes in the next release", DeprecationWarning,
                      stacklevel=2)
        target = importlib.import_module(new)
        module.__getattr__ = lambda name: getattr(target, name)
        module.__dir__ = lambda: dir(target)
        module.__doc__ = target.__doc__


def install() -> None:
    if not any(isinstance(f, _OldNames) for f in sys.meta_path):
        sys.meta_path.append(_OldNames())
