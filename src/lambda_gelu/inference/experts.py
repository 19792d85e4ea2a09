"""Exact sparse experts: a mixture of experts whose gates are exact ReLUs, each routed expert computed from its
active units only.

transformers keeps a mixture's experts (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, DeepSeek-V2/V3, GLM-4-MoE, ...) not as
a layer per expert but as two tensors: ``gate_up_proj`` (E, 2·I, H), each expert's gate rows then its up rows, and
``down_proj`` (E, H, I). A token routed to experts e₁..e_k with weights w₁..w_k gets

    Σ_j w_j · down_e(act(gate_e(x)) ⊙ up_e(x)),    e = e_j.

Once ``act`` is an exact ReLU, each expert is a gated FFN like any other (:mod:`lambda_gelu.inference.gated`), and
:class:`SparseExperts` computes each one from its active units. The tokens routed to an expert, when they are at
most :data:`~lambda_gelu.inference.gated.FUSED_ROWS` (decoding, and most experts of a short prompt), go through the
gated block's screened C call over that expert's rows: the float32 gate rows only of the units the int8 screen cannot
rule out, the rows of ``up`` and ``downᵀ`` only of units active in some of those tokens. More tokens take the
expert's dense products. Its sums are the dense ones less exact zeros, in another order: equal up to float rounding.
The routing (the router, its top-k, its weights) stays the model's own: only the experts module is replaced, and
only where its own forward gives the formula above on a probe input. ``int8=True``: each expert's three matrices as
int8 rows with a scale each, one C call an expert, as :class:`~lambda_gelu.inference.gated.SparseGatedMLP`'s. Inference
only.

    lambda_gelu.reluize(model, batches, steps)        # the experts' SiLU → exact ReLU
    lambda_gelu.inference.sparse.sparsify_(model)               # also replaces the experts
"""
from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .. import _native
from ..core.convert import replacement_problem
from ..families import expert_parameters
from .derived import Made
from .gated import (F32_BUFFERS, FUSED_ROWS, INT8_BUFFERS, screen_rows, sparse_gated_int8_reference, unit_rows,
                    unit_stride)
from .int8 import quantize_rows

__all__ = ["SparseExperts", "sparse_experts_reference", "relu_experts", "experts_problem"]

# how transformers' experts decorator (use_experts_implementation) says the layout differs from (E, 2I, H), (E, H, I)
# with no bias: where an attribute exists, the value each must have
_UNBIASED = SimpleNamespace(bias=None)  # an expert's projection as the gated block's int8 reference reads one
_LAYOUT = {"is_transposed": False, "is_concatenated": True, "has_gate": True, "has_bias": False,
           "has_post_expert_norm": False}


def _routed(top_k_index: Tensor, experts: int):
    """(expert, its tokens, their slots in ``top_k_index``) for each expert some token is routed to, in the experts'
    order; an index outside 0..experts−1 (transformers' mark of a slot routed nowhere) is skipped."""
    k, flat = top_k_index.shape[-1], top_k_index.reshape(-1)
    valid = ((flat >= 0) & (flat < experts)).nonzero().squeeze(1)
    order = valid[torch.argsort(flat[valid], stable=True)]
    start = 0
    for e, n in enumerate(torch.bincount(flat[order], minlength=experts).tolist()):
        if n:
            pick = order[start:start + n]
            yield e, pick // k, pick % k
            start += n


def _expert_weights(gate_up: Tensor, down: Tensor, e: int) -> tuple[Tensor, Tensor, Tensor]:
    units = down.shape[2]
    return gate_up[e, :units], gate_up[e, units:], down[e]


def sparse_experts_reference(x: Tensor, gate_up: Tensor, down: Tensor, top_k_index: Tensor,
                             top_k_weights: Tensor) -> Tensor:
    """The experts' output in plain torch (the C path's reference): for each expert, over the tokens routed to it,
    ``relu(x·gateᵀ)`` and then ``up`` and ``down`` only over the units active in some of those tokens, weighted and
    added as transformers' experts add them. x (T, H); gate_up (E, 2I, H); down (E, H, I); top_k_index and
    top_k_weights (T, k)."""
    out = torch.zeros_like(x)
    for e, tokens, slots in _routed(top_k_index, gate_up.shape[0]):
        gate, up, dn = _expert_weights(gate_up, down, e)
        xs = x[tokens]
        g = F.relu(xs @ gate.t())
        active = (g != 0).any(0).nonzero().squeeze(1)
        y = (g[:, active] * (xs @ up[active].t())) @ dn[:, active].t()
        out.index_add_(0, tokens, (y * top_k_weights[tokens, slots, None]).to(out.dtype))
    return out


