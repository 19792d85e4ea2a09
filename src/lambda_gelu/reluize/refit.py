"""The least-squares refit: right after the swap, the layers that read each activation (BERT's ``output.dense``,
GPT-2's ``c_proj``, the second layer of an MLP, a ResNet block's next convolutions, over their patches) are solved
in closed form, in forward order, to give from the ReLU's output what they gave from the GELU's. A closed-form start
for the distillation, at the cost of a few forward passes (studies/minilm_refit.md measures it)."""
from __future__ import annotations

import collections
import itertools
from collections.abc import Iterable

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..core.batches import attention_mask
from ..core.convert import _is_conv1d, _name_relu_in_configs_, eval_mode, is_reluizable, replace_modules_
from .capture import PausedForwards
from .config import RIDGE
from .probes import run_hooked

__all__ = ["refit_after_swap_", "refit_consumers", "find_consumers"]


def refit_after_swap_(model: nn.Module, batches: Iterable, *, ridge: float = RIDGE,
                      consumers: dict[str, list[str]] | None = None) -> list[str]:
    """Swap every GELU-like module of ``model`` for an exact ``nn.ReLU``, then solve the layers that read
    each one's output (:func:`refit_consumers`), activation by activation in forward order, by least
    squares: on ``batches``, each is to give from the ReLU's output what it gave from the GELU's. For the
    rows a that reach the layer once the layers before are refit (a linear layer's positions, less those
    a batch's ``attention_mask`` masks out; a convolution's patches), W' and b' minimise
    Σ‖W'·relu(a) + b' − (W·gelu(a) + b)‖² + ridge·mean(diag)·‖W'‖². No gradient step; every module in
    eval mode, so BatchNorm normalises with its running statistics and keeps them. A closed-form start
    for the distillation (on all-MiniLM-L6-v2, cosine to the original 0.56 → 0.986 from 1024 sentences).
    Returns the names replaced; names ReLU in the Hugging Face configs as :func:`lambda_gelu.to_relu_` does."""
    batches = [batches] if isinstance(batches, torch.Tensor) else list(batches)
    if not batches:
        raise ValueError("refit_after_swap_ got no batches")
    replaced = swap_and_refit(model, batches, ridge, refit_consumers(model, batches[0]) if consumers is None
                                 else consumers)
    _name_relu_in_configs_(model)
    return replaced


def swap_and_refit(model: nn.Module, batches: list, ridge: float, consumers: dict[str, list[str]],
                   forwards=PausedForwards) -> list[str]:
    """Swaps and refits (see :func:`refit_after_swap_`), reaching each activation's input by ``forwards``: each
    batch's forward paused at one activation and resumed to the next once its layers are solved (every batch run
    once), or :class:`~lambda_gelu.reluize.capture.RestartedForwards`, the reference, which runs each batch again from
    the start for every activation. Both solve the same equations."""
    originals = dict(model.named_modules())
    replaced = replace_modules_(model, lambda m, fqn: is_reluizable(m), lambda old: nn.ReLU(), "GELU")
    gated = getattr(consumers, "gated", set())
    with eval_mode(model), forwards(model, batches) as walk:
        for act, layers in consumers.items():
            refit = _refit_gated if act in gated else _refit
            refit(model, act, originals[act], [model.get_submodule(n) for n in layers], walk, ridge)
    return replaced


def _refittable(m: nn.Module) -> bool:
    """A layer the refit can solve: ``nn.Linear``, Hugging Face ``Conv1D``, or a plain ``nn.Conv2d`` that is
    one matrix product over its input's patches (no groups, zero padding given in numbers; not a subclass,
    whose forward may pad otherwise)."""
    return (isinstance(m, nn.Linear) or _is_conv1d(m) or type(m) is nn.Conv2d and m.groups == 1
            and m.padding_mode == "zeros" and not isinstance(m.padding, str))


