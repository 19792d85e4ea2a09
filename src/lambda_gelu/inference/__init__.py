"""Exact ReLU zeros as speed at inference: :func:`sparsify_` swaps a model's layers after a ReLU for ones that read
only their active inputs' weights (``sparse``: linear layers; ``gated``: gated FFNs, float32, int8 or 4-bit rows
(``int8``, ``int4``); ``experts``: mixtures of experts), ``screened_argmax`` finds a greedy decoder's next token
through int8 rows, and ``decoder`` (:class:`LeanDecoder`) decodes at batch 1 with few Python calls per token — a whole
token in one C call where ``token_step`` applies — reading each layer's parts through ``layout`` and sampling as
``sampling`` says.
``derived`` keeps the copies they make of weights current. Their C kernels are :mod:`lambda_gelu._native`'s.
"""
from .decoder import LeanDecoder
from .sparse import SparseLinear, activation_sparsity, sparsify_

__all__ = ["sparsify_", "SparseLinear", "activation_sparsity", "LeanDecoder"]
