"""More exact zeros in gated FFNs by a threshold: each ReLU gate ``relu(gate(x) + b)`` gets a bias ``b``, lowered
step by step until the share of the gates' outputs that are exactly zero, averaged over the layers, reaches a target.

The L1 penalty (:class:`~lambda_gelu.SparsityRegularizer`) asks for zeros through the loss and trades them against
the teacher's distribution at a factor that has to be guessed; the threshold asks for a share of zeros directly and
lets the distillation repair what the shift costs. One shift for all the gates (a threshold per unit, each unit
silenced on the same share of tokens, costs far more perplexity than one shift that keeps the units that fire often
firing: studies/smollm2_gate_shift.md), found each step as the quantile of this batch's gate pre-activations at the
step's target share, applied halfway (the batches' quantiles vary); the target rises linearly from the model's own
share to ``target`` over the first ``end`` fraction of the steps and stays there. The biases are weights like any
other, so the optimizer trains each unit's on top. Given one share per gated FFN instead, each layer's gates get a
shift of their own, found the same way from that layer's pre-activations alone, so the layers end as unequally sparse
as asked. On SmolLM2, shares chosen by what each layer's zeros were measured to cost untrained kept less after the
distillation than the one shift (studies/smollm2_layer_zeros.md): the one shift is what ``gate_zeros`` gives.
:func:`shift_gates_` applies that one shift at once, on given batches: ``gate_zeros_at_once`` does so before the
least-squares refit, so that the refit solves each FFN's output projection for the shifted gates and the steps hold
the share rather than reach it.

A Hugging Face model keeps its biases where its config can say so (``mlp_bias``, as Llama's has): that is set, and a
family whose config cannot name them is refused, as its checkpoint would load without them. The sparse gated
kernels (:class:`lambda_gelu.inference.gated.SparseGatedMLP`) read the biases, so the threshold costs nothing there.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn
from torch import Tensor

from ..core.batches import run_batch
from ..core.convert import _hugging_face_models, eval_mode, rebuilt_from_config
from ..families import gated_layouts

__all__ = ["GateThreshold", "add_gate_biases_", "gated_ffns", "gate_zeros_problem", "shift_gates_"]

SAMPLE = 4096  # gate pre-activations sampled per layer and step for the quantile
RATE = 0.5     # the share of each step's measured shift that is applied
QUANTILE_MAX = 1 << 24  # the most values torch.quantile takes



def _separate() -> tuple:
    """The gated layouts whose gate is a layer of its own, whose whole output and bias the threshold reads and moves;
    not a bundled one (Phi-3's gate_up_proj: up's half would be thresholded too)."""
    return tuple(layout for layout in gated_layouts() if not layout.bundled)


def gated_ffns(model: nn.Module, layouts: Sequence | None = None) -> list[tuple[str, nn.Module, tuple[nn.Linear, ...]]]:
    """(name, FFN, (gate, up, down)) of every gated FFN in ``model`` laid out as one of ``layouts`` (those of
    the families table's gated layouts the threshold takes, by default) with ``nn.Linear`` projections, whatever its
    activation."""
    found, layouts = [], _separate() if layouts is None else layouts
    for name, m in model.named_modules():
        for layout in layouts:
            parts = tuple(getattr(m, a, None) for a in (layout.gate, layout.up, layout.down))
            if hasattr(m, layout.act) and all(isinstance(p, nn.Linear) for p in parts):
                found.append((name, m, parts))
    return found


def gate_zeros_problem(model: nn.Module) -> str | None:
    """Why ``model``'s gates cannot be thresholded (None if they can): it has no gated FFN, or a Hugging Face model in
    it could not save the biases on its gated FFNs."""
    if not gated_ffns(model):
        if bundled := [lay.gate for lay in gated_layouts() if lay.bundled and gated_ffns(model, (lay,))]:
            return (f"its gated FFNs hold gate and up in one layer ({', '.join(bundled)}), where a bias would shift "
                    "up's half too: the threshold biases a gate of its own layer")
        return "the model has no gated FFN (" + "; ".join(
            f"{lay.gate}, {lay.up}, {lay.down} and {lay.act}" for lay in _separate()) + ") to threshold"
    for _, hf in _hugging_face_models(model):
        if not hasattr(hf.config, "mlp_bias"):
            return (f"{type(hf).__name__}'s config has no mlp_bias to give its gated FFNs the biases the threshold "
                    "trains, so its checkpoint would load without them (Llama-family configs have one)")
        built = rebuilt_from_config(hf, {"mlp_bias": True})
        if isinstance(built, str):
            return built
        for name, _, _ in gated_ffns(hf):
            if any(p.bias is None for p in gated_ffns(built.get_submodule(name))[0][2]):
                return f"{type(hf).__name__} with mlp_bias=True still builds {name} without biases"
    return None


def add_gate_biases_(model: nn.Module) -> list[nn.Linear]:
    """Give every gated FFN's three projections a zero bias where they have none (the function is unchanged), set
    ``mlp_bias`` in Hugging Face configs, and return the gate projections in :func:`gated_ffns`' order."""
    ffns = gated_ffns(model)
    for _, _, layers in ffns:
        for layer in layers:
            if layer.bias is None:
                w = layer.weight
                layer.bias = nn.Parameter(torch.zeros(layer.out_features, dtype=w.dtype, device=w.device),
                                          requires_grad=w.requires_grad)
    for _, hf in _hugging_face_models(model):
        hf.config.mlp_bias = True
    return [layers[0] for _, _, layers in ffns]


@torch.no_grad()
def shift_gates_(model: nn.Module, batches: Sequence, share: float) -> float:
    """Lower every gated FFN's gate bias by one shift, at once: the quantile at ``share`` of the gates'
    pre-activations on ``batches``, pooled over the layers (a seeded sample of each batch's, as the threshold's
    steps take), so that about ``share`` of the gates' outputs on them are exact zeros once the gates are ReLU.
    Gives the projections biases as :class:`GateThreshold` does, and returns the shift. The model runs as it is, in
    eval mode: the shift moves what later layers read, so the share the shifted model gives is near ``share``, not
    exactly it (the threshold's steps then hold it)."""
    gates = add_gate_biases_(model)
    samples: list[Tensor] = []
    drawn: dict[torch.device, torch.Generator] = {}  # seeded: the same batches give the same shift

    def sample(module, args, out):
        flat = out.detach().flatten()
        g = drawn.setdefault(flat.device, torch.Generator(flat.device).manual_seed(0))
        picked = torch.randint(0, flat.numel(), (min(SAMPLE, flat.numel()),), device=flat.device, generator=g)
        samples.append(flat[picked].float())

    hooks = [g.register_forward_hook(sample) for g in gates]
    try:
        with eval_mode(model):  # as the refit runs it: no dropout
            for batch in batches:
                run_batch(model, batch)
    finally:
        for h in hooks:
            h.remove()
    pooled = torch.cat(samples)
    if pooled.numel() > QUANTILE_MAX:
        pooled = pooled[torch.randint(0, pooled.numel(), (QUANTILE_MAX,), device=pooled.device,
                                      generator=drawn[pooled.device])]
    shift = float(torch.quantile(pooled, share))
    for g in gates:
        g.bias.sub_(shift)
    return shift


class GateThreshold:
    """Lower the gated FFNs' gate biases until ``target`` of their outputs are exact zeros (see the module's
    docstring): one share, averaged over the layers, or one per gated FFN in :func:`gated_ffns`' order, each
    layer's own. Call :meth:`step` after each optimizer step. Building it gives every gated FFN's three projections
    a zero bias where they have none (the function is unchanged) and sets ``mlp_bias`` in Hugging Face configs:
    build the optimizer after it. ``ValueError`` (nothing changed) if ``model`` has no gated FFN, a Hugging Face
    model in it could not save the biases, or the shares are not one per gated FFN, each in [0, 1)."""

    def __init__(self, model: nn.Module, total_steps: int, target: float | Sequence[float], end: float = 0.5):
        problem = gate_zeros_problem(model)
        if problem:
            raise ValueError(f"gate_zeros: {problem}")
        ffns = gated_ffns(model)
        per_layer = isinstance(target, Sequence)
        if per_layer and (len(target) != len(ffns) or not all(0.0 <= float(t) < 1.0 for t in target)):
            raise ValueError(f"gate_zeros: one share in [0, 1) per gated FFN, {len(ffns)} here; got {list(target)}")
        self.gates = add_gate_biases_(model)
        self.total_steps, self.end = total_steps, end
        self.target = torch.tensor([float(t) for t in target]) if per_layer else float(target)
        self.step_count, self.start = 0, None  # start: the share of zeros at the first step (per layer, or pooled)
        self._samples: list[list[Tensor]] = [[] for _ in self.gates]
        self._hooks = [g.register_forward_hook(lambda m, a, out, i=i: self._sample(i, out))
                       for i, g in enumerate(self.gates)]

    def _sample(self, i: int, out: Tensor) -> None:
        if not torch.is_grad_enabled():  # evaluation forwards are not training batches
            return
        flat = out.detach().flatten()  # the pre-activations, each unit's bias included (padding too: a few)
        self._samples[i].append(flat[torch.randint(0, flat.numel(), (min(SAMPLE, flat.numel()),),
                                                   device=flat.device)].float())

    def share(self) -> float | Tensor:
        """The share of zeros this step aims at (one per gated FFN if the target gives one per gated FFN)."""
        if self.start is None:
            return self.target
        a = min(1.0, self.step_count / max(1.0, self.end * self.total_steps))
        return self.start + a * (self.target - self.start)

    @torch.no_grad()
    def step(self) -> None:
        """After each optimizer step: move every gate's bias towards the shift at which this batch's gates give the
        step's share of zeros (pooled over the layers, or each layer's own)."""
        self.step_count += 1
        per_layer = isinstance(self.target, Tensor)
        if not (all if per_layer else any)(self._samples):
            return
        values = [torch.cat(v) for v in self._samples] if per_layer else [torch.cat(sum(self._samples, []))]
        self._samples = [[] for _ in self.gates]
        if self.start is None:
            start = torch.stack([(v <= 0).float().mean() for v in values]).cpu()
            self.start = start if per_layer else float(start[0])
        shares = self.share() if per_layer else torch.tensor([self.share()])
        shift = torch.stack([torch.quantile(v, min(max(float(q), 0.0), 1.0)) for v, q in zip(values, shares)])
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(shift)
            shift /= torch.distributed.get_world_size()
        shifts = shift.tolist() if per_layer else shift.tolist() * len(self.gates)
        for g, t in zip(self.gates, shifts):  # a number, not a tensor: a sharded bias (FSDP) takes it as it is
            g.bias.sub_(RATE * t)

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def state_dict(self) -> dict:
        return {"step": self.step_count, "start": self.start}

    def load_state_dict(self, state: dict) -> None:
        self.step_count, self.start = int(state["step"]), state["start"]