class Consumers(dict):
    """{activation: the layers to refit after it}; ``gated`` names the activations of gated FFNs, whose layer reads
    the activation's output multiplied by another projection's (Llama's ``down_proj(act(gate) * up)``)."""

    def __init__(self, *args, gated=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.gated = set(gated)


def refit_consumers(model: nn.Module, batch) -> Consumers:
    """:func:`find_consumers`, or ``ValueError`` if it finds none."""
    found = find_consumers(model, batch)
    if not found:
        raise ValueError("refit found no layer reading a GELU's output directly (an nn.Linear, Hugging Face Conv1D "
                         "or plain nn.Conv2d without groups, called once on exactly the tensor a GELU module "
                         "returned) nor a gated FFN's output projection; leave refit out")
    return found


def find_consumers(model: nn.Module, batch) -> Consumers:
    """{GELU- or SiLU-like module: the layers that read its output}, in forward order, found by running
    ``batch``: each layer (``nn.Linear``, Hugging Face ``Conv1D``, a plain ``nn.Conv2d`` without groups) is
    called once, on exactly the tensor the activation, called once, returned — a ResNet block's output feeds
    the next block's first convolution and its projection shortcut. An activation no layer reads directly, but
    whose parent module returns what a layer called after it returns, is a gated FFN's (SwiGLU, GeGLU): that
    layer is refit over the parent's product (see :attr:`Consumers.gated`). Empty where there is none (a mixture
    of experts that keeps its experts' weights as one tensor, applied without a layer)."""
    outputs, inputs, calls, produced, ends = {}, {}, collections.Counter(), {}, {}
    clock = itertools.count()

    def returned(name):
        def hook(mod, args, out):
            calls[name] += 1
            outputs[name] = out
            ends[name] = next(clock)
        return hook

    def reads(name):
        def hook(mod, args):
            calls[name] += 1
            inputs[name] = args[0] if args else None
        return hook

    def gives(name):
        def hook(mod, args, out):
            produced[name] = out
            ends.setdefault(name, next(clock))
        return hook

    handles, modules = [], dict(model.named_modules())
    parents = {name.rpartition(".")[0] for name, m in modules.items() if is_reluizable(m) and name}
    for name, m in modules.items():
        if is_reluizable(m):
            handles.append(m.register_forward_hook(returned(name)))
        elif _refittable(m):
            handles.append(m.register_forward_pre_hook(reads(name)))
            handles.append(m.register_forward_hook(gives(name)))
        if name in parents:
            handles.append(m.register_forward_hook(gives(name)))
    run_hooked(model, batch, handles)
    by_tensor = {id(out): name for name, out in outputs.items() if calls[name] == 1}  # the tensors are alive
    found = collections.defaultdict(list)
    for layer, x in inputs.items():  # in the order the layers were called; a convolution on a batch of images
        if id(x) in by_tensor and calls[layer] == 1 and (x.dim() == 4 or not isinstance(modules[layer], nn.Conv2d)):
            found[by_tensor[id(x)]].append(layer)
    gated = set()
    for act in outputs:  # a gated FFN: its parent returns what a layer inside it, called after it, returned
        parent = act.rpartition(".")[0]
        out = produced.get(parent)
        if act in found or calls[act] != 1 or not isinstance(out, torch.Tensor):
            continue
        last = [n for n in produced if n != parent and n.startswith(parent + ".") and produced[n] is out
                and calls[n] == 1 and ends[n] > ends[act]]
        if len(last) == 1:
            found[act].append(last[0])
            gated.add(act)
    order = list(outputs)
    return Consumers(sorted(found.items(), key=lambda kv: order.index(kv[0])), gated=gated)


def _rows(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``x`` as the rows ``layer``'s weight multiplies: a convolution's patches, or the last dimension."""
    if isinstance(layer, nn.Conv2d):
        patches = F.unfold(x, layer.kernel_size, layer.dilation, layer.padding, layer.stride)  # (N, C·kh·kw, L)
        return patches.transpose(1, 2).reshape(-1, patches.shape[1])
    return x.reshape(-1, x.shape[-1])


def _reached(walk, module: nn.Module, name: str) -> list[tuple]:
    """Each batch's ``(args, kwargs)`` at ``module`` (named ``name``), reached by ``walk``."""
    seen = walk.reach(module)
    if any(s is None for s in seen):
        raise RuntimeError(f"refit: {name} was not reached by the forward")
    return seen


@torch.no_grad()
def _refit(model: nn.Module, act: str, original: nn.Module, layers: list[nn.Module], walk, ridge: float) -> None:
    relu = model.get_submodule(act)
    sums = [None] * len(layers)
    for batch, (args, kwargs) in zip(walk.batches, _reached(walk, relu, act)):
        h, mask = args[0], attention_mask(batch)
        if mask is not None and mask.shape == h.shape[:-1]:  # positions: only the attended ones
            h = h[mask.bool()]
        relu_h = torch.relu(h) if h.dtype in (torch.float32, torch.float64) else torch.relu(h).float()  # no half Gram
        gelu_h = original(h)
        for i, layer in enumerate(layers):
            target = layer(gelu_h)
            target = target.movedim(1, -1) if isinstance(layer, nn.Conv2d) else target  # channels last, as rows
            target = target.reshape(-1, target.shape[-1]).double()
            a = _rows(layer, relu_h)
            if layer.bias is not None:
                a = torch.cat([a, a.new_ones(len(a), 1)], 1)
            g, r = (a.T @ a).double(), a.T.double() @ target  # each batch's Gram in float32 at least, summed in float64
            sums[i] = (g, r) if sums[i] is None else (sums[i][0] + g, sums[i][1] + r)
    _solve(layers, sums, ridge)


def layer_sides(layer: nn.Module) -> tuple[int, int]:
    """A refit layer's (inputs, outputs) as its least squares sees them: nn.Linear's features, Hugging Face Conv1D's
    (in, out) weight, a convolution's patch size and its channels out."""
    if hasattr(layer, "in_features"):
        return layer.in_features, layer.out_features
    if hasattr(layer, "out_channels"):
        return layer.weight[0].numel(), layer.out_channels
    return tuple(layer.weight.shape)


def ridge_solve(matrix: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """X with ``matrix`` X = ``rhs`` for a symmetric positive semi-definite ``matrix`` (a Gram matrix plus its ridge):
    by Cholesky where it is positive definite (SmolLM2's 1537² matrix with 576 right-hand sides: a few hundredths of
    a second, against over a second for an SVD), else by an SVD least squares (gelsd), rank-deficient too."""
    factor, info = torch.linalg.cholesky_ex(matrix)
    if info.item() == 0:
        return torch.cholesky_solve(rhs, factor)
    return torch.linalg.lstsq(matrix, rhs, driver="gelsd").solution


def _solve(layers: list[nn.Module], sums: list, ridge: float) -> None:
    """Each layer's weights from its summed Gram matrix and right-hand side: ridge least squares."""
    for layer, (gram, rhs) in zip(layers, sums):
        n_in = len(gram) - (layer.bias is not None)
        penalty = torch.zeros(len(gram), dtype=gram.dtype)
        penalty[:n_in] = ridge * gram.diagonal()[:n_in].mean()  # the bias, if any, is not shrunk
        solution = ridge_solve(gram + torch.diag(penalty), rhs)
        # Conv1D stores (in, out); nn.Linear (out, in); nn.Conv2d (out, in, kh, kw), in unfold's order
        weight = solution[:n_in] if _is_conv1d(layer) else solution[:n_in].T.reshape(layer.weight.shape)
        layer.weight.copy_(weight.to(layer.weight.dtype))
        if layer.bias is not None:
            layer.bias.copy_(solution[n_in].to(layer.bias.dtype))


@torch.no_grad()
def _refit_gated(model: nn.Module, act: str, original: nn.Module, layers: list[nn.Module], walk,
                 ridge: float) -> None:
    """The refit of a gated FFN's output projection: over the FFN's inputs as the (converted) network upstream
    gives them, W' is to give from what it reads with the ReLU gate what W gave from what it read with the
    original gate — the FFN run twice on the same input, once with each."""
    parent_name, _, leaf = act.rpartition(".")
    parent, (layer,) = model.get_submodule(parent_name), layers
    relu = getattr(parent, leaf)
    sums = [None]
    for batch, (args, kwargs) in zip(walk.batches, _reached(walk, parent, parent_name)):
        a = _seen_by(layer, parent, args, kwargs, output=False)
        setattr(parent, leaf, original)
        try:
            target = _seen_by(layer, parent, args, kwargs, output=True)
        finally:
            setattr(parent, leaf, relu)
        mask = attention_mask(batch)
        if mask is not None and mask.shape == a.shape[:-1]:  # positions: only the attended ones
            a, target = a[mask.bool()], target[mask.bool()]
        a = a.reshape(-1, a.shape[-1])
        a = a if a.dtype in (torch.float32, torch.float64) else a.float()  # no half Gram
        target = target.reshape(-1, target.shape[-1]).double()
        if layer.bias is not None:
            a = torch.cat([a, a.new_ones(len(a), 1)], 1)
        g, r = (a.T @ a).double(), a.T.double() @ target
        sums[0] = (g, r) if sums[0] is None else (sums[0][0] + g, sums[0][1] + r)
    _solve(layers, sums, ridge)


def _seen_by(layer: nn.Module, parent: nn.Module, args, kwargs, output: bool) -> torch.Tensor:
    """What ``layer`` reads (or, with ``output``, returns) when ``parent`` runs on ``args``/``kwargs``."""
    got = {}
    if output:
        handle = layer.register_forward_hook(lambda mod, a, out: got.__setitem__("t", out))
    else:
        handle = layer.register_forward_pre_hook(lambda mod, a: got.__setitem__("t", a[0]))
    try:
        parent(*args, **kwargs)
    finally:
        handle.remove()
    return got["t"]
