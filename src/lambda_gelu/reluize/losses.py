"""What the converted network is trained to keep: named distillation losses, each
``loss(student_output, teacher_output, batch) -> scalar``, and ``"auto"``, which picks one by the output's
type and says which (:attr:`AutoLoss.picked`, and ``ReluizeResult.loss``).

=====================  ==========================================================================================
name                   for outputs with ... (what it measures)
=====================  ==========================================================================================
``logits-kl``          ``logits`` (language models, classifiers): KL(teacher ‖ student) of the softmax over the
                       last dimension, averaged over positions (the attention mask's, if the batch has one)
``sentence-cosine``    ``sentence_embedding`` (sentence-transformers): 1 − cosine of those, plus the relative
                       squared error of the ``token_embeddings`` under their ``attention_mask``
``pooled-cosine``      ``last_hidden_state`` (encoders): 1 − cosine of the mean-pooled embeddings
``relative-error``     a plain tensor: ‖s − t‖² / ‖t‖²
=====================  ==========================================================================================

The first three add the mean over layers of each hidden state's relative squared error when the outputs carry
``hidden_states`` (``reluize`` asks a Hugging Face model for them), times ``hidden`` (``ReluizeConfig.hidden_weight``:
by default 1, or 4 with ``gate_zeros``; 0 leaves the term out). An encoder-decoder's output (T5's, BART's) carries
both sides': the mean is over the encoder's and the decoder's layers, each under its own mask (the batch's
``attention_mask`` and ``decoder_attention_mask``), and its logits and last hidden state are the decoder's.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from ..core.batches import attention_mask
from .kl import kl_divergence

__all__ = ["LOSSES", "AutoLoss", "LogitsKL", "SentenceCosine", "PooledCosine", "RelativeError", "distillation_loss",
           "get_loss", "mean_pool", "relative_error"]


class LogitsKL:
    """``kl``: the chunked :func:`~lambda_gelu.reluize.kl.kl_divergence`, or its reference ``kl_reference``;
    ``hidden``: the hidden-state term's weight."""
    name = "logits-kl"

    def __init__(self, kl=kl_divergence, hidden: float = 1.0):
        self.kl, self.hidden = kl, hidden

    def __call__(self, student, teacher, batch=None) -> torch.Tensor:
        logits = _field(student, "logits")
        mask = _positions_mask(student, batch)
        kl = self.kl(logits, _field(teacher, "logits"), _mean_weights(logits.shape[:-1], mask, logits.device))
        return _plus_hidden_states(kl, student, teacher, batch, self.hidden)


class SentenceCosine:
    name = "sentence-cosine"

    def __init__(self, hidden: float = 1.0):
        self.hidden = hidden

    def __call__(self, student, teacher, batch=None) -> torch.Tensor:
        mask = attention_mask(batch)
        value = 1.0 - F.cosine_similarity(_field(student, "sentence_embedding").float(),
                                          _field(teacher, "sentence_embedding").float(), dim=-1).mean()
        tokens = _field(student, "token_embeddings")
        if tokens is not None:
            value = value + relative_error(tokens, _field(teacher, "token_embeddings"),
                                           _field(student, "attention_mask") if mask is None else mask)
        return _plus_hidden_states(value, student, teacher, batch, self.hidden)


class PooledCosine:
    name = "pooled-cosine"

    def __init__(self, hidden: float = 1.0):
        self.hidden = hidden

    def __call__(self, student, teacher, batch=None) -> torch.Tensor:
        mask = _positions_mask(student, batch)
        h_s, h_t = _field(student, "last_hidden_state"), _field(teacher, "last_hidden_state")
        value = 1.0 - F.cosine_similarity(mean_pool(h_s, mask), mean_pool(h_t, mask), dim=-1).mean()
        return _plus_hidden_states(value, student, teacher, batch, self.hidden)


class RelativeError:
    name = "relative-error"

    def __init__(self, hidden: float = 1.0):  # a plain tensor has no hidden states to weigh
        pass

    def __call__(self, student, teacher, batch=None) -> torch.Tensor:
        return relative_error(student, teacher, None)


LOSSES = {cls.name: cls for cls in (LogitsKL, SentenceCosine, PooledCosine, RelativeError)}


def _pick(output, hidden: float = 1.0):
    """The loss for an output of this type (the order of the module's table), or a TypeError."""
    if isinstance(output, torch.Tensor):
        return RelativeError()
    for name, cls in (("logits", LogitsKL), ("sentence_embedding", SentenceCosine),
                      ("last_hidden_state", PooledCosine)):
        if _field(output, name) is not None:
            return cls(hidden=hidden)
    raise TypeError(f"no distillation loss knows outputs of type {type(output).__name__} (looked for a tensor, "
                    "logits, sentence_embedding or last_hidden_state): give reluize a "
                    "loss=(student_output, teacher_output, batch) callable")


