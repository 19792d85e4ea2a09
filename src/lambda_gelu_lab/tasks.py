"""The lab's tasks: a dataset, a model, and the training hyperparameters that suit them."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch.nn as nn

from . import data
from .config import ConfigError
from .models import MLP, ActFactory, ByteGPT, ResNet, ViT


@dataclass(frozen=True)
class Task:
    name: str
    description: str
    load: Callable[[str | None], data.Splits]          # data_dir → splits
    build: Callable[[data.Splits, ActFactory], nn.Module]
    defaults: dict = field(default_factory=dict)       # RunConfig fields this task sets
    # For verification: how a perturbation ε of the raw input maps to model inputs (scale), and the
    # raw domain's image in model inputs (None: unbounded).
    eps_scale: float = 1.0
    input_domain: tuple[float, float] | None = None


def _mlp(hidden):
    def build(splits: data.Splits, act: ActFactory) -> nn.Module:
        in_features = 1
        for d in splits.input_shape:
            in_features *= d
        return MLP(in_features, hidden, splits.num_classes, act)
    return build


TASKS: dict[str, Task] = {}


def register(task: Task) -> Task:
    TASKS[task.name] = task
    return task


register(Task(
    "fmnist-mlp", "MLP 784-256-256-256-10 on Fashion-MNIST (55k/5k/10k), SGD — the paper's pair",
    load=lambda data_dir: data.load_fashion_mnist(data_dir),
    build=_mlp((256, 256, 256)),
    defaults=dict(epochs=10, batch_size=128, optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=5e-4),
    eps_scale=1 / data.FASHION_MNIST_STD,  # ε is in pixel units, [0, 1]
    input_domain=((0 - data.FASHION_MNIST_MEAN) / data.FASHION_MNIST_STD, (1 - data.FASHION_MNIST_MEAN) / data.FASHION_MNIST_STD),
))
register(Task(
    "mnist1d-mlp", "MLP 40-256-256-256-10 on MNIST-1D (3.6k/0.4k/1k, generated offline), SGD; ε in units of the input's std",
    load=lambda data_dir: data.load_mnist1d(),
    build=_mlp((256, 256, 256)),
    defaults=dict(epochs=60, batch_size=64, optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=5e-4),
))
for _name, _key in (("breast-cancer-mlp", "breast_cancer"), ("wine-mlp", "wine")):
    register(Task(
        _name, f"MLP d-64-64-C on scikit-learn's {_key} (stratified 60/20/20), SGD",
        load=lambda data_dir, _key=_key: data.load_sklearn_tabular(_key),
        build=_mlp((64, 64)),
        defaults=dict(epochs=100, batch_size=32, optimizer="sgd", lr=0.01, momentum=0.9, weight_decay=5e-4),
    ))

register(Task(
    "fmnist-resnet", "CIFAR-style ResNet (BatchNorm; widths 8-16-32, one block per stage) on Fashion-MNIST, AdamW",
    load=lambda data_dir: data.load_fashion_mnist(data_dir),
    build=lambda splits, act: ResNet(1, splits.num_classes, act, widths=(8, 16, 32)),
    defaults=dict(epochs=2, batch_size=128, optimizer="adamw", lr=2e-3, weight_decay=0.05, warmup=0.05),
    eps_scale=1 / data.FASHION_MNIST_STD,
))
register(Task(
    "fmnist-vit", "ViT/DeiT-style (7×7 patches, d=64, 4 pre-norm blocks, GELU MLPs) on Fashion-MNIST, AdamW",
    load=lambda data_dir: data.load_fashion_mnist(data_dir),
    build=lambda splits, act: ViT(28, 7, 1, splits.num_classes, act),
    defaults=dict(epochs=2, batch_size=128, optimizer="adamw", lr=2e-3, weight_decay=0.05, warmup=0.1),
    eps_scale=1 / data.FASHION_MNIST_STD,
))
register(Task(
    "stdlib-gpt", "GPT-2 (transformers; bytes, 3 layers, d=96, context 64) on the Python stdlib's source; "
                  "accuracy = next-byte accuracy, loss in nats/byte (÷ ln 2 for bits/byte)",
    load=lambda data_dir: data.load_stdlib_bytes(),
    build=lambda splits, act: ByteGPT(act),
    defaults=dict(epochs=1, batch_size=32, optimizer="adamw", lr=2e-3, weight_decay=0.1, warmup=0.05),
))

GROUPS = {"tabular-mlp": ("breast-cancer-mlp", "wine-mlp")}


def resolve_tasks(names: list[str]) -> list[Task]:
    """Task names (or group names such as ``tabular-mlp``) → tasks, with one clear error for a typo."""
    out: list[Task] = []
    for name in names:
        for n in GROUPS.get(name, (name,)):
            if n not in TASKS:
                raise ConfigError(f"unknown task {name!r}; known: {', '.join(list(TASKS) + list(GROUPS))}")
            if TASKS[n] not in out:
                out.append(TASKS[n])
    return out