def _int8_reference(x: Tensor, b: dict[str, Tensor], units: int, top_k_index: Tensor,
                    top_k_weights: Tensor) -> Tensor:
    """The int8 experts in plain torch: each expert the gated block's int8 reference
    (:func:`~lambda_gelu.inference.gated.sparse_gated_int8_reference`, x rounded to 16 bits a row as the C kernel reads
    it) over its rows of the int8 rows and scales in ``b`` (``gate_q``, ``gate_s``, ... ``down_q`` the rows of each
    ``downᵀ``; ``units`` rows an expert, and of ``down_s`` its ``hidden`` outputs' scales), weighted and added as
    :func:`sparse_experts_reference` adds them."""
    out = torch.zeros_like(x)
    hidden = b["down_q"].shape[1]
    for e, tokens, slots in _routed(top_k_index, b["gate_s"].numel() // units):
        rows = {name: b[name][e * units:(e + 1) * units] for name in INT8_BUFFERS if name != "down_s"}
        rows["down_s"] = b["down_s"][e * hidden:(e + 1) * hidden]
        y = sparse_gated_int8_reference(x[tokens], rows, _UNBIASED, _UNBIASED, _UNBIASED)
        out.index_add_(0, tokens, (y * top_k_weights[tokens, slots, None]).to(out.dtype))
    return out


class SparseExperts(nn.Module):
    """A mixture's experts whose gates are exact ReLUs, each routed expert computed from its active units (see the
    module's docstring); inference only.

    Holds the experts' own ``gate_up_proj`` and ``down_proj`` parameters (so ``state_dict()`` is theirs) and, as
    non-persistent buffers made again by ``load_state_dict`` and at the next call once a weight changed
    (:class:`~lambda_gelu.inference.derived.Made`), each expert's gate, up and ``downᵀ`` rows as one block of unit rows
    (one more copy of the experts' weights) and the gates' int8 screen (a quarter more of the gates' bytes), or with
    ``int8=True`` the three matrices' int8 rows and scales. Build it from the experts module:
    ``SparseExperts(model.model.layers[0].mlp.experts)``."""

    def __init__(self, experts: nn.Module, int8: bool = False):
        super().__init__()
        self.names = _expert_names(experts)  # the families table's names for gate-and-up and down
        if self.names is None:
            raise ValueError(f"{type(experts).__name__} holds none of the families table's expert parameters")
        for name in self.names:  # the same parameters, under their own names (so state_dict() is theirs)
            setattr(self, name, getattr(experts, name))
        self.act_fn = experts.act_fn
        self.num_experts, self.hidden_dim, self.intermediate_dim = self.down.shape
        self.int8 = bool(int8)
        self._derive()
        self.register_load_state_dict_post_hook(_derive_again)  # once the parameters hold the loaded weights

    @property
    def gate_up(self) -> nn.Parameter:
        return getattr(self, self.names[0])

    @property
    def down(self) -> nn.Parameter:
        return getattr(self, self.names[1])

    def _sources(self) -> list[Tensor]:
        return [self.gate_up, self.down]

    @torch.no_grad()
    def _derive(self) -> None:
        """The float32 unit rows (gate, up and downᵀ: :func:`~lambda_gelu.inference.gated.unit_rows`) and the gates'
        screen, or the int8 rows and scales, every expert's stacked (E·I rows)."""
        e, h, units = self.down.shape
        gate_up = self.gate_up.detach()
        self._made, self._addresses = Made(self._sources()), None
        if not self.int8:
            rows = unit_rows(gate_up[:, :units].reshape(e * units, h), gate_up[:, units:].reshape(e * units, h),
                             self.down.detach().transpose(1, 2).reshape(e * units, h))
            for name, t in zip(F32_BUFFERS, rows):
                self.register_buffer(name, t, persistent=False)
            screens = [screen_rows(gate_up[i, :units]) for i in range(e)]  # an expert at a time: float64 copies
            for name, parts in zip(("gate_q", "gate_s", "gate_r", "gate_n"), zip(*screens)):
                self.register_buffer(name, torch.cat(parts).contiguous(), persistent=False)
            return
        (gate_q, gate_s), (up_q, up_s) = (quantize_rows(w.reshape(e * units, h))
                                           for w in (gate_up[:, :units], gate_up[:, units:]))
        down_q, down_s = quantize_rows(self.down.detach().reshape(e * h, units))  # an expert's outputs: a scale each
        up_q, down_q = unit_rows(up_q, down_q.reshape(e, h, units).transpose(1, 2).reshape(e * units, h))
        for name, t in zip(INT8_BUFFERS, (gate_q, gate_s, up_q, up_s, down_q, down_s)):
            self.register_buffer(name, t, persistent=False)

    def __getstate__(self) -> dict:
        """A copy or a pickle holds its own tensors at other addresses: it makes its copies again at its first call."""
        return {**self.__dict__, "_made": None, "_addresses": None}

    def _kernels(self, x: Tensor):
        """The C kernels where they can read x and the weights (and their int8 rows) as they are, else None."""
        if not (x.dtype is torch.float32 and x.is_cpu and all(t.dtype is torch.float32 for t in self._sources())) or (
                unit_stride(*(self._buffers[n] for n in (("up_q", "down_q") if self.int8 else F32_BUFFERS))) is None):
            return None
        return _native.library()

    def _expert_call(self, e: int) -> tuple:
        """Expert ``e``'s addresses for the C call: into the parameters and the buffers, its rows alone."""
        if self._addresses is None:
            b = self._buffers
            names = INT8_BUFFERS if self.int8 else ("gate_q", "gate_s", "gate_r", "gate_n", *F32_BUFFERS)
            self._addresses = {n: (b[n].data_ptr(), b[n].element_size() * b[n].stride(0))
                               for n in names}  # a row's bytes apart, for each
        bufs = self._addresses
        units, h = self.intermediate_dim, self.hidden_dim
        rows = e * units  # the expert's first row in the stacked buffers

        def at(name):
            address, row = bufs[name]
            return address + (e * h * row if name == "down_s" else rows * row)  # down_s: an output's scale each
        if self.int8:
            return tuple(at(n) for n in INT8_BUFFERS)
        return tuple(at(n) for n in ("gate_rows", "gate_q", "gate_s", "gate_r", "gate_n", "up_rows", "down_t"))

    def _expert(self, kernels, e: int, xs: Tensor) -> Tensor:
        """Expert ``e`` on its tokens' rows ``xs`` (n, H), by the C call over its rows."""
        n, h, units = len(xs), self.hidden_dim, self.intermediate_dim
        y = torch.empty(n, h, dtype=torch.float32)
        threads = (torch.get_num_threads(), _native.GRAIN)
        if self.int8:
            gq, gs, uq, us, dq, ds = self._expert_call(e)
            g = torch.empty(n, units, dtype=torch.float32)
            done = kernels.sparse_gated_i8(xs.data_ptr(), gq, gs, None, uq, us, None, dq, ds, None, g.data_ptr(),
                                           y.data_ptr(), n, h, units, h, self.up_q.stride(0), 0, *threads)
        else:
            gate, gq, gs, gr, gn, up, down_t = self._expert_call(e)
            done = kernels.sparse_gated_screened_f32(xs.data_ptr(), gate, None, gq, gs, gr, gn, up, None, down_t, None,
                                                     None, y.data_ptr(), n, h, units, h, self.down_t.stride(0),
                                                     *threads)
        if done < 0:
            raise MemoryError("SparseExperts: the kernel could not allocate its buffers")
        return y

    def forward(self, hidden_states: Tensor, top_k_index: Tensor, top_k_weights: Tensor) -> Tensor:
        if torch.is_grad_enabled() and (hidden_states.requires_grad or self.gate_up.requires_grad):
            raise RuntimeError("SparseExperts is for inference and has no backward: run the model under "
                               "torch.inference_mode() or torch.no_grad() (or restore the dense experts to train)")
        if self._made is None or self._made.stale(self._sources()):
            self._derive()
        x = hidden_states.reshape(-1, self.hidden_dim)
        index, weights = top_k_index.reshape(len(x), -1), top_k_weights.reshape(len(x), -1)
        kernels = self._kernels(x)
        if kernels is None:
            out = (_int8_reference(x, self._buffers, self.intermediate_dim, index, weights) if self.int8
                   else sparse_experts_reference(x, self.gate_up, self.down, index, weights))
            return out.reshape(hidden_states.shape)
        x, out = x.contiguous(), torch.zeros_like(x)
        for e, tokens, slots in _routed(index, self.num_experts):
            xs = x[tokens]
            if len(tokens) <= FUSED_ROWS or self.int8:
                y = self._expert(kernels, e, xs)
            else:  # a prompt's many tokens on one expert: its union of active units too large to pay
                gate, up, down = _expert_weights(self.gate_up, self.down, e)
                y = F.linear(F.relu(F.linear(xs, gate)) * F.linear(xs, up), down)
            out.index_add_(0, tokens, (y * weights[tokens, slots, None]).to(out.dtype))
        return out.reshape(hidden_states.shape)

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, hidden_dim={self.hidden_dim}, "
                f"intermediate_dim={self.intermediate_dim}" + (", int8=True" if self.int8 else ""))


