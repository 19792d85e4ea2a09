"""Activation sparsity as speed: linear layers that read only the weights of their non-zero inputs.

A ReLU network's hidden activations are mostly exact zeros, and a zero input contributes exactly
nothing to the next layer's sums. :func:`sparsify_` finds the linear layers whose input comes straight
from an ``nn.ReLU`` and replaces each by :class:`SparseLinear`, which, for the batch at hand, lists the
inputs that are non-zero in some row (their union) and reads only those rows of the transposed weight:
at 90% zeros, a tenth of the dense layer's memory traffic, which is what a linear layer at small batch
costs. Outputs equal the dense layer's up to float rounding (the terms are added in another order).
When the union is too dense to pay (``max_density``), the layer runs dense. Inference only.

    model = lambda_gelu.to_relu_(model)           # or a network trained with ReLU
    replaced = lambda_gelu.inference.sparse.sparsify_(model)
    with torch.inference_mode():
        y = model(x)
"""
from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .. import _native
from ..core.convert import _is_conv1d, _plain, replacement_problem
from ..core.zeros import exact_zeros
from ..families import ungated_layouts
from . import int4 as q4
from .experts import SparseExperts, experts_problem, relu_experts
from .gated import SparseGatedMLP, formula_problem, gated_mlps, gated_parts

__all__ = ["SparseLinear", "sparsify_", "sparse_linear_reference", "active_inputs", "activation_sparsity",
           "MAX_DENSITY", "MIN_WEIGHTS"]

MAX_DENSITY = 0.35  # fraction of active inputs above which the layer runs dense; conservative: the 3072-input
# FFN of benchmarks/bench_sparse.py still gains at 0.6, small layers gain less (a fixed cost per call)
GATED_MAX_DENSITY = 0.5  # a gated FFN reads 2 of its 3 matrices only for active units: it gains up to about here
# with more rows than decoding (SparseGatedMLP: decoding never falls back)
MIN_WEIGHTS = 1 << 17  # layers with fewer weights stay dense: the sparse path's fixed cost per call (a C call
# through ctypes and a few µs of Python) outweighs what it saves. benchmarks/bench_sparse.py's layer sizes at batch
# 1 and 90% zeros, two runs on two machines: 384 → 96 ran 0.65× and 1.06× dense, 384 → 384 (147k weights) 1.2×
# and 1.3×, 512 → 512 1.6× in both


def active_inputs(x: Tensor) -> Tensor:
    """The indices of the inputs (last dimension) that are non-zero in some row of ``x``: the batch's union."""
    return (x.reshape(-1, x.shape[-1]) != 0).any(0).nonzero().squeeze(1)


def sparse_linear_reference(x: Tensor, weight_t: Tensor, bias: Tensor | None, active: Tensor | None = None) -> Tensor:
    """y = x · Wt + b from the active rows of Wt only, in plain torch (the C kernel's reference);
    ``active`` as :func:`active_inputs` gives it, if already known."""
    x2 = x.reshape(-1, x.shape[-1])
    active = active_inputs(x) if active is None else active
    y = x2[:, active] @ weight_t[active]
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], weight_t.shape[1])


