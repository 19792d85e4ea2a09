"""Train one arm of one task for one seed, evaluate it, ReLU-ize it, evaluate again."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

import lambda_gelu as lg
from lambda_gelu.core.convert import eval_mode
from lambda_gelu.inference.sparse import activation_sparsity

from .arms import ARMS
from .baselines import LearnableSwish, swish_init, swish_target
from .config import RunConfig
from .data import Splits
from .tasks import Task

LAMBDA_POINTS = 100  # λ is logged about this many times per run
# lambda-harden-sparse: the penalty's factor rises from the switch point to its peak (cfg.sparsity) at 90% of
# training, in three sine-shaped stages, and stays there for the last 10%
SPARSITY_END, SPARSITY_STAGES = 0.9, 3


def probe_batch(x_train: torch.Tensor, batch_size: int, total_steps: int) -> torch.Tensor:
    """The fixed examples whose sign patterns choose switch_at="auto": the first n of the training set,
    n as large as keeps the checks near 1% of training time (a check is one forward pass, about a third
    of a step per batch, every 2% of training), between 8 and 256."""
    every = lg.AutoSwitch().check_interval(total_steps)
    return x_train[:min(256, max(8, int(0.03 * batch_size * every)))]


@dataclass
class RunResult:
    metrics: dict                      # final numbers, before and after substitution
    lambdas: list[tuple[int, str, float]] = field(default_factory=list)  # (step, layer, λ)
    epochs: list[dict] = field(default_factory=list)                     # per-epoch curve
    state_dict: dict | None = None     # trained weights, before substitution


def activation_factory(cfg: RunConfig):
    activation = ARMS[cfg.arm].activation
    if activation == "lambda":
        return lambda: lg.LambdaGELU(init_lambda=cfg.init_lambda, temperature=cfg.temperature)
    if activation == "swish":
        return lambda: LearnableSwish(init_lambda=swish_init(cfg.init_lambda), temperature=cfg.temperature)
    return {"gelu": nn.GELU, "relu": nn.ReLU, "prelu": nn.PReLU}[activation]


def relu_ize_(model: nn.Module) -> list[str]:
    """Every GELU-like, λ-GELU (Swish included) or PReLU module → exact ReLU; [] if there is none."""
    return lg.replace_modules_(model, lambda m, fqn: isinstance(m, (lg.LambdaGELU, nn.PReLU)) or lg.is_gelu_like(m),
                               lambda m: nn.ReLU(), "activation")


def build_model(task: Task, splits: Splits, cfg: RunConfig) -> nn.Module:
    torch.manual_seed(cfg.seed)  # same weights for every arm of a seed: activations draw no random numbers
    return task.build(splits, activation_factory(cfg))


def make_optimizer(model: nn.Module, cfg: RunConfig) -> torch.optim.Optimizer:
    if any(True for _ in lg.lambda_modules(model)):
        groups = lg.lambda_param_groups(model, cfg.lr, cfg.weight_decay, cfg.multiplier)
    else:
        groups = [{"params": list(model.parameters()), "lr": cfg.lr, "weight_decay": cfg.weight_decay}]
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups, momentum=cfg.momentum)
    return torch.optim.AdamW(groups)


def lr_lambda(total_steps: int, warmup: float):
    """Linear warm-up over ``warmup``·total steps, then cosine decay to 0."""
    w = int(warmup * total_steps)

    def f(step: int) -> float:
        if step < w:
            return (step + 1) / w
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - w) / max(1, total_steps - w))))
    return f


def loss_fn(logits: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy for one label per example or one per position (language models)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction=reduction)


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 512) -> tuple[float, float]:
    """(accuracy, mean cross-entropy per label) in eval mode."""
    correct, loss = 0, 0.0
    with eval_mode(model):
        for i in range(0, len(x), batch_size):
            logits = model(x[i:i + batch_size])
            loss += loss_fn(logits, y[i:i + batch_size], reduction="sum").item()
            correct += (logits.argmax(-1) == y[i:i + batch_size]).sum().item()
    return correct / y.numel(), loss / y.numel()


def zero_fraction(model: nn.Module, x: torch.Tensor, batch_size: int = 512) -> float | None:
    """The fraction of exact zeros among all ReLU outputs of the ReLU network ``model`` on ``x``; None
    if it has no nn.ReLU."""
    try:
        stats = activation_sparsity(model, x.split(batch_size)).values()
    except ValueError:
        return None
    return sum(s["zero_fraction"] * s["outputs"] for s in stats) / sum(s["outputs"] for s in stats)


def logit_kl(student: torch.Tensor, teacher: torch.Tensor, batch=None) -> torch.Tensor:
    """KL(teacher ‖ student) of the output distributions, per example (or position)."""
    s, t = student.reshape(-1, student.shape[-1]), teacher.reshape(-1, teacher.shape[-1])
    return F.kl_div(F.log_softmax(s, -1), F.log_softmax(t, -1), log_target=True, reduction="batchmean")


def convert_posthoc(model: nn.Module, cfg: RunConfig, x_train: torch.Tensor, total: int,
                    gen: torch.Generator) -> lg.ReluizeResult:
    """The trained GELU ``model`` → exact ReLU in place, with lambda_gelu.reluize: distillation (KL of the
    outputs; for blockwise, each block's reconstruction) from its frozen copy over training inputs (no
    labels), for posthoc_budget × ``total`` steps at the constant rate posthoc_lr (the stored runs' recipe, not
    reluize's falling default); re-estimating BatchNorm (posthoc_recalibrate batches, forward
    passes only) costs a third of a step per batch, taken from them."""
    def batches():
        while True:
            perm = torch.randperm(len(x_train), generator=gen)
            for i in range(0, len(x_train), cfg.batch_size):
                yield x_train[perm[i:i + cfg.batch_size]]

    steps = max(1, math.ceil(cfg.posthoc_budget * total) - math.ceil(cfg.posthoc_recalibrate / 3))
    recipe = cfg.reluize_config()
    return lg.reluize(model, batches(), steps, recipe, loss=None if recipe.schedule == "blockwise" else logit_kl)


def _layer_lambdas(model: nn.Module) -> dict[str, float]:
    return {name: m.lam.mean().item() for name, m in lg.lambda_modules(model)}


def train_run(task: Task, splits: Splits, cfg: RunConfig, keep_weights: bool = True) -> RunResult:
    start = time.perf_counter()
    model = build_model(task, splits, cfg)
    opt = make_optimizer(model, cfg)
    x_train, y_train = splits.x_train, splits.y_train
    if cfg.train_limit:
        x_train, y_train = x_train[:cfg.train_limit], y_train[:cfg.train_limit]
    n = len(x_train)
    steps_per_epoch = math.ceil(n / cfg.batch_size)
    total = cfg.epochs * steps_per_epoch
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(total, cfg.warmup))
    hardening = None
    if ARMS[cfg.arm].hardened:
        target = swish_target(cfg.epsilon) if cfg.arm == "swish-harden" else lg.lambda_target(cfg.epsilon)
        probe = probe_batch(x_train, cfg.batch_size, total) if cfg.switch_at == "auto" else None
        hardening = lg.HardeningSchedule(model, total, cfg.switch_at, lambda_target=target, probe=probe,
                                         freeze=cfg.arm != "lambda-harden-learn")
    swap_step = int(cfg.switch_at * total) if cfg.arm == "gelu-finetune" else None
    regularizer = (lg.SparsityRegularizer(model, total, cfg.sparsity, start=cfg.switch_at, end=SPARSITY_END,
                                          stages=SPARSITY_STAGES) if cfg.arm == "lambda-harden-sparse" else None)
    log_every = max(1, total // LAMBDA_POINTS)
    result = RunResult(metrics={})
    gen = torch.Generator().manual_seed(cfg.seed)  # the same data order for every arm of a seed

    def log_lambdas(step: int):
        result.lambdas.extend((step, name, v) for name, v in _layer_lambdas(model).items())

    log_lambdas(0)
    step, diverged = 0, False
    model.train()
    for epoch in range(cfg.epochs):
        perm = torch.randperm(n, generator=gen)
        running, seen = 0.0, 0
        for i in range(0, n, cfg.batch_size):
            if step == swap_step:  # gelu-finetune: direct swap, then ReLU trains for the rest
                m_swap = evaluate(model, splits.x_val, splits.y_val)
                relu_ize_(model)
                result.metrics["swap_val_acc_before"], result.metrics["swap_val_loss_before"] = m_swap
            idx = perm[i:i + cfg.batch_size]
            loss = loss_fn(model(x_train[idx]), y_train[idx])
            objective = loss if regularizer is None else loss + regularizer.penalty()
            opt.zero_grad(set_to_none=True)
            objective.backward()
            opt.step()
            sched.step()
            if hardening is not None:
                hardening.step()
            if regularizer is not None:
                regularizer.step()
            step += 1
            running += loss.item() * len(idx)
            seen += len(idx)
            if step % log_every == 0 or step == total:
                log_lambdas(step)
        train_loss = running / seen
        val_acc, val_loss = evaluate(model, splits.x_val, splits.y_val)
        result.epochs.append({"epoch": epoch + 1, "step": step, "train_loss": train_loss,
                              "val_acc": val_acc, "val_loss": val_loss})
        if not math.isfinite(train_loss):
            diverged = True
            break

    m = result.metrics
    m["diverged"] = diverged
    m["steps"] = step
    m["val_acc"], m["val_loss"] = evaluate(model, splits.x_val, splits.y_val)
    m["test_acc"], m["test_loss"] = evaluate(model, splits.x_test, splits.y_test)
    m["lambda_end"] = _layer_lambdas(model) or None
    m["lambda_switch"] = ({k: v.mean().item() for k, v in hardening.learned.items()}
                          if hardening is not None and hardening.learned is not None else None)
    if hardening is not None:
        m["switch_step"] = hardening.switch_step
    if cfg.arm == "lambda-harden-learn":  # where λ(s) itself went while the blend carried λ to the target
        m["lambda_learned_end"] = {name: lg.raw_to_lambda(mod.s.detach(), mod.temperature).mean().item()
                                   for name, mod in lg.lambda_modules(model)}
    # test_acc above is the GELU original's; sub_* below the converted network's
    if ARMS[cfg.arm].posthoc is not None and not diverged:
        converted = convert_posthoc(model, cfg, x_train, total, gen)
        m["posthoc_steps"] = sum(1 for e in converted.log if e["step"])  # not the step-0 entry of the swap's work
        m["posthoc_seconds"] = converted.seconds
        if converted.recalibrated:
            m["posthoc_recalibrated"] = len(converted.recalibrated)
    if keep_weights:  # the weights as trained (for the post-hoc arms: as converted; they load into GELU modules)
        result.state_dict = {k: v.detach().clone() for k, v in model.state_dict().items()}

    # Substitution: every GELU-like, λ-GELU or PReLU module becomes an exact ReLU. ReLU from scratch has
    # nothing to substitute; gelu-finetune is a ReLU network already, its "after" equals its "before".
    if cfg.arm != "relu":
        relu_ize_(model)
        m["sub_val_acc"], m["sub_val_loss"] = evaluate(model, splits.x_val, splits.y_val)
        m["sub_test_acc"], m["sub_test_loss"] = evaluate(model, splits.x_test, splits.y_test)
    m["sub_zero_fraction"] = zero_fraction(model, splits.x_test)
    m["wall_time"] = time.perf_counter() - start
    return result
