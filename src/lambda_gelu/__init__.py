"""λ-GELU: learnable gating hardness, from smooth GELU training to exact-ReLU deployment.

    f(x; λ) = x · Φ(λx),   λ = 1: GELU,   λ → ∞: ReLU      (λ-SiLU: x · σ(λx), the same for SiLU gates)

The packages, by concern: ``core`` (the op and its training: ``LambdaGELUConfig``, ``LambdaGELU``,
``HardeningSchedule``, parameter groups, the sparsity penalty, model surgery; its names are re-exported here),
``reluize`` (a pretrained GELU or SiLU network → exact ReLU, distilling from its frozen original), and, imported on
demand: ``inference`` (``sparsify_`` and the sparse layers, gated FFNs and experts it swaps in, the screened argmax,
``LeanDecoder``), ``verify`` (CROWN and exact MILP verification of ReLU networks, VNN-LIB, ONNX chains),
``deploy`` (ONNX export and int8 with ONNX Runtime, a converted checkpoint measured there, GGUF for llama.cpp),
``hf`` (Hugging Face checkpoints → ReLU checkpoints; the ``[hf]`` extra), ``families`` (what the library knows of
each model family), ``integrations`` (hardening callbacks for transformers' Trainer and Lightning), and ``cli``
(the ``lambda-gelu`` command). ``_native`` holds the C kernels, built on first use.
"""
from . import _moved
from .core.config import DEFAULTS, LambdaGELUConfig
from .core.convert import (GELU_LIKE, SILU_LIKE, convert_to_lambda_gelu_, convert_to_lambda_silu_, is_gelu_like,
                      is_reluizable, is_silu_like, lambda_modules, relu_config_problem, replace_modules_, to_relu_)
from .core.distributed import replicate_lambdas
from .core.functional import backend, get_backend, l1_gap, lambda_gelu, lambda_gelu_reference, lambda_target, set_backend
from .core.module import LambdaGELU, LambdaSiLU, lambda_to_raw, raw_to_lambda
from .core.optim import lambda_param_groups
from .core.registry import create_act, get_act_layer
from .core.regularize import SparsityRegularizer, sparsity_factor
from .core.schedule import AutoSwitch, HardeningSchedule
from .core.silu import lambda_silu, lambda_silu_reference, silu_l1_gap, silu_lambda_target
from .reluize import ReluizeConfig, ReluizeResult, reluize

__version__ = "0.1.0"

_moved.install()  # the old module names, for one release

__all__ = [
    "LambdaGELUConfig", "DEFAULTS",
    "lambda_gelu", "lambda_gelu_reference", "l1_gap", "lambda_target", "backend", "set_backend", "get_backend",
    "LambdaGELU", "LambdaSiLU", "lambda_to_raw", "raw_to_lambda",
    "lambda_silu", "lambda_silu_reference", "silu_l1_gap", "silu_lambda_target",
    "lambda_param_groups", "HardeningSchedule", "AutoSwitch", "replicate_lambdas",
    "convert_to_lambda_gelu_", "convert_to_lambda_silu_", "to_relu_", "replace_modules_", "lambda_modules",
    "is_gelu_like", "is_silu_like", "is_reluizable", "GELU_LIKE", "SILU_LIKE",
    "relu_config_problem",
    "get_act_layer", "create_act",
    "reluize", "ReluizeConfig", "ReluizeResult",
    "SparsityRegularizer", "sparsity_factor",
]
