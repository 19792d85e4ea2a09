"""The protocol's arms, each described once: every list the lab needs (the default sweep, the λ-GELU arms, the
hardened ones, the post-hoc conversions and their reluize settings, the report's labels) is derived from here."""
from __future__ import annotations

from dataclasses import dataclass

from lambda_gelu.reluize import ReluizeConfig

# Which λ/hardening settings matter to which arm. Fields not listed for an arm do not enter its hash,
# so e.g. the GELU baseline is computed once and shared by every switch-point ablation.
LAMBDA_FIELDS = ("init_lambda", "temperature", "multiplier")
HARDEN_FIELDS = LAMBDA_FIELDS + ("switch_at", "epsilon")
SPARSE_FIELDS = HARDEN_FIELDS + ("sparsity",)
POSTHOC_FIELDS = ("epsilon", "posthoc_budget", "posthoc_lr", "posthoc_recalibrate")

# The lab's post-hoc recipe: its small networks take a larger rate than reluize's default, held constant (the stored
# runs' recipe); RunConfig's posthoc_lr and posthoc_recalibrate default to these and override them per run.
LAB_POSTHOC = ReluizeConfig(lr=1e-3, lr_schedule="constant", recalibrate=0)


@dataclass(frozen=True)
class Arm:
    name: str
    label: str                        # how the report names it
    activation: str                   # what the network trains with: gelu, lambda, swish, relu, prelu
    fields: tuple[str, ...] = ()      # the RunConfig fields it owns (they enter its hash and its variant label)
    hardened: bool = False            # annealed to ReLU during training by a HardeningSchedule
    posthoc: ReluizeConfig | None = None  # converted after training by reluize with this recipe
    default: bool = False             # in the default sweep

    @property
    def learns_lambda(self) -> bool:
        return self.activation == "lambda"

    @property
    def learned_profile(self) -> str | None:
        """The metric holding the λ profile it learned before any anneal (λ-GELU arms only)."""
        if not self.learns_lambda:
            return None
        return "lambda_end" if not self.hardened else "lambda_switch"

    @property
    def stored_as_relu(self) -> bool:
        """Its stored weights are those of the network after its conversion to ReLU."""
        return self.posthoc is not None or self.name == "gelu-finetune"


def _posthoc(schedule: str) -> ReluizeConfig:
    return LAB_POSTHOC.replace(schedule=schedule)


ARMS: dict[str, Arm] = {a.name: a for a in (
    Arm("gelu", "GELU (→ direct swap to ReLU)", "gelu", default=True),
    Arm("lambda", "λ-GELU, learned (→ ReLU)", "lambda", LAMBDA_FIELDS, default=True),
    Arm("lambda-harden", "λ-GELU, annealed (→ ReLU)", "lambda", HARDEN_FIELDS, hardened=True, default=True),
    # lambda-harden plus an L1 penalty on the activations rising from switch_at (SparsityRegularizer)
    Arm("lambda-harden-sparse", "λ-GELU, annealed with the L1 activation penalty (→ ReLU)", "lambda", SPARSE_FIELDS,
        hardened=True),
    # the freeze ablation: λ keeps learning during the anneal, (1 − a)·λ(s) + a·λ_target (freeze=False)
    Arm("lambda-harden-learn", "λ-GELU, annealed while λ keeps learning (→ ReLU)", "lambda", HARDEN_FIELDS,
        hardened=True),
    # post-hoc conversion of the trained GELU network (the gelu arm's, same seed) with lambda_gelu.reluize,
    # distilling from it for posthoc_budget × its training steps: annealed, swapped at once, or block by block
    Arm("reluize-anneal", "GELU, then post-hoc: annealed distillation (→ ReLU)", "gelu", POSTHOC_FIELDS,
        posthoc=_posthoc("anneal")),
    Arm("reluize-swap", "GELU, then post-hoc: swap + distillation (→ ReLU)", "gelu", POSTHOC_FIELDS,
        posthoc=_posthoc("swap")),
    Arm("reluize-blockwise", "GELU, then post-hoc: block-by-block reconstruction (→ ReLU)", "gelu", POSTHOC_FIELDS,
        posthoc=_posthoc("blockwise")),
    Arm("relu", "ReLU from scratch", "relu", default=True),
    # baselines the paper did not run, all ending as exact-ReLU networks
    Arm("prelu", "PReLU (→ ReLU)", "prelu"),  # then its slopes set to 0, i.e. ReLU
    Arm("swish-harden", "learnable-β Swish, annealed (→ ReLU)", "swish", HARDEN_FIELDS, hardened=True),
    Arm("gelu-finetune", "GELU → swap at switch → ReLU fine-tune", "gelu", ("switch_at",)),
)}

DEFAULT_ARMS = tuple(a.name for a in ARMS.values() if a.default)
LAMBDA_ARMS = tuple(a.name for a in ARMS.values() if a.learns_lambda)  # λ-GELU networks
ARM_FIELDS = tuple(dict.fromkeys(f for a in ARMS.values() for f in a.fields))  # fields some arm owns
