"""λ-GELU: learnable gating hardness, from smooth GELU training to exact-ReLU deployment.

    f(x; λ) = x · Φ(λx),   λ = 1: GELU,   λ → ∞: ReLU      (λ-SiLU: x · σ(λx), the same for SiLU gates)

The pieces, one per file: ``config`` (``LambdaGELUConfig``, the paper's settings in one place),
``functional`` (the op and its math; ``_compiled`` and ``_native`` its fused kernels), ``silu`` (λ-SiLU),
``module`` (``LambdaGELU``, ``LambdaSiLU``), ``optim`` (parameter groups), ``schedule`` (``HardeningSchedule``),
``convert`` (model surgery), ``batches`` (running a batch of any form through a model), ``registry``
(activations by name), ``reluize`` (a package: a pretrained GELU or SiLU network → exact ReLU, distilling from its
frozen original), ``regularize`` (``SparsityRegularizer``: a progressive L1 penalty on the activations, for more
exact zeros), ``distributed`` (``replicate_lambdas``: λ kept whole on every rank under FSDP).
Imported on demand: ``hf`` (Hugging Face checkpoints → ReLU checkpoints; the ``[hf]`` extra), ``sparse`` and
``sparse_gated`` (linear layers and gated FFNs that read only their active inputs' weights), ``deploy`` (ONNX
export, int8 with ONNX Runtime; the ``[deploy]`` extra), ``verify`` (interval/CROWN bounds and exact MILP
verification of ReLU networks; scipy only), ``vnnlib`` and ``onnx_chain`` (VNN-LIB properties and ONNX networks
for it), ``integrations.transformers`` and ``integrations.lightning`` (hardening callbacks for those trainers).
"""
from .config import DEFAULTS, LambdaGELUConfig
from .convert import (GELU_LIKE, SILU_LIKE, convert_to_lambda_gelu_, convert_to_lambda_silu_, is_gelu_like,
                      is_reluizable, is_silu_like, lambda_modules, relu_config_problem, replace_modules_, to_relu_)
from .distributed import replicate_lambdas
from .functional import backend, get_backend, l1_gap, lambda_gelu, lambda_gelu_reference, lambda_target, set_backend
from .module import LambdaGELU, LambdaSiLU, lambda_to_raw, raw_to_lambda
from .optim import lambda_param_groups
from .registry import create_act, get_act_layer
from .regularize import SparsityRegularizer, sparsity_factor
from .reluize import ReluizeConfig, ReluizeResult, reluize
from .schedule import AutoSwitch, HardeningSchedule
from .silu import lambda_silu, lambda_silu_reference, silu_l1_gap, silu_lambda_target

__version__ = "0.1.0"

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