class AutoLoss:
    """Picks the loss at its first call from the output's type (the module's table); :attr:`picked` says which.
    ``hidden``: the hidden-state term's weight in the loss it picks."""
    name = "auto"

    def __init__(self, hidden: float = 1.0):
        self.picked, self.hidden = None, hidden

    def __call__(self, student, teacher, batch=None) -> torch.Tensor:
        if self.picked is None:
            self.picked = _pick(student, self.hidden)
        return self.picked(student, teacher, batch)


def get_loss(loss, hidden: float = 1.0):
    """A loss by name (``"auto"`` or one of :data:`LOSSES`) with its hidden-state term weighed by ``hidden``, or a
    callable as it is."""
    if callable(loss):
        return loss
    if loss == "auto":
        return AutoLoss(hidden)
    if loss in LOSSES:
        return LOSSES[loss](hidden=hidden)
    raise ValueError(f"loss must be 'auto', one of {', '.join(LOSSES)}, or a callable; got {loss!r}")


def distillation_loss(student, teacher, batch=None) -> torch.Tensor:
    """The loss the output's type calls for (see the module's table), chosen at every call."""
    return _pick(student)(student, teacher, batch)


def _plus_hidden_states(value, student, teacher, batch, weight: float = 1.0):
    """``value`` plus ``weight`` times the mean over the outputs' hidden states (an encoder-decoder's of both sides)
    of their relative squared error."""
    pairs = [(s, t, mask) for (states, mask), (targets, _) in zip(_hidden_states(student, batch),
                                                                    _hidden_states(teacher, batch))
             for s, t in zip(_tensors(states), _tensors(targets))]
    if pairs and weight:
        value = value + weight * sum(relative_error(s, t, mask) for s, t, mask in pairs) / len(pairs)
    return value


def _tensors(states) -> list[torch.Tensor]:
    """The tensors of a tuple of hidden states, one a layer, or a tuple of them (PEGASUS-X's last encoder layer gives
    its tokens' and its global tokens')."""
    return [t for s in states for t in ((s,) if isinstance(s, torch.Tensor) else _tensors(s))]


def _is_seq2seq(output) -> bool:
    """An encoder-decoder's output (transformers' Seq2Seq*Output): its logits and hidden states are the decoder's."""
    return _field(output, "encoder_last_hidden_state") is not None


def _positions_mask(output, batch):
    """The mask of ``output``'s positions: the batch's ``decoder_attention_mask`` for an encoder-decoder's (None if
    it has none: every position), else its ``attention_mask``."""
    if _is_seq2seq(output):
        return batch.get("decoder_attention_mask") if isinstance(batch, Mapping) else None
    return attention_mask(batch)


def _hidden_states(output, batch) -> list[tuple]:
    """``output``'s hidden states, each side's with its mask: ``[(hidden_states, mask)]``, an encoder-decoder's
    ``[(encoder's, attention_mask), (decoder's, decoder_attention_mask)]``; empty where it has none."""
    if not _is_seq2seq(output):
        states = _field(output, "hidden_states")
        return [(states, attention_mask(batch))] if states else []
    sides = ((_field(output, "encoder_hidden_states"), attention_mask(batch)),
             (_field(output, "decoder_hidden_states"), _positions_mask(output, batch)))
    return [(states, mask) for states, mask in sides if states]


def _field(output, name: str):
    if isinstance(output, dict):
        return output.get(name)
    return getattr(output, name, None)


def _mean_weights(shape: torch.Size, mask, device: torch.device) -> torch.Tensor:
    """The weights of a mean over positions of ``shape``: the ``mask``'s (if it fits) over its sum, else uniform."""
    if mask is None or mask.shape != shape:
        return torch.full(shape, 1.0 / max(shape.numel(), 1), device=device)
    mask = mask.to(device, torch.float32)
    return mask / mask.sum().clamp(min=1)


def mean_pool(h: torch.Tensor, mask) -> torch.Tensor:
    """Mean over positions (the sentence-transformers pooling), padding left out."""
    if mask is None or mask.shape != h.shape[:-1]:
        return h.float().mean(-2)
    m = mask.unsqueeze(-1).to(torch.float32)
    return (h.float() * m).sum(-2) / m.sum(-2).clamp(min=1)


def relative_error(s: torch.Tensor, t: torch.Tensor, mask) -> torch.Tensor:
    """‖s − t‖² / ‖t‖² over the positions ``mask`` keeps (all, if it does not fit ``s``)."""
    se, norm = (s.float() - t.float()).pow(2), t.float().pow(2)
    if mask is not None and mask.shape == s.shape[:-1]:
        m = mask.unsqueeze(-1).to(torch.float32)
        se, norm = se * m, norm * m
    return se.sum() / norm.sum().clamp(min=torch.finfo(torch.float32).tiny)
