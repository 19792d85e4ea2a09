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

``ReluizeTrainer`` converts a *pretrained* model instead (:class:`lambda_gelu.reluize.Reluizer`'s steps: the
swap or the anneal, distilling from a frozen copy of the original), so that ``accelerate launch`` / ``torchrun``
carry the conversion over DDP or FSDP like any Trainer run:

    trainer = ReluizeTrainer(model=model, args=args, train_dataset=texts,   # tokenized; no labels needed
                             reluize=ReluizeConfig(schedule="swap"))
    trainer.train()                                          # exact ReLU at the end; configs name ReLU
    model.save_pretrained("relu")
"""
from __future__ import annotations

from transformers import Trainer, TrainerCallback

from ..core.config import LambdaGELUConfig
from ..core.schedule import HardeningSchedule, _check_callback_arguments
from ..reluize import ReluizeConfig, Reluizer

__all__ = ["HardeningCallback", "ReluizeTrainer"]


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


class ReluizeTrainer(Trainer):
    """A ``transformers.Trainer`` whose steps are :class:`~lambda_gelu.reluize.Reluizer`'s: the model's GELU/SiLU
    gates become ReLU (``reluize.schedule``: at once, or annealed over ``reluize.anneal`` of the steps) while it
    distils from ``teacher`` (default: a frozen copy of the model taken when training starts), with the sparsity
    penalty if ``reluize.sparsity``. The loss is the distillation loss (labels in the batches are not used); the
    model trains in eval mode, as :func:`~lambda_gelu.reluize.reluize` does (no dropout). The Trainer's own
    ``learning_rate``, schedule and optimizer apply (``reluize.lr`` and ``lr_schedule`` do not; with
    ``reluize.gate_zeros`` the shift wants a higher rate: ``reluize.learning_rate`` is the one ``reluize`` would
    use); ``loss`` is a loss's name or a ``loss(student_output, teacher_output, batch)`` callable, as for
    ``reluize``. When training
    ends, every gate is an exact ``nn.ReLU``; a run resumed from a checkpoint (with ``teacher=`` the original)
    goes on at its step's λ.

    Under DDP each rank's loss is over its share of the batch: a loss that is a mean over tokens (the logits' KL)
    averages to the whole batch's; the default losses' hidden-state term, a ratio of sums over the batch, is then
    normalised per rank instead, a slightly different loss."""

    def __init__(self, *args, reluize: ReluizeConfig | None = None, teacher=None, loss=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.reluize_config = reluize or ReluizeConfig()
        self.teacher, self.distillation_loss = teacher, loss
        self.reluizer: Reluizer | None = None
        self.loss_is_scaled_for_ga = False  # a mean over its micro-batch: the Trainer divides by the accumulation
        self.add_callback(_ReluizerSteps(self))

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        model.eval()  # the Trainer puts it in train mode each step; reluize trains without dropout
        loss = self.reluizer.loss({k: v for k, v in inputs.items() if k != "labels"}, model)
        return (loss, None) if return_outputs else loss


class _ReluizerSteps(TrainerCallback):
    def __init__(self, trainer: ReluizeTrainer):
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        t = self.trainer
        if state.global_step and t.teacher is None and t.reluizer is None:
            raise ValueError("resuming a ReluizeTrainer needs teacher=: the original model (the one loaded from the "
                             "checkpoint is already part-converted, and a copy of it would be the wrong teacher)")
        if t.reluizer is None:
            t.reluizer = Reluizer(t.model, state.max_steps, t.reluize_config, teacher=t.teacher,
                                  loss=t.distillation_loss)
        t.reluizer.load_state_dict({"step": state.global_step})  # 0, or the step of the checkpoint resumed

    def on_step_end(self, args, state, control, **kwargs):
        self.trainer.reluizer.step()

    def on_train_end(self, args, state, control, **kwargs):
        self.trainer.reluizer.finish()
