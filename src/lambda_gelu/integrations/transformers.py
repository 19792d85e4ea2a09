"""``HardeningCallback`` for Hugging Face ``transformers.Trainer`` (the ``[hf]`` extra).

    model = AutoModelForCausalLM.from_config(config)
    lg.convert_to_lambda_gelu_(model)                       # before building the optimizer
    optimizer = torch.optim.AdamW(lg.lambda_param_groups(model, lr=5e-4, weight_decay=0.01, no_decay_1d=True))
    trainer = Trainer(model=model, args=args, train_dataset=data,
                      optimizers=(optimizer, None),            # λ in its own group (c·lr, no decay)
                      callbacks=[HardeningCallback()])        # learn λ, switch at 25%, anneal to λ_target
    trainer.train()                                          # or train(resume_from_checkpoint=...)
    lg.to_relu_(model)                                       # exact ReLU; its config says so for save_pretrained

The schedule follows ``state.global_step`` (optimizer steps, so gradient accumulation is counted
right) over ``state.max_steps``. Without ``optimizers=``, the Trainer's own optimizer puts λ with
the other weights (base learning rate, weight decay): it still anneals, but λ does not learn as the
paper prescribes.
"""
from __future__ import annotations

from transformers import TrainerCallback

from ..config import LambdaGELUConfig
from ..schedule import HardeningSchedule, _check_callback_arguments

__all__ = ["HardeningCallback"]


class HardeningCallback(TrainerCallback):
    """Learn λ until ``switch_at`` of training, then freeze it and anneal it to λ_target(``epsilon``).
    Unset arguments come from ``config`` (default :data:`lambda_gelu.DEFAULTS`). ``switch_at="auto"``
    needs ``probe=``, a fixed batch as the model takes it; ``freeze=False`` keeps λ learning during the
    anneal (see :class:`lambda_gelu.HardeningSchedule`)."""

    def __init__(self, switch_at: float | str | None = None, epsilon: float | None = None,
                 config: LambdaGELUConfig | None = None, probe=None, freeze: bool = True):
        _check_callback_arguments(switch_at, epsilon, config, probe)
        self.switch_at, self.epsilon, self.config = switch_at, epsilon, config
        self.probe, self.freeze = probe, freeze
        self.schedule: HardeningSchedule | None = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.schedule = HardeningSchedule(model, total_steps=state.max_steps, switch_at=self.switch_at,
                                          epsilon=self.epsilon, config=self.config, probe=self.probe,
                                          freeze=self.freeze)
        self.schedule.step(state.global_step)  # 0, or the step of the checkpoint being resumed

    def on_step_end(self, args, state, control, **kwargs):
        self.schedule.step(state.global_step)
