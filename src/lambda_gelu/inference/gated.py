"""Exact sparse gated FFNs for decoding: once the gate is an exact ReLU, an inactive unit skips its row of ``up``
and its column of ``down`` — two thirds of the FFN's weights — with no predictor and no approximation.

A gated FFN (Llama, Mistral, Qwen, SmolLM: SwiGLU; Gemma: GeGLU) computes ``down(act(gate(x)) * up(x))``. With
``act`` an exact ReLU, :class:`SparseGatedMLP` computes ``g = relu(gate(x))`` densely, lists the units active in
some row of the batch (their union), and reads only those rows of ``up`` and of ``downᵀ``:

    u = x · up[active]ᵀ,    h = g[:, active] ⊙ u,    y = h · downᵀ[active]

equal to the dense block up to float rounding (the sums are the dense ones less terms that are exactly zero,
added in another order). Where the union of a larger batch is too dense to pay (``max_density``) the block runs
dense. When decoding (at most :data:`FUSED_ROWS` rows) the same C call computes the gate too, screened, and never
falls back (its loop over every unit costs what the dense block does): each unit's gate is first bounded from int8
copies of the gate's rows (:func:`screen_rows`, a quarter of their bytes) times x rounded to int16, summed exactly
in integers, and a unit whose bound is ≤ 0 in every row is an exact zero whose float32 row is never read; the
others are computed from their float32 rows. A short prompt's rows (at most :data:`PROMPT_ROWS`) take the same C
call without the screen, each unit's up product computed only for the rows it is active in.
Decoding at batch 1 reads every weight it needs once, so the bytes read are its time. Inference only. Which
attributes make a gated FFN is data, the families table's (:mod:`lambda_gelu.families`); a module of such a layout is
replaced only if its own forward gives what the formula gives on a probe input.

With ``int8=True`` the three matrices are held as int8 rows with a float32 scale each
(:mod:`~lambda_gelu.inference.int8`: ``w ≈ s·q``) and one C call computes the block, gate included: a quarter of the
bytes read, which is what bounds decoding at batch 1. It takes each row of x rounded to 16 bits (``int16_rows``), for
exact integer sums, the hidden units stay float32. That block equals :func:`sparse_gated_int8_reference` (the rows
dequantized, in plain torch) up to float rounding, and differs from the float32 block by the weights' rounding and, far
less, x's.
``int4=True`` holds the three matrices as 4-bit rows instead (:mod:`~lambda_gelu.inference.int4`: blocks of 32
weights, 56% of the int8 bytes), summed the same way; its reference is :func:`sparse_gated_int4_reference`.

    lambda_gelu.reluize(model, batches, steps)        # SwiGLU/GeGLU gates → exact ReLU
    lambda_gelu.inference.sparse.sparsify_(model)               # also replaces the gated FFNs
"""
from __future__ import annotations


import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .. import _native
from .._native import biases_fit, pointer
from ..core.convert import _plain, replacement_problem
from ..families import Gated, gated_layouts
from . import int4 as q4
from .int8 import int16_rows, linear_i8, quantize_rows  # their home is int8; importable here too, as they were
from .derived import Made

__all__ = ["SparseGatedMLP", "GatedLayout", "FUSED_ROWS", "PROMPT_ROWS", "Rows", "gated_parts",
           "sparse_gated_reference", "sparse_gated_int8_reference", "sparse_gated_int4_reference", "quantize_rows",
           "linear_i8", "unit_rows", "unit_stride", "screen_rows", "int16_rows", "screened_in", "gated_mlps"]


