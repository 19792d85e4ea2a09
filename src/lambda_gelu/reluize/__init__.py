"""ReLU-ize a pretrained GELU network while it distils from its original:

    result = lambda_gelu.reluize(model, batches, steps=300)   # model is now an exact-ReLU network
    result = lambda_gelu.reluize(model, batches, 300, ReluizeConfig(schedule="anneal", lr=1e-4))

One module per part: ``config`` (:class:`ReluizeConfig`, every setting and rule), ``api`` (:func:`reluize`),
``reluizer`` (:class:`Reluizer`: the swap and the anneal, step by step, for a loop of your own), ``distill``
(reluize's loop over those steps), ``blockwise`` (block by block reconstruction), ``refit`` (the least-squares
refit after the swap), ``batchnorm`` (BatchNorm re-estimation), ``losses`` (the named distillation losses),
``threshold`` (:class:`GateThreshold`: more exact zeros in gated FFNs by a lowered gate bias), ``stream`` (the
batches), ``probes`` (gates applied as functions, activation modules a batch never reaches).

Which recipe when, with the measurements behind each default: docs/findings.md.

The model is converted in place; the config of every Hugging Face model in it names ReLU (see
:mod:`lambda_gelu.core.convert`), so that ``save_pretrained`` writes a checkpoint that plain ``transformers`` loads as
the ReLU network — and where a config cannot say so, ``reluize`` warns before its first step.
"""
from .api import reluize
from .batchnorm import recalibrate_batchnorm_
from .blockwise import ReconstructionBlock, reconstruction_blocks
from .config import LR_SCHEDULES, RECALIBRATE, RIDGE, SCHEDULES, ReluizeConfig
from .losses import LOSSES, AutoLoss, distillation_loss, mean_pool
from .refit import refit_after_swap_, refit_consumers
from .reluizer import AnnealedGELU, Reluizer
from .result import ReluizeResult
from .threshold import GateThreshold

__all__ = ["reluize", "Reluizer", "ReluizeConfig", "ReluizeResult", "SCHEDULES", "LR_SCHEDULES", "RIDGE", "RECALIBRATE",
           "LOSSES", "AutoLoss", "distillation_loss", "mean_pool", "reconstruction_blocks", "ReconstructionBlock",
           "AnnealedGELU", "refit_after_swap_", "refit_consumers", "recalibrate_batchnorm_", "GateThreshold"]
