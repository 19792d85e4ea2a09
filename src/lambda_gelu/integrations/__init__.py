"""Thin adapters that drive :class:`lambda_gelu.HardeningSchedule` from other training loops.

Each imports its framework when imported itself (the framework is an optional extra):

- :mod:`lambda_gelu.integrations.transformers` — ``HardeningCallback`` for ``transformers.Trainer``;
- :mod:`lambda_gelu.integrations.lightning` — ``HardeningCallback`` for Lightning's ``Trainer``.

Neither holds state: λ's hardening state is in the model's buffers, so the framework's own
checkpoints (Trainer's ``checkpoint-N``, Lightning's ``.ckpt``) resume it exactly.
"""
