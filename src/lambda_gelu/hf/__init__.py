"""Hugging Face checkpoints → exact-ReLU checkpoints (the ``[hf]`` extra: transformers).

    from lambda_gelu.hf import ConversionConfig, reluize_checkpoint
    reluize_checkpoint("all-minilm-l6-v2", "minilm-relu", ConversionConfig(minutes=15))

One module per part: ``load`` (a checkpoint loaded the way its own library does), ``save`` (the atomic write
beside ``--out``), ``text`` (the offline training and held-out text, and its batchings), ``evaluate`` (what the
conversion kept, and its report), ``convert`` (:class:`ConversionConfig` and :func:`reluize_checkpoint`, which the
``lambda-gelu reluize`` command calls), ``deploy`` (:func:`deploy_checkpoint`, ``lambda-gelu deploy DIR``: the
checkpoint and its original in ONNX Runtime; the ``[deploy]`` extra too), ``decode`` (:class:`LeanDecoder`: greedy
decoding at batch 1 with fewer Python calls per token than ``generate``). transformers and ONNX Runtime are
imported only when used.
"""
from ..deploy.checkpoint import DeployConfig, deploy_checkpoint
from ..errors import CheckpointError
from ..inference.decoder import LeanDecoder
from .convert import BATCHINGS, ConversionConfig, reluize_checkpoint
from .load import OFFLINE_MODELS, load, model_directory, sentence_transformers_files
from .save import prepare_out, write_atomically
from .text import corpus, held_out_sets, in_order, length_grouped, read_texts, reference_sentences, stdlib_sentences

__all__ = ["ConversionConfig", "reluize_checkpoint", "DeployConfig", "deploy_checkpoint", "LeanDecoder",
           "CheckpointError", "BATCHINGS", "OFFLINE_MODELS", "load", "model_directory", "sentence_transformers_files",
           "prepare_out", "write_atomically", "stdlib_sentences", "reference_sentences", "held_out_sets", "read_texts",
           "corpus", "length_grouped", "in_order"]