class SparseLinear(nn.Module):
    """A linear layer for inputs that are mostly exact zeros (ReLU outputs); inference only.

    Keeps the original ``weight`` (and ``bias``) as they were, so ``state_dict()`` is the dense layer's,
    plus the transposed weight as a non-persistent buffer (one more copy of the weight; for GPT-2's
    ``Conv1D``, which stores it transposed already, none), made again by ``load_state_dict``; write new
    weights through ``load_state_dict``, not in place. Build it with :meth:`from_dense`.
    """

    def __init__(self, weight: Tensor, bias: Tensor | None, weight_t: Tensor, max_density: float = MAX_DENSITY,
                 layout: str = "linear"):
        super().__init__()
        if not 0.0 <= max_density <= 1.0:
            raise ValueError(f"max_density is a fraction of the inputs in [0, 1], got {max_density!r}")
        self.weight = weight if isinstance(weight, nn.Parameter) else nn.Parameter(weight, requires_grad=False)
        self.bias = bias if bias is None or isinstance(bias, nn.Parameter) else nn.Parameter(bias, requires_grad=False)
        self.register_buffer("weight_t", weight_t, persistent=False)
        self.in_features, self.out_features = weight_t.shape
        self.max_density = float(max_density)
        self.layout = layout  # how `weight` is stored: "linear" (out, in) or "conv1d" (in, out)

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        with torch.no_grad():  # loading writes into `weight`: the kernel's transposed copy must follow
            w = self.weight.detach()
            self.weight_t = (w.t() if self.layout == "linear" else w).contiguous()

    @classmethod
    def from_dense(cls, layer: nn.Module, max_density: float = MAX_DENSITY) -> "SparseLinear":
        """From an ``nn.Linear`` (weight (out, in)) or a Hugging Face ``Conv1D`` (weight (in, out))."""
        if isinstance(layer, nn.Linear):
            return cls(layer.weight, layer.bias, layer.weight.detach().t().contiguous(), max_density)
        if _is_conv1d(layer):
            return cls(layer.weight, layer.bias, layer.weight.detach().contiguous(), max_density, "conv1d")
        raise TypeError(f"SparseLinear.from_dense takes nn.Linear or transformers' Conv1D, got {type(layer).__name__}")

    def forward(self, x: Tensor) -> Tensor:
        if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
            raise RuntimeError("SparseLinear is for inference and has no backward: run the model under "
                               "torch.inference_mode() or torch.no_grad() (or restore the dense layers to train)")
        if x.shape[-1] != self.in_features:
            raise ValueError(f"SparseLinear({self.in_features} → {self.out_features}) got an input of shape "
                             f"{tuple(x.shape)}: its last dimension must be {self.in_features}")
        # At batch 1 every line here costs a microsecond or more against a product of tens: the tensors are
        # read from the module's own dicts (nn.Module.__getattr__ takes 2 µs each), and the union, the
        # density check, the threads and the buffers are left to the one C call
        wt, bias = self._buffers["weight_t"], self._parameters.get("bias")  # no bias: not in the dict
        max_active = int(self.max_density * self.in_features)
        kernels = _native.library() if x.dtype is wt.dtype is torch.float32 and x.is_cpu and wt.is_cpu else None
        if kernels is None:
            active = active_inputs(x)
            if active.numel() > max_active:
                return self._dense(x)
            return sparse_linear_reference(x, wt, bias, active)
        x = x.contiguous()
        y = torch.empty(*x.shape[:-1], self.out_features, dtype=torch.float32)
        if bias is not None and not bias.is_contiguous():
            bias = bias.contiguous()
        n_active = kernels.sparse_linear_f32(x.data_ptr(), wt.data_ptr(), _native.pointer(bias),
                                             y.data_ptr(), x.numel() // self.in_features, self.in_features,
                                             self.out_features, max_active, torch.get_num_threads(), _native.GRAIN)
        if n_active < 0:
            raise MemoryError("SparseLinear: the kernel could not allocate its buffers")
        return self._dense(x) if n_active > max_active else y

    def _dense(self, x: Tensor) -> Tensor:
        if self.layout == "conv1d":
            return F.linear(x, self.weight_t.t(), self.bias)  # a view: no copy
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"max_density={self.max_density:g}")


def _eligible(model: nn.Module):
    """(qualified name, parent, attribute) of every linear layer fed directly by an nn.ReLU."""
    for name, parent in model.named_modules():
        prefix = f"{name}." if name else ""
        if isinstance(parent, nn.Sequential):  # ... → ReLU → Linear → ...
            children = list(parent.named_children())
            for (_, a), (attr, b) in zip(children, children[1:]):
                if type(a) is nn.ReLU and isinstance(b, nn.Linear):
                    yield prefix + attr, parent, attr
        for up, act, down in ((f.first, f.act, f.second) for f in ungated_layouts()):  # down(act(up(x))): the
            # second reads the activation's output and is replaced (a SparseLinear computes any input exactly)
            if (type(getattr(parent, act, None)) is nn.ReLU and _projection(getattr(parent, up, None))
                    and _projection(getattr(parent, down, None))):
                yield prefix + down, parent, down
        # BERT / MPNet / RoBERTa layers: output.dense(intermediate_act_fn(intermediate.dense(x)))
        inter, out = getattr(parent, "intermediate", None), getattr(parent, "output", None)
        if (type(getattr(inter, "intermediate_act_fn", None)) is nn.ReLU
                and isinstance(getattr(out, "dense", None), nn.Linear)):
            yield prefix + "output.dense", out, "dense"


def _projection(layer) -> bool:
    return isinstance(layer, nn.Linear) or _is_conv1d(layer)