def _derive_again(module: SparseExperts, incompatible_keys) -> None:
    module._derive()


def _expert_names(m: nn.Module) -> tuple[str, str] | None:
    """The families table's (gate-and-up, down) parameter names that are exactly ``m``'s parameters, or None."""
    return next((names for names in expert_parameters() if set(m._parameters) == set(names)), None)


def relu_experts(model: nn.Module):
    """(qualified name, parent, attribute) of every experts module in ``model`` kept as transformers keeps them —
    ``gate_up_proj`` (E, 2I, H) and ``down_proj`` (E, H, I), no other parameter, gate and up concatenated, no bias
    — whose ``act_fn`` is an exact ``nn.ReLU``."""
    for name, m in model.named_modules():
        names = _expert_names(m)
        if names is None or type(getattr(m, "act_fn", None)) is not nn.ReLU:
            continue
        gate_up, down = (m._parameters[n] for n in names)
        if (gate_up.dim() == 3 and down.dim() == 3 and gate_up.shape[0] == down.shape[0]
                and gate_up.shape[1:] == (2 * down.shape[2], down.shape[1])
                and all(getattr(m, flag, value) == value for flag, value in _LAYOUT.items())):
            parent_name, _, attr = name.rpartition(".")
            yield name, model.get_submodule(parent_name) if name else None, attr