GatedLayout = Gated  # where a gated FFN keeps its parts: one of the families table's rows
F32_BUFFERS = ("gate_rows", "up_rows", "down_t")  # a float32 block's unit rows (unit_rows)
INT8_BUFFERS = ("gate_q", "gate_s", "up_q", "up_s", "down_q", "down_s")  # an int8 block's rows and scales
INT4_BUFFERS = ("gate_q", "gate_s", "up_q", "up_s", "down_q", "down_s")  # a 4-bit block's rows (int4.py) and scales
FUSED_ROWS = 8  # rows (tokens) up to which the C call computes the gate too, screened (decoding)
# rows up to which a float32 block's C call computes the gate too, unscreened (a short prompt's: a unit is active in
# some of so many rows, so the screen rules out few), and the up products only of the rows a unit is active in;
# beyond, torch's matrix products. SmolLM2-135M's 30 FFNs over a prompt, AMD EPYC (Zen 3), 2 threads, interleaved:
# 46 ms at 15 rows against 71 for torch's products, 86 against 87 at 30 rows, 125 against 112 at 45.
PROMPT_ROWS = 24


class Rows:
    """Rows ``[start, stop)`` of a linear layer as a linear layer of their own, read through views of its weight and
    bias (never copies, so they follow what the layer holds): a bundled layout's gate or up."""

    def __init__(self, layer: nn.Linear, start: int, stop: int):
        self.layer, self.start, self.stop = layer, start, stop
        self.in_features, self.out_features = layer.in_features, stop - start

    @property
    def weight(self) -> Tensor:
        return self.layer.weight[self.start:self.stop]

    @property
    def bias(self) -> Tensor | None:
        bias = self.layer.bias
        return None if bias is None else bias[self.start:self.stop]

    def __call__(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)


def gated_parts(mlp: nn.Module, layout: GatedLayout) -> tuple[nn.Linear | Rows, nn.Linear | Rows, nn.Linear]:
    """``mlp``'s gate, up and down projections as ``layout`` places them, a bundled layer's halves as :class:`Rows`."""
    gate, up, down = (getattr(mlp, a) for a in (layout.gate, layout.up, layout.down))
    if not layout.bundled:
        return gate, up, down
    half = gate.out_features // 2
    return Rows(gate, 0, half), Rows(gate, half, 2 * half), down


def sparse_gated_reference(x: Tensor, gate: nn.Linear, up: nn.Linear, down: nn.Linear,
                           active: Tensor | None = None) -> Tensor:
    """``down(relu(gate(x)) * up(x))`` from the active units only, in plain torch (the C kernel's reference)."""
    g = F.relu(gate(x)).reshape(-1, gate.out_features)
    x2 = x.reshape(-1, x.shape[-1])
    active = (g != 0).any(0).nonzero().squeeze(1) if active is None else active
    u = x2 @ up.weight[active].t()
    if up.bias is not None:
        u = u + up.bias[active]
    y = (g[:, active] * u) @ down.weight[:, active].t()
    if down.bias is not None:
        y = y + down.bias
    return y.reshape(*x.shape[:-1], down.out_features)


def unit_rows(*rows: Tensor) -> tuple[Tensor, ...]:
    """Matrices of one row a unit (ff, ·) — int8 up and downᵀ; float32 gate, up and downᵀ — as views of one block whose
    row k is unit k's rows one after another: what a unit reads is one run of bytes, where separate matrices put its
    rows far apart. Measured side by side decoding SmolLM2's default conversion (AMD EPYC, 2 threads): a few percent
    more tokens a second in int8, and ×1.06–×1.12 in float32, whose screen leaves gate rows to read scattered too
    (the medians of two runs of interleaved rounds). The C kernels take the block's row stride (:func:`unit_stride`)."""
    block = torch.cat([r.detach() for r in rows], 1)
    ends = torch.tensor([r.shape[1] for r in rows]).cumsum(0).tolist()
    return tuple(block[:, end - r.shape[1]:end] for r, end in zip(rows, ends))


def unit_stride(*rows: Tensor) -> int | None:
    """The elements from one unit's row to the next's, the same in each of ``rows``, as the C kernels read them (None
    where they differ or a row is not contiguous: say, copies no longer side by side)."""
    if len({r.stride(0) for r in rows}) != 1 or any(r.stride(1) != 1 for r in rows):
        return None
    return rows[0].stride(0)


