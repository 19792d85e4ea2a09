"""Hugging Face checkpoints → exact-ReLU checkpoints (the ``[hf]`` extra: transformers).

    from lambda_gelu.hf import ConversionConfig, reluize_checkpoint
    reluize_checkpoint("all-minilm-l6-v2", "minilm-relu", ConversionConfig(minutes=15))

One module per part: ``load`` (a checkpoint loaded the way its own library does), ``save`` (the atomic write
beside ``--out``), ``text`` (the offline training and held-out text, and its batchings), ``evaluate`` (what the
conversion kept, and its report), ``convert`` (:class:`ConversionConfig` and :func:`reluize_checkpoint`, which the
``lambda-gelu reluize`` command calls: load → check → plan → reluize → measure → write), ``generate`` (``lambda-gelu
generate``), ``attention`` (the attention a student trains with). What a checkpoint buys where it ships is
:mod:`lambda_gelu.deploy`'s; :class:`LeanDecoder` is :mod:`lambda_gelu.inference`'s, named here too. transformers
is imported only when used.
"""
from ..errors import CheckpointError
from ..inference.decoder import LeanDecoder
from .convert import BATCHINGS, ConversionConfig, reluize_checkpoint
from .load import OFFLINE_MODELS, load, model_directory, sentence_transformers_files
from .save import prepare_out, write_atomically
from .text import corpus, held_out_sets, in_order, length_grouped, read_texts, reference_sentences, stdlib_sentences

__all__ = ["ConversionConfig", "reluize_checkpoint", "LeanDecoder",
           "CheckpointError", "BATCHINGS", "OFFLINE_MODELS", "load", "model_directory", "sentence_transformers_files",
           "prepare_out", "write_atomically", "stdlib_sentences", "reference_sentences", "held_out_sets", "read_texts",
           "corpus", "length_grouped", "in_order"]


def __getattr__(name: str):  # deploy's names, once here: lambda_gelu.deploy.checkpoint holds them (for one release)
    if name in ("DeployConfig", "deploy_checkpoint"):
        import importlib
        import warnings
        warnings.warn(f"lambda_gelu.hf.{name} is now lambda_gelu.deploy.checkpoint.{name}", DeprecationWarning,
                      stacklevel=2)
        return getattr(importlib.import_module("lambda_gelu.deploy.checkpoint"), name)
    raise AttributeError(f"module 'lambda_gelu.hf' has no attribute {name!r}")
