"""``HardeningCallback`` for Lightning (the ``[lightning]`` extra).

    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = ...
            lg.convert_to_lambda_gelu_(self.net)

        def configure_optimizers(self):              # λ in its own group: c·lr, no weight decay
            return torch.optim.AdamW(lg.lambda_param_groups(self, lr=1e-3, weight_decay=0.05))

    L.Trainer(max_epochs=10, callbacks=[HardeningCallback()]).fit(Model(), data)

The schedule follows ``trainer.global_step`` (optimizer steps) over
``trainer.estimated_stepping_batches``; its state is in the model's buffers, hence in Lightning's
checkpoints.
"""
from __future__ import annotations

try:
    from lightning.pytorch import Callback
except ImportError:  # the older package name
    from pytorch_lightning import Callback

from ..core.config import LambdaGELUConfig
from ..core.schedule import HardeningSchedule, _check_callback_arguments

__all__ = ["HardeningCallback"]


class HardeningCallback(Callback):
    """Learn λ until ``switch_at`` of training, then freeze it and anneal it to λ_target(``epsilon``).
    Unset arguments come from ``config`` (default :data:`lambda_gelu.DEFAULTS`). ``switch_at="auto"``
    needs ``probe=``, a fixed batch as the model takes it; ``freeze=False`` keeps λ learning during the
    anneal (see :class:`lambda_gelu.HardeningSchedule`)."""

    def __init__(self, switch_at: float | str | None = None, epsilon: float | None = None,
                 config: LambdaGELUConfig | None = None, probe=None, freeze: bool = True):
        super().__init__()
        _check_callback_arguments(switch_at, epsilon, config, probe)
        self.switch_at, self.epsilon, self.config = switch_at, epsilon, config
        self.probe, self.freeze = probe, freeze
        self.schedule: HardeningSchedule | None = None

    def on_train_start(self, trainer, pl_module):
        total = trainer.estimated_stepping_batches
        if not isinstance(total, int) or total == float("inf"):
            raise ValueError("HardeningCallback needs a finite length of training: set max_steps or max_epochs")
        self.schedule = HardeningSchedule(pl_module, total_steps=total, switch_at=self.switch_at,
                                          epsilon=self.epsilon, config=self.config, probe=self.probe,
                                          freeze=self.freeze)
        self.schedule.step(trainer.global_step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.schedule.step(trainer.global_step)