def screen_rows(w: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The int8 rows that screen a ReLU gate of weight ``w`` (out, d): :func:`quantize_rows`' ``q`` and ``s``, and
    for each row two radii, float32 and rounded up: ``r`` ≥ ‖w − s·q‖₂ and ``n`` ≥ s·‖q‖₂. The C kernel reads x as
    int16 x̃ with a scale t and sums q·x̃ exactly in integers; by Cauchy–Schwarz on x·(w − s·q) + s·q·(x − t·x̃), the
    gate x·w + b is within r·‖x‖₂ + n·‖x − t·x̃‖₂ of s·t·(q·x̃) + b, to which it adds what double rounds."""
    q, s = quantize_rows(w)
    w64, q64, s64 = w.detach().double(), q.double(), s.double()
    up = 1 + (w.shape[1] + 4) * 2.0 ** -52  # above what double rounds in a sum of d squares and its root

    def rounded_up(t64: Tensor) -> Tensor:
        t32 = t64.float()
        return torch.where(t32.double() < t64, torch.nextafter(t32, torch.tensor(float("inf"))), t32).contiguous()
    # s·q is exact in double (24 + 8 bits), and so is w − s·q
    return q, s, rounded_up((w64 - s64[:, None] * q64).norm(dim=1) * up), rounded_up(s64 * q64.norm(dim=1) * up)


@torch.no_grad()
def screened_in(mlp: "SparseGatedMLP", x: Tensor) -> Tensor:
    """(tokens, units) booleans: the gate units the int8 screen of ``mlp`` leaves to read in float32 for the rows of
    ``x``, decided as the C kernel decides (x rounded to 16 bits, the bound of :func:`screen_rows`), in float64; its
    reference, and what a benchmark counts the rows read with."""
    x = x.reshape(-1, x.shape[-1]).double()
    xq, t = int16_rows(x)
    bias = mlp._parts()[0].bias  # the gate's, wherever the layout keeps it
    a = (xq @ mlp.gate_q.double().t()) * mlp.gate_s.double() * t + (0.0 if bias is None else bias.double())
    margin = mlp.gate_r.double() * x.norm(dim=1, keepdim=True) + mlp.gate_n.double() * (x - t * xq).norm(
        dim=1, keepdim=True)
    return a + margin > 0


def sparse_gated_int8_reference(x: Tensor, quantized: dict[str, Tensor], gate: nn.Linear, up: nn.Linear,
                                down: nn.Linear) -> Tensor:
    """The int8 block in plain torch (the C kernel's reference): ``down(relu(gate(x)) * up(x))`` with each matrix's rows
    dequantized from ``quantized`` (``gate_q, gate_s, up_q, up_s``, and ``down_q`` the rows of ``down``'s transpose with
    ``down_s`` one scale an output), the layers' biases as they are, and x as the kernel reads it, each row rounded to
    16 bits (:func:`int16_rows`; as it is if it holds a NaN or an infinity)."""
    def weight(name):  # in the scales' dtype (float32; float64 for an exact reference)
        scale = quantized[f"{name}_s"]  # one a row; downᵀ's, one a column (an output of down)
        return quantized[f"{name}_q"].to(scale.dtype) * (scale[None, :] if name == "down" else scale[:, None])
    if bool(torch.isfinite(x).all()):
        xq, t = int16_rows(x)
        x = t * xq
    x = x.to(quantized["gate_s"].dtype)
    g = F.relu(F.linear(x, weight("gate"), gate.bias))
    h = g * F.linear(x, weight("up"), up.bias)
    return F.linear(h, weight("down").t(), down.bias)


def sparse_gated_int4_reference(x: Tensor, quantized: dict[str, Tensor], gate: nn.Linear, up: nn.Linear,
                                down: nn.Linear, round_inputs: bool = True) -> Tensor:
    """The 4-bit block in plain torch (the C kernel's reference): ``down(relu(gate(x)) * up(x))`` with each matrix's
    rows dequantized from ``quantized`` (``gate_q, gate_s``, ..., ``down_q`` the 4-bit rows of ``down``'s
    transpose: :func:`~lambda_gelu.inference.int4.dequantize`), in the scales' dtype, the layers' biases as they are,
    and each row of x as the kernel reads it (:func:`~lambda_gelu.inference.int4.int8_rows`; as it is if it holds a
    NaN or an infinity, or with ``round_inputs=False``)."""
    dtype = quantized["gate_s"].dtype

    def weight(name, d):
        return q4.dequantize(quantized[f"{name}_q"], quantized[f"{name}_s"], d, dtype)
    if round_inputs:
        xq, t = q4.int8_rows(x)
        x = torch.where(torch.isfinite(x).all(-1, keepdim=True), t * xq, x.to(t.dtype))
    x = x.to(dtype)
    g = F.relu(F.linear(x, weight("gate", gate.in_features), gate.bias))
    h = g * F.linear(x, weight("up", up.in_features), up.bias)
    return F.linear(h, weight("down", down.out_features).t(), down.bias)


class SparseGatedMLP(nn.Module):
    """A gated FFN whose gate is an exact ReLU, computed from its active units; inference only.

    Holds the original ``gate``, ``up`` and ``down`` layers under their own names (so ``state_dict()`` is the dense
    block's) and, as non-persistent buffers made again by ``load_state_dict`` and at the next call once a weight or bias
    changed (:class:`~lambda_gelu.inference.derived.Made`; a copy or a pickle makes its own), a copy of the three
    matrices as one block of unit rows (``gate_rows``, ``up_rows`` and ``down_t``, downᵀ's rows: :func:`unit_rows`;
    as many bytes again as the layers hold), or with ``int8=True`` the three matrices' int8 rows and scales
    (``gate_q``, ``gate_s``, ...; ``down_q`` holds the rows of ``downᵀ``, beside ``up_q``'s in one block). In float32,
    ``screen=True`` (the default) also holds the gate's screen (:func:`screen_rows`: ``gate_q``, ``gate_s``, ``gate_r``,
    ``gate_n``, a quarter more of the gate's bytes) and decoding reads the float32 gate rows only of the units it does
    not rule out, from the block; ``screen=False`` and a short prompt read every gate row, from the layer's own weight
    (one stream). ``sparse=False`` computes every unit, a baseline for what the skipping buys: the same C loop without
    it (decoding and short prompts, and int8), the dense block elsewhere.
    ``max_density``: the share of active units above which a batch of more than :data:`PROMPT_ROWS` rows runs the
    dense block.
    ``int4=True``: the three matrices as 4-bit rows (:mod:`~lambda_gelu.inference.int4`; ``down_q`` downᵀ's rows, each
    with its own scale), input and output widths multiples of 32, sparse only, on grids through 0 or with
    ``symmetric=True`` on steps over 7 (:func:`~lambda_gelu.inference.int4.quantize`; ``sparsify_`` chooses for the
    model); every batch runs the C loop, row by row. It rounds each row of its input to int8 (a jump in its output
    where an input crosses a rounding boundary); ``round_inputs = False`` sums the inputs as they are, in float (a
    continuous function of them, and slow: a decoder's probe). Build it with :meth:`from_dense`.
    """

    def __init__(self, layout: GatedLayout, gate: nn.Linear, up: nn.Linear, down: nn.Linear,
                 max_density: float = 0.5, int8: bool = False, sparse: bool = True, screen: bool = True,
                 int4: bool = False, symmetric: bool = False):
        super().__init__()
        if not 0.0 <= max_density <= 1.0:
            raise ValueError(f"max_density is a fraction of the units in [0, 1], got {max_density!r}")
        if int4 and (int8 or not sparse):
            raise ValueError("int4 rows are read by the sparse kernels alone: not with int8=True or sparse=False")
        if int4 and not (q4.fits(up.in_features) and q4.fits(down.out_features)):  # rows of gate, up and downᵀ
            raise ValueError(f"int4 rows hold whole blocks of {q4.BLOCK} weights: this FFN's input and output widths "
                             f"{up.in_features} and {down.out_features} are not both multiples")
        self.layout, self.int8, self.sparse, self.screen = layout, bool(int8), bool(sparse), bool(screen)
        self.int4, self.symmetric, self.round_inputs = bool(int4), bool(symmetric), True
        for name, layer in ((layout.gate, gate), (layout.up, up), (layout.down, down)):
            self.add_module(name, layer)
        self.max_density = float(max_density)
        self._derive()
        self.register_load_state_dict_post_hook(_derive_again)  # once the layers hold the loaded weights

    @classmethod
    def from_dense(cls, mlp: nn.Module, layout: GatedLayout, max_density: float = 0.5, int8: bool = False,
                   sparse: bool = True, screen: bool = True, int4: bool = False,
                   symmetric: bool = False) -> "SparseGatedMLP":
        return cls(layout, getattr(mlp, layout.gate), getattr(mlp, layout.up), getattr(mlp, layout.down), max_density,
                   int8, sparse, screen, int4, symmetric)

    def _parts(self) -> tuple[nn.Linear | Rows, nn.Linear | Rows, nn.Linear]:
        return gated_parts(self, self.layout)

    def _sources(self) -> list[Tensor | None]:
        """What the buffers are made from and the decoding call's addresses point into: the weights and biases."""
        layers = dict.fromkeys(self._modules[a] for a in (self.layout.gate, self.layout.up, self.layout.down))
        return [layer._parameters[name] for layer in layers for name in ("weight", "bias")]

    @torch.no_grad()
    def _derive(self) -> None:
        """The buffers made from the layers' weights: the unit rows and the gate's screen, or the int8 rows and scales;
        made again by :meth:`forward` once a weight or bias has changed
        (:class:`~lambda_gelu.inference.derived.Made`)."""
        gate, up, down = (layer.weight for layer in self._parts())
        self._made, self._screened = Made(self._sources()), None
        if self.int4:
            (gate_q, gate_s), (up_q, up_s), (down_q, down_s) = (q4.quantize(w, self.symmetric)
                                                                 for w in (gate, up, down.t()))
            up_q, down_q = unit_rows(up_q, down_q)
            for name, t in zip(INT4_BUFFERS, (gate_q, gate_s, up_q, up_s, down_q, down_s)):
                self.register_buffer(name, t, persistent=False)
            self._screened = self._int4_call()
            return
        if not self.int8:
            for name, t in zip(F32_BUFFERS, unit_rows(gate, up, down.t())):
                self.register_buffer(name, t, persistent=False)
            if self.screen:
                for name, t in zip(("gate_q", "gate_s", "gate_r", "gate_n"), screen_rows(gate)):
                    self.register_buffer(name, t, persistent=False)
                self._screened = self._screened_call()
            return
        (gate_q, gate_s), (up_q, up_s), (down_q, down_s) = (quantize_rows(w) for w in (gate, up, down))
        up_q, down_q = unit_rows(up_q, down_q.t())  # down's rows are its outputs: one scale each
        for name, t in zip(INT8_BUFFERS, (gate_q, gate_s, up_q, up_s, down_q, down_s)):
            self.register_buffer(name, t, persistent=False)
        self._screened = self._int8_call()

    def __getstate__(self) -> dict:
        """A copy or a pickle holds its own tensors at other addresses: it makes its copies again at its first call."""
        return {**self.__dict__, "_made": None, "_screened": None}

    def _kernels_read_weights(self) -> bool:
        """Whether the float32 C kernels can read the unit rows, the gate's weight (read whole by the unscreened call)
        and the biases as they are."""
        rows, gate = [self._buffers[n] for n in F32_BUFFERS], self._parts()[0].weight
        return biases_fit(*self._parts()) and unit_stride(*rows) is not None and gate.is_contiguous() and all(
            t.dtype is torch.float32 and t.is_cpu for t in (*rows, gate))

    def _screened_call(self) -> tuple | None:
        """The screened C call and the addresses it reads that only a change of a weight or bias can move (the
        layers' weights and biases and the buffers made from them), or None where that call does not apply."""
        gate, up, down = self._parts()
        kernels, b = _native.library(), self._buffers
        if kernels is None or not self._kernels_read_weights():
            return None
        return kernels.sparse_gated_screened_f32, (
            b["gate_rows"].data_ptr(), pointer(gate.bias), *(b[n].data_ptr() for n in ("gate_q", "gate_s", "gate_r",
                                                                                         "gate_n")),
            b["up_rows"].data_ptr(), pointer(up.bias), b["down_t"].data_ptr(), pointer(down.bias))

    def _int8_call(self) -> tuple | None:
        """The int8 C call and the addresses it reads that only a change of a weight or bias can move (the int8 rows,
        their scales, the biases, and a scratch for the gate's values at decoding sizes), or None where it does not
        apply: at decoding sizes a token's block is then one check and one C call, as the float32 block's."""
        gate, up, down = self._parts()
        kernels, b = _native.library(), self._buffers
        if kernels is None or not biases_fit(gate, up, down) or unit_stride(b["up_q"], b["down_q"]) is None:
            return None
        self._scratch = torch.empty(FUSED_ROWS, gate.out_features, dtype=torch.float32)
        return kernels.sparse_gated_i8, (
            b["gate_q"].data_ptr(), b["gate_s"].data_ptr(), pointer(gate.bias), b["up_q"].data_ptr(),
            b["up_s"].data_ptr(), pointer(up.bias), b["down_q"].data_ptr(), b["down_s"].data_ptr(), pointer(down.bias),
            self._scratch.data_ptr())

    def _int4_call(self) -> tuple | None:
        """The 4-bit C call and the addresses it reads that only a change of a weight or bias can move, or None
        where it does not apply (then the block is its torch reference)."""
        gate, up, down = self._parts()
        kernels, b = _native.library(), self._buffers
        if kernels is None or not biases_fit(gate, up, down) or unit_stride(b["up_q"], b["down_q"]) is None:
            return None
        return kernels.sparse_gated_q4, (
            b["gate_q"].data_ptr(), b["gate_s"].data_ptr(), pointer(gate.bias), b["up_q"].data_ptr(),
            b["up_s"].data_ptr(), pointer(up.bias), b["down_q"].data_ptr(), b["down_s"].data_ptr(), pointer(down.bias))

    def forward(self, x: Tensor) -> Tensor:
        gate, up, down = self._parts()
        if torch.is_grad_enabled() and (x.requires_grad or gate.weight.requires_grad):
            raise RuntimeError("SparseGatedMLP is for inference and has no backward: run the model under "
                               "torch.inference_mode() or torch.no_grad() (or restore the dense blocks to train)")
        if self._made is None or self._made.stale(self._sources()):
            self._derive()
        if self.int4:
            return self._forward_int4(x, gate, up, down)
        if self.int8:
            return self._forward_int8(x, gate, up, down)
        x2 = x.reshape(-1, x.shape[-1])
        if (self._screened is not None and self.sparse and self.screen and len(x2) <= FUSED_ROWS
                and x.dtype is torch.float32 and x.is_cpu):  # decoding: one C call, its addresses made with the screen
            call, addresses = self._screened
            x2 = x2.contiguous()
            y = torch.empty(len(x2), down.out_features, dtype=torch.float32)
            if call(x2.data_ptr(), *addresses, None, y.data_ptr(), len(x2), x2.shape[1], gate.out_features,
                    down.out_features, self._buffers["down_t"].stride(0), torch.get_num_threads(),
                    _native.GRAIN) < 0:
                raise MemoryError("SparseGatedMLP: the kernel could not allocate its buffers")
            return y.reshape(*x.shape[:-1], down.out_features)
        kernels = _native.library() if (x.dtype is torch.float32 and x.is_cpu
                                        and self._kernels_read_weights()) else None
        fused = kernels is not None and len(x2) <= PROMPT_ROWS  # decoding and short prompts: the gate in C too
        if not (self.sparse or fused):
            return down(F.relu(gate(x)) * up(x))
        # decoding never falls back: its C loop over every unit costs what the dense block does at these sizes
        max_active = gate.out_features if fused or not self.sparse else int(self.max_density * gate.out_features)
        if kernels is not None:
            x2 = x2.contiguous()
            y = torch.empty(len(x2), down.out_features, dtype=torch.float32)
            b = self._buffers
            sizes = (len(x2), x2.shape[1], gate.out_features, down.out_features, b["down_t"].stride(0))
            threads = (torch.get_num_threads(), _native.GRAIN)
            if fused:  # a short prompt, decoding unscreened (screen=False), or every unit computed (sparse=False)
                g = torch.empty(len(x2), gate.out_features, dtype=torch.float32)
                n_active = kernels.sparse_gated_fused_f32(x2.data_ptr(), gate.weight.data_ptr(), pointer(gate.bias),
                                                          b["up_rows"].data_ptr(), pointer(up.bias),
                                                          b["down_t"].data_ptr(), pointer(down.bias), g.data_ptr(),
                                                          y.data_ptr(), *sizes, max_active, int(not self.sparse),
                                                          *threads)
            else:
                g = F.relu(gate(x2)).contiguous()
                n_active = kernels.sparse_gated_f32(x2.data_ptr(), g.data_ptr(), b["up_rows"].data_ptr(),
                                                    pointer(up.bias), b["down_t"].data_ptr(), pointer(down.bias),
                                                    y.data_ptr(), *sizes, max_active, *threads)
            if n_active < 0:
                raise MemoryError("SparseGatedMLP: the kernel could not allocate its buffers")
            if n_active > max_active:
                y = down(g * up(x2))
            return y.reshape(*x.shape[:-1], down.out_features)
        g = F.relu(gate(x))
        active = (g.reshape(-1, g.shape[-1]) != 0).any(0).nonzero().squeeze(1)
        if active.numel() > max_active:
            return down(g * up(x))
        return sparse_gated_reference(x, gate, up, down, active)

    def _forward_int8(self, x: Tensor, gate: nn.Linear, up: nn.Linear, down: nn.Linear) -> Tensor:
        b = self._buffers
        if (self._screened is not None and x.shape[:-1].numel() <= FUSED_ROWS and x.dtype is torch.float32
                and x.is_cpu):  # decoding: one C call, its addresses made with the int8 rows
            call, addresses = self._screened
            x2 = x.reshape(-1, x.shape[-1]).contiguous()
            y = torch.empty(len(x2), down.out_features, dtype=torch.float32)
            if call(x2.data_ptr(), *addresses, y.data_ptr(), len(x2), x2.shape[1], gate.out_features,
                    down.out_features, b["up_q"].stride(0), int(not self.sparse), torch.get_num_threads(),
                    _native.GRAIN) < 0:
                raise MemoryError("SparseGatedMLP: the kernel could not allocate its buffers")
            return y.reshape(*x.shape[:-1], down.out_features)
        stride = unit_stride(b["up_q"], b["down_q"])
        kernels = _native.library() if (x.dtype is torch.float32 and x.is_cpu and biases_fit(gate, up, down)
                                        and stride is not None) else None
        if kernels is None:
            return sparse_gated_int8_reference(x, b, gate, up, down).to(x.dtype)
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        g = torch.empty(len(x2), gate.out_features, dtype=torch.float32)
        y = torch.empty(len(x2), down.out_features, dtype=torch.float32)
        if kernels.sparse_gated_i8(x2.data_ptr(), b["gate_q"].data_ptr(), b["gate_s"].data_ptr(), pointer(gate.bias),
                                   b["up_q"].data_ptr(), b["up_s"].data_ptr(), pointer(up.bias), b["down_q"].data_ptr(),
                                   b["down_s"].data_ptr(), pointer(down.bias), g.data_ptr(), y.data_ptr(), len(x2),
                                   x2.shape[1], gate.out_features, down.out_features, stride, int(not self.sparse),
                                   torch.get_num_threads(), _native.GRAIN) < 0:
            raise MemoryError("SparseGatedMLP: the kernel could not allocate its buffers")
        return y.reshape(*x.shape[:-1], down.out_features)

    def _forward_int4(self, x: Tensor, gate: nn.Linear, up: nn.Linear, down: nn.Linear) -> Tensor:
        if (self._screened is None or x.dtype is not torch.float32 or not x.is_cpu
                or x.shape[-1] != gate.in_features):  # (the reference says what is wrong with such an x)
            return sparse_gated_int4_reference(x, self._buffers, gate, up, down, self.round_inputs).to(x.dtype)
        call, addresses = self._screened
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        g = torch.empty(len(x2), gate.out_features, dtype=torch.float32)
        y = torch.empty(len(x2), down.out_features, dtype=torch.float32)
        if call(x2.data_ptr(), *addresses, g.data_ptr(), y.data_ptr(), len(x2), x2.shape[1], gate.out_features,
                down.out_features, self._buffers["up_q"].stride(0), int(not self.round_inputs), torch.get_num_threads(),
                _native.GRAIN) < 0:
            raise MemoryError("SparseGatedMLP: the kernel could not allocate its buffers")
        return y.reshape(*x.shape[:-1], down.out_features)

    def extra_repr(self) -> str:
        return f"max_density={self.max_density:g}" + (", int8=True" if self.int8 else "") + (
            ", int4=True" if self.int4 else "") + (
            ", sparse=False" if not self.sparse else "") + (
            ", screen=False" if not (self.screen or self.int8 or self.int4) else "")


def _derive_again(module: SparseGatedMLP, incompatible_keys) -> None:
    module._derive()


def gated_mlps(model: nn.Module):
    """(qualified name, parent, attribute, layout) of every gated FFN in ``model`` whose gate is an exact
    ``nn.ReLU`` and whose projections are plain ``nn.Linear`` (a bundled layer twice as wide as ``down``'s input)."""
    for name, m in model.named_modules():
        for layout in gated_layouts():
            gate, up, down = parts = [getattr(m, a, None) for a in (layout.gate, layout.up, layout.down)]
            if (type(getattr(m, layout.act, None)) is nn.ReLU and all(_plain(p, nn.Linear) for p in parts)
                    and (not layout.bundled or gate.out_features == 2 * down.in_features)):
                parent_name, _, attr = name.rpartition(".")
                yield name, model.get_submodule(parent_name) if name else None, attr, layout


@torch.no_grad()
def formula_problem(mlp: nn.Module, layout: GatedLayout) -> str | None:
    """Why ``mlp``'s own forward is not ``down(relu(gate(x)) * up(x))`` on a probe input, or replacing it could change
    a result otherwise (:func:`lambda_gelu.core.convert.replacement_problem`), or None; its projections are checked as
    any sparse layer's (:func:`lambda_gelu.inference.sparse._kept_as_is`)."""
    gate, up, down = gated_parts(mlp, layout)
    if problem := replacement_problem(mlp, "SparseGatedMLP", ()):
        return problem
    generator = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(3, gate.in_features, generator=generator).to(gate.weight)
    try:
        theirs = mlp(x)
    except Exception as e:  # noqa: BLE001 - a forward that wants more than one tensor is not the formula
        return f"its forward does not take one tensor ({type(e).__name__})"
    ours = down(F.relu(gate(x)) * up(x))
    if not isinstance(theirs, Tensor) or theirs.shape != ours.shape or not torch.allclose(theirs, ours, rtol=1e-4,
                                                                                           atol=1e-5):
        return "computes something else than down(relu(gate(x)) * up(x)) (checked on a probe input)"
    return None
