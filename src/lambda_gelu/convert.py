"""Model surgery, in place: GELU-like modules → λ-GELU, and λ-GELU → exact ReLU.

Which modules count as GELU (``GELU_LIKE``):

- ``torch.nn.GELU`` with ``approximate="none"`` (exact) or ``"tanh"``;
- Hugging Face transformers' activation modules, recognised by class name and module without
  importing transformers: exact ``GELUActivation``; the tanh family ``NewGELUActivation``,
  ``GELUTanh``, ``PytorchGELUTanh``, ``FastGELUActivation``, ``AccurateGELUActivation``.

λ-GELU uses the exact Φ; the tanh approximation differs from it by at most 4.7e-4 (at |x| ≈ 2.3),
so converting a tanh-GELU model changes its outputs by that much per activation. Not converted:
``QuickGELUActivation`` (x·σ(1.702x), off by up to 2e-2), clipped GELUs, and GELU applied as a
function (``F.gelu(x)`` inside some ``forward``) — there is no module to replace. Conversion reads
the source of every module class in the model and warns where a ``forward`` calls gelu that way.
"""
from __future__ import annotations

import inspect
import re
import warnings
from collections.abc import Callable, Iterator

import torch.nn as nn

from .module import LambdaGELU

__all__ = ["convert_to_lambda_gelu_", "to_relu_", "replace_modules_", "lambda_modules", "is_gelu_like", "GELU_LIKE"]

GELU_LIKE = ("torch.nn.GELU", "transformers.*.GELUActivation", "transformers.*.NewGELUActivation",
             "transformers.*.GELUTanh", "transformers.*.PytorchGELUTanh",
             "transformers.*.FastGELUActivation", "transformers.*.AccurateGELUActivation")
_HF_GELU_NAMES = {name.rsplit(".", 1)[1] for name in GELU_LIKE if name.startswith("transformers")}
# F.gelu(, functional.gelu(, a bare gelu( or gelu_new( — but not self.gelu( (a module attribute)
_FUNCTIONAL_GELU = re.compile(r"(?:\bF\.|\bfunctional\.|(?<![\w.]))gelu\w*\s*\(")

FilterFn = Callable[[nn.Module, str], bool]


def is_gelu_like(module: nn.Module) -> bool:
    """True for the modules listed in ``GELU_LIKE``."""
    if isinstance(module, nn.GELU):
        return True
    cls = type(module)
    return cls.__name__ in _HF_GELU_NAMES and cls.__module__.split(".")[0] == "transformers"


def lambda_modules(model: nn.Module) -> Iterator[tuple[str, LambdaGELU]]:
    """``(qualified name, module)`` for every ``LambdaGELU`` in ``model``, each instance once."""
    for name, m in model.named_modules():
        if isinstance(m, LambdaGELU):
            yield name, m


def replace_modules_(model: nn.Module, match: FilterFn, make: Callable[[nn.Module], nn.Module],
                     what: str = "match") -> list[str]:
    """Replace, in place, every submodule for which ``match(module, fqn)`` holds by ``make(module)``;
    returns the qualified names replaced. The surgery behind the two functions below.

    A module registered at several places is replaced by one new module, so sharing survives."""
    if match(model, ""):
        raise ValueError(f"the model itself is a {what}; wrap it in a container to convert it in place")
    replaced: list[str] = []
    new_for: dict[int, nn.Module] = {}

    def visit(parent: nn.Module, prefix: str) -> None:
        for child_name, child in list(parent.named_children()):
            fqn = f"{prefix}{child_name}"
            if id(child) in new_for or match(child, fqn):
                if id(child) not in new_for:
                    new_for[id(child)] = make(child)
                setattr(parent, child_name, new_for[id(child)])
                replaced.append(fqn)
            else:
                visit(child, fqn + ".")

    visit(model, "")
    return replaced


def _warn_functional_gelu(model: nn.Module) -> None:
    seen: set[type] = set()
    for name, m in model.named_modules():
        cls = type(m)
        if cls in seen or is_gelu_like(m) or isinstance(m, LambdaGELU) or cls.__module__.startswith("torch."):
            continue
        seen.add(cls)
        try:
            source = inspect.getsource(cls.forward)
        except (OSError, TypeError):
            continue
        if _FUNCTIONAL_GELU.search(source):
            warnings.warn(f"{cls.__qualname__}.forward (e.g. at '{name or '<root>'}') seems to apply gelu as a "
                          "function; such calls stay GELU after conversion — make them modules to convert them",
                          stacklevel=3)


def convert_to_lambda_gelu_(model: nn.Module, filter_fn: FilterFn | None = None, **module_kwargs) -> list[str]:
    """Replace, in place, every GELU-like module (see ``GELU_LIKE``) by ``LambdaGELU(**module_kwargs)``.

    ``filter_fn(module, fqn)`` may narrow the choice. Returns the qualified names replaced; raises
    ``ValueError`` if there was nothing to replace. The new λ parameters are float32 on the model's
    device (λ needs the precision even in a bf16 model); build the optimizer after converting.
    """
    LambdaGELU(**module_kwargs)  # validate the arguments once, before touching the model
    match = (lambda m, fqn: is_gelu_like(m) and filter_fn(m, fqn)) if filter_fn else (lambda m, fqn: is_gelu_like(m))
    _warn_functional_gelu(model)
    replaced = replace_modules_(model, match, lambda old: LambdaGELU(**module_kwargs).to(_device_of(model)), "GELU")
    if not replaced:
        raise ValueError("convert_to_lambda_gelu_ found no GELU module to replace (looked for: "
                         + ", ".join(GELU_LIKE) + ("; filter_fn rejected all" if filter_fn else "") + ")")
    return replaced


def to_relu_(model: nn.Module, filter_fn: FilterFn | None = None, include_gelu: bool = False) -> list[str]:
    """Replace, in place, every ``LambdaGELU`` by an exact ``nn.ReLU``; returns the names replaced.

    With ``include_gelu=True`` GELU-like modules are swapped too — the "direct swap" baseline that
    ReLU-izes a GELU network without any hardening.
    """
    def is_target(m: nn.Module) -> bool:
        return isinstance(m, LambdaGELU) or (include_gelu and is_gelu_like(m))

    match = (lambda m, fqn: is_target(m) and filter_fn(m, fqn)) if filter_fn else (lambda m, fqn: is_target(m))
    replaced = replace_modules_(model, match, lambda old: nn.ReLU(), "λ-GELU")
    if not replaced:
        looked_for = "LambdaGELU" + (", " + ", ".join(GELU_LIKE) if include_gelu else "")
        raise ValueError(f"to_relu_ found nothing to replace (looked for: {looked_for})")
    return replaced


def _device_of(model: nn.Module):
    p = next(model.parameters(), None)
    return p.device if p is not None else "cpu"