def _kept_as_is(layer: nn.Module, by: str = "SparseLinear") -> str | None:
    """Why replacing the linear ``layer`` (or a block holding it) by ``by`` could change a result, or None."""
    if not (_plain(layer, nn.Linear) or _is_conv1d(layer)):
        return f"is a {type(layer).__name__} with a forward of its own (e.g. fake quantization), which {by} " \
               "would not compute"
    return replacement_problem(layer, by, (layer.weight,))


_SPARSE_MODULES = ("SparseLinear", "SparseGatedMLP", "SparseExperts")  # what sparsify_ puts in


def sparsify_(model: nn.Module, max_density: float = MAX_DENSITY, min_weights: int = MIN_WEIGHTS,
              int8: bool = False, int4: bool = False) -> list[str]:
    """Replace, in place, every gated FFN whose gate is an exact ReLU by a
    :class:`~lambda_gelu.inference.gated.SparseGatedMLP` (Llama-, Gemma-family blocks after
    :func:`lambda_gelu.reluize`), every mixture's experts whose gates are exact ReLUs by a
    :class:`~lambda_gelu.inference.experts.SparseExperts` (the experts transformers keeps as two tensors: Mixtral,
    Qwen2/3-MoE, OLMoE, DeepSeek, ...) and every other linear layer whose input comes straight from an ``nn.ReLU`` by
    a :class:`SparseLinear`; returns their qualified names. Recognised: ``nn.Linear`` right after
    ``nn.ReLU`` in an ``nn.Sequential``; the second FFN projection of Hugging Face ungated FFNs as
    the families table names them (:mod:`lambda_gelu.families`) (GPT-2's ``mlp.c_proj``, a ``Conv1D``; GPT-NeoX's,
    StarCoder2's, Phi's, GPT-J's, OPT's and BART's, T5 v1.0's) and of BERT/MPNet/RoBERTa layers (``output.dense``) whose
    activation is ReLU (after :func:`lambda_gelu.reluize`, or ``hidden_act="relu"``); the gated FFNs of
    the families table's gated layouts whose own forward is ``down(relu(gate(x)) * up(x))``.
    Layers whose input is not
    guaranteed to come from a ReLU are left alone, and so is every layer that SparseLinear would not
    reproduce exactly: a subclass with a forward of its own (torch.ao's quantization-aware Linear), a
    parametrized layer, one with forward hooks (which the replacement would drop; pruning's among them),
    or with non-finite weights (a skipped zero input would turn 0·inf = NaN into 0); and layers of fewer
    than ``min_weights`` weights, where the sparse path costs more than it saves (:data:`MIN_WEIGHTS`; 0
    replaces every eligible layer; an expert counts as its up projection). ``int8=True``: the gated FFNs and the
    experts read int8 weights with a scale per row (:class:`~lambda_gelu.inference.gated.SparseGatedMLP`'s ``int8``;
    no longer exact: the weights are rounded). ``int4=True``: the gated FFNs read 4-bit rows instead
    (:mod:`~lambda_gelu.inference.int4`; their widths must be multiples of 32), on grids through 0 where most of their
    blocks sit on a 4-bit grid already (:func:`~lambda_gelu.inference.int4.on_4bit_grids`), else on steps over 7; a
    mixture's experts int8 rows."""
    if isinstance(min_weights, bool) or not isinstance(min_weights, int) or min_weights < 0:
        raise ValueError(f"min_weights is a number of weights ≥ 0, got {min_weights!r}")
    if int8 and int4:
        raise ValueError("sparsify_ takes int8=True or int4=True, not both")
    gated, left = [], []  # gated FFNs to replace; and (name, why not) of those that stay dense
    for name, parent, attr, layout in list(gated_mlps(model)):
        mlp = parent._modules[attr] if parent is not None else None
        problem = "is the model itself" if mlp is None else next(
            (f"({a}) {why}" for a in (layout.gate, layout.up, layout.down)
             if (why := _kept_as_is(getattr(mlp, a), "SparseGatedMLP"))),
            None) or formula_problem(mlp, layout)
        if problem is None and gated_parts(mlp, layout)[1].weight.numel() < min_weights:
            problem = f"is smaller than min_weights={min_weights} weights a projection"
        (gated.append((name, parent, attr, layout)) if problem is None else left.append((name, problem)))
    experts, left_experts = [], []  # a mixture's experts to replace; and those that stay dense
    for name, parent, attr in list(relu_experts(model)):
        module = parent._modules[attr] if parent is not None else None
        problem = "is the model itself" if module is None else experts_problem(module)
        if problem is None and module.down_proj[0].numel() < min_weights:
            problem = f"is smaller than min_weights={min_weights} weights a projection of an expert"
        (experts.append((name, parent, attr)) if problem is None else left_experts.append((name, problem)))
    eligible = list(_eligible(model))
    why = {name: _kept_as_is(getattr(parent, attr)) for name, parent, attr in eligible}
    found = [(name, parent, attr) for name, parent, attr in eligible if why[name] is None]
    large = [(name, parent, attr) for name, parent, attr in found
             if getattr(parent, attr).weight.numel() >= min_weights]
    if not gated and not experts and not large:  # nothing replaced: say why, the model untouched
        if left or left_experts:
            kind = " and ".join(k for k, n in (("gated FFN(s)", left), ("experts module(s)", left_experts)) if n)
            left += left_experts
            raise ValueError(f"sparsify_ found {len(left)} {kind} with a ReLU gate, but can replace none: "
                             f"{left[0][0]!r} {left[0][1]}")
        done = [name for name, m in model.named_modules() if type(m).__name__ in _SPARSE_MODULES]
        if done and not eligible:
            raise ValueError(f"the model is already sparsified: {len(done)} of its modules read only their active "
                             f"inputs (from {done[0] or 'the model itself'!r}); there is nothing left to replace")
        if not eligible:
            raise ValueError("sparsify_ found no linear layer fed directly by an nn.ReLU: it looks for nn.Linear "
                             "right after nn.ReLU in an nn.Sequential, for the second FFN projection of Hugging Face "
                             "GPT-2 / GPT-NeoX / Phi / OPT / T5 / BERT / ... blocks with a ReLU activation, and for "
                             "gated FFNs (Llama, Gemma, T5, Phi-3) and a mixture's experts whose gate is an nn.ReLU "
                             "(convert GELU or SiLU first, e.g. with lambda_gelu.to_relu_ or lambda_gelu.reluize)")
        if not found:
            name = eligible[0][0]
            raise ValueError(f"sparsify_ found {len(eligible)} linear layer(s) fed by an nn.ReLU, but none it can "
                             f"replace without changing what it computes: {name!r} {why[name]}")
        sizes = sorted({getattr(parent, attr).weight.numel() for _, parent, attr in found})
        raise ValueError(f"sparsify_ found {len(found)} linear layer(s) fed by an nn.ReLU, but all are smaller than "
                         f"min_weights={min_weights} weights (largest: {sizes[-1]}), where the sparse path is slower "
                         f"than the dense layer; pass min_weights=0 to replace them anyway")
    # 4-bit rows on grids through 0 if the model's FFN weights sit on 4-bit grids (a conversion of a 4-bit file), else
    # on steps over 7 (int4's docstring)
    weights = [part.weight for _, parent, attr, layout in gated
               for part in gated_parts(parent._modules[attr], layout)] if int4 else []
    symmetric = int4 and q4.on_4bit_grids([w for w in weights if w.shape[-1] % q4.BLOCK == 0]) < q4.FROM_4BIT
    # every block is built before any is put in: one whose widths int4 cannot hold leaves the model as it was
    blocks = [SparseGatedMLP.from_dense(parent._modules[attr], layout, max(max_density, GATED_MAX_DENSITY), int8=int8,
                                        int4=int4, symmetric=symmetric) for _, parent, attr, layout in gated]
    for (_, parent, attr, _), block in zip(gated, blocks):
        parent._modules[attr] = block
    for _, parent, attr in experts:
        parent._modules[attr] = SparseExperts(parent._modules[attr], int8=int8 or int4)
    for _, parent, attr in large:
        setattr(parent, attr, SparseLinear.from_dense(getattr(parent, attr), max_density))
    return [name for name, *_ in gated] + [name for name, _, _ in experts] + [name for name, _, _ in large]


@torch.no_grad()
def activation_sparsity(model: nn.Module, inputs: Iterable[torch.Tensor]) -> dict[str, dict[str, float]]:
    """For every ``nn.ReLU`` in ``model``: the fraction of its outputs that are exactly zero over
    ``inputs`` (``zero_fraction``, of ``outputs`` values seen), and the fraction of its units (last
    dimension) that are never active (``dead_fraction``): :func:`lambda_gelu.core.zeros.exact_zeros`."""
    if not any(isinstance(m, nn.ReLU) for m in model.modules()):
        raise ValueError("activation_sparsity found no nn.ReLU in the model: ReLU-ize it first (lambda_gelu.to_relu_)")
    return exact_zeros(model, inputs)