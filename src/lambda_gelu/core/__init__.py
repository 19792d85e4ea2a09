"""The λ op and its training: the function and its kernels (``functional``, ``silu``), the layer (``module``), its
settings (``config``), the hardening schedule (``schedule``), λ's parameter groups (``optim``), the sparsity penalty
(``regularize``), λ under FSDP (``distributed``), activations by name (``registry``), and the model surgery they all
use (``convert``: GELU-like → λ-GELU → exact ReLU; ``keep``: modules left as they are; ``batches``: a batch of any
form through a model). The package's names are re-exported by :mod:`lambda_gelu`.
"""