@torch.no_grad()
def experts_problem(experts: nn.Module) -> str | None:
    """Why replacing ``experts`` by :class:`SparseExperts` could change a result (its own forward is not the formula
    on a probe input, or :func:`lambda_gelu.core.convert.replacement_problem`), or None if nothing would."""
    gate_up, down = (getattr(experts, n) for n in _expert_names(experts))
    if problem := replacement_problem(experts, "SparseExperts", (gate_up, down)):
        return problem
    e, h, _ = down.shape
    generator = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(3, h, generator=generator).to(gate_up)
    k = min(2, e)
    index = torch.stack([torch.randperm(e, generator=generator)[:k] for _ in range(3)]).to(gate_up.device)
    weights = torch.rand(3, k, generator=generator).to(gate_up)
    try:
        theirs = experts(x, index, weights)
    except Exception as err:  # noqa: BLE001 - a forward of another signature is not the formula
        return f"its forward does not take (hidden_states, top_k_index, top_k_weights) ({type(err).__name__})"
    ours = sparse_experts_reference(x, gate_up, down, index, weights)
    if not isinstance(theirs, Tensor) or theirs.shape != ours.shape or not torch.allclose(theirs, ours, rtol=1e-4,
                                                                                           atol=1e-5):
        return ("computes something else than Σ w·down_e(relu(gate_e(x)) ⊙ up_e(x)) over the routed experts "
                "(checked on a probe input)")
    return None
