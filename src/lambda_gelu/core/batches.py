"""One way to run a batch through a model, whatever form the batch has, used by every part of the library
that does so (conversion's channel count, the automatic switch's probe, ``reluize``).

- a tensor is the one positional argument: ``model(x)``;
- a tuple or list holds the positional arguments: ``model(*batch)``;
- a mapping holds keyword arguments, as a Hugging Face tokenizer returns them: ``model(**batch)`` — or is
  itself the one argument a forward cannot do without when it names none of them (sentence-transformers'
  features dict): ``model(batch)``.
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping

import torch.nn as nn

__all__ = ["run_batch", "attention_mask", "wrapped"]


def run_batch(model: nn.Module, batch, *, hidden_states: bool = False):
    """``model`` called on ``batch`` (see the module's docstring). ``hidden_states=True`` asks a model
    that can give them (its forward names ``output_hidden_states``, or it is a Hugging Face model) for
    its hidden states, unless the batch already says."""
    if isinstance(batch, Mapping):
        inner = wrapped(model)  # what a DDP, FSDP or torch.compile wrapper runs: its forward says what it takes
        first = _first_required(type(inner))
        if first is not None and first not in batch:  # the mapping is that argument: sentence-transformers' features
            return model(batch)
        kwargs = dict(batch)
        if hidden_states and _takes_hidden_states(inner):
            kwargs.setdefault("output_hidden_states", True)
        return model(**kwargs)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def wrapped(model: nn.Module) -> nn.Module:
    """The module inside DDP, DataParallel, FSDP and ``torch.compile`` wrappers (``model`` itself if none)."""
    while True:
        inner = getattr(model, "_orig_mod", None)  # torch.compile
        if inner is None and type(model).__name__ in _WRAPPERS:
            inner = getattr(model, "module", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


_WRAPPERS = ("DistributedDataParallel", "DataParallel", "FullyShardedDataParallel")


def attention_mask(batch):
    """The batch's ``attention_mask`` if it is a mapping that has one, else None."""
    return batch.get("attention_mask") if isinstance(batch, Mapping) else None


def _takes_hidden_states(model: nn.Module) -> bool:
    """Whether ``model`` can be asked for its hidden states: its forward names ``output_hidden_states``,
    or it is a Hugging Face model (its config has the field), whose forward may take it through
    ``**kwargs`` (BERT, RoBERTa, GPT-2 in transformers 5)."""
    return ("output_hidden_states" in _forward_parameters(type(model))
            or hasattr(getattr(model, "config", None), "output_hidden_states"))


@functools.lru_cache(maxsize=None)
def _first_required(cls: type) -> str | None:
    """The name of the first argument a module class's forward cannot do without (None: it has defaults for all)."""
    try:
        parameters = list(inspect.signature(cls.forward).parameters.values())[1:]  # after self
    except (TypeError, ValueError):
        return None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return next((p.name for p in parameters if p.kind in positional and p.default is p.empty), None)


@functools.lru_cache(maxsize=None)
def _forward_parameters(cls: type) -> frozenset[str]:
    """The argument names of a module class's forward, read once per class (``reluize`` runs a batch every step)."""
    try:
        return frozenset(inspect.signature(cls.forward).parameters)
    except (TypeError, ValueError):
        return frozenset()
