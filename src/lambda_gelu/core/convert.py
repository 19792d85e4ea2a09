"""Model surgery, in place: GELU-like modules → λ-GELU, and λ-GELU → exact ReLU.

Which modules count as GELU (``GELU_LIKE``):

- ``torch.nn.GELU`` with ``approximate="none"`` (exact) or ``"tanh"``;
- Hugging Face transformers' activation modules, recognised by class name and module without
  importing transformers: exact ``GELUActivation``; the tanh family ``NewGELUActivation``,
  ``GELUTanh``, ``PytorchGELUTanh``, ``FastGELUActivation``, ``AccurateGELUActivation``;
- timm's ``GELU`` and ``GELUTanh`` (``timm.layers``, used by ConvNeXt and others), likewise by name.

λ-GELU uses the exact Φ; the tanh approximation differs from it by at most 4.7e-4 (at |x| ≈ 2.3),
so converting a tanh-GELU model changes its outputs by that much per activation. Not converted:
``QuickGELUActivation`` (x·σ(1.702x), off by up to 2e-2), clipped GELUs, and GELU applied as a
function (``F.gelu(x)`` inside some ``forward``) — there is no module to replace. Conversion reads
the source of every module class in the model and warns where a ``forward`` calls gelu that way.

Hugging Face checkpoints. A transformers model is rebuilt from its config when it loads, so a model
whose GELUs became ReLU must say so in its config, or ``save_pretrained`` writes a checkpoint that loads
as GELU with the ReLU network's weights. ``to_relu_`` (and ``reluize``) names ReLU in every activation
field of the config of each Hugging Face model inside the converted one (``hidden_act`` and
``activation_function`` as most do, DistilBERT's ``activation``, T5's ``feed_forward_proj``, the original
GPT's ``afn``, XLM's boolean ``gelu_activation``, …), then builds the model anew from that config on the
meta device and compares: where the config cannot express the converted network (some GELUs left, an
activation with no config field), it leaves the config as it was and warns; :func:`relu_config_problem`
tells beforehand.
"""
from __future__ import annotations

import contextlib
import copy
import inspect
import itertools
import re
import warnings
from collections.abc import Callable, Iterable, Iterator

import torch
import torch.nn as nn
from torch.nn.utils import parametrize

from .batches import run_batch
from .config import DEFAULTS, LambdaGELUConfig
from .keep import KeptActivation
from .module import LambdaGELU, LambdaSiLU

__all__ = ["convert_to_lambda_gelu_", "convert_to_lambda_silu_", "to_relu_", "replace_modules_", "lambda_modules",
           "is_gelu_like", "is_silu_like", "is_reluizable", "GELU_LIKE", "SILU_LIKE", "eval_mode",
           "relu_config_problem"]

GELU_LIKE = ("torch.nn.GELU", "transformers.*.GELUActivation", "transformers.*.NewGELUActivation",
             "transformers.*.GELUTanh", "transformers.*.PytorchGELUTanh",
             "transformers.*.FastGELUActivation", "transformers.*.AccurateGELUActivation",
             "timm.*.GELU", "timm.*.GELUTanh")
# SiLU gates (Llama, Mistral, Qwen, SmolLM: SwiGLU), which reluize turns into ReLU as it does GELUs
SILU_LIKE = ("torch.nn.SiLU", "transformers.*.SiLUActivation")
_GELU_NAMES: dict[str, set[str]] = {}  # package → class names
for _name in GELU_LIKE[1:]:
    _GELU_NAMES.setdefault(_name.split(".")[0], set()).add(_name.rsplit(".", 1)[1])
_SILU_NAMES = {"transformers": {"SiLUActivation"}}
# F.gelu(, functional.gelu(, a bare gelu( or gelu_new( — but not self.gelu( (a module attribute)
_FUNCTIONAL_GELU = re.compile(r"(?:\bF\.|\bfunctional\.|(?<![\w.]))gelu\w*\s*\(")

# Hugging Face config fields that name an activation: hidden_act (most models), activation_function (GPT-2,
# BART), hidden_activation (Gemma), activation (DistilBERT), feat_extract_activation (wav2vec 2.0), T5's
# dense_act_fn and feed_forward_proj ("gated-gelu"), the original GPT's afn
_ACT_FIELD = re.compile(r"act|afn|feed_forward_proj")
# the values of those fields from which transformers builds a GELU_LIKE module (not quick_gelu, gelu_10)
_GELU_VALUES = frozenset({"gelu", "gelu_new", "gelu_fast", "gelu_python", "gelu_pytorch_tanh", "gelu_python_tanh",
                          "gelu_accurate"})
_GATE_VALUES = _GELU_VALUES | {"silu", "swish"}  # ... and those from which it builds a SILU_LIKE one
# boolean fields that choose GELU when true and ReLU when false (XLM's and FlauBERT's gelu_activation, whose false
# builds ``nn.functional.relu`` as a plain attribute rather than a module)
_GELU_SWITCHES = ("gelu_activation",)

FilterFn = Callable[[nn.Module, str], bool]


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Within: every module of ``model`` in eval mode; after: each module in the mode it had before,
    whatever was switched inside. (``model.train(was_training)`` would put a frozen eval-mode
    submodule of a training model back in train mode, and its BatchNorm statistics would move.)"""
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        yield
    finally:
        for m, training in modes.items():
            m.training = training


def is_gelu_like(module: nn.Module) -> bool:
    """True for the modules listed in ``GELU_LIKE``."""
    if isinstance(module, nn.GELU):
        return True
    cls = type(module)
    return cls.__name__ in _GELU_NAMES.get(cls.__module__.split(".")[0], ())


def is_silu_like(module: nn.Module) -> bool:
    """True for the modules listed in ``SILU_LIKE`` (exactly SiLU: not a subclass with a forward of its own)."""
    if type(module) is nn.SiLU:
        return True
    cls = type(module)
    return cls.__name__ in _SILU_NAMES.get(cls.__module__.split(".")[0], ())


def is_reluizable(module: nn.Module) -> bool:
    """A gate ``reluize`` turns into an exact ReLU: GELU-like or SiLU-like."""
    return is_gelu_like(module) or is_silu_like(module)


def _plain(m: nn.Module, cls: type) -> bool:
    """``m`` is a ``cls`` computing what ``cls`` computes: a subclass with a forward of its own (e.g.
    torch.ao's quantization-aware Linear, which fake-quantizes its weight) is not."""
    return isinstance(m, cls) and type(m).forward is cls.forward


def _is_conv1d(m: nn.Module) -> bool:
    """Hugging Face's ``Conv1D`` (GPT-2): a linear layer whose weight is stored (in, out)."""
    return type(m).__name__ == "Conv1D" and type(m).__module__.startswith("transformers.") and m.weight.dim() == 2


def replacement_problem(module: nn.Module, by: str, weights: Iterable[torch.Tensor]) -> str | None:
    """Why replacing ``module`` by ``by``, a module that skips the weights of zero inputs, could change a result, or
    None: a parametrization ``by`` would not keep, forward hooks it would drop (pruning's, an observer's, ...),
    non-finite ``weights`` (a skipped zero input would turn 0·inf = NaN into 0). Said in the same words for a sparse
    linear layer, a gated FFN and a mixture's experts (:func:`lambda_gelu.inference.sparse.sparsify_`)."""
    if parametrize.is_parametrized(module):
        return f"has a parametrization (torch.nn.utils.parametrize), which {by} would not keep"
    if module._forward_hooks or module._forward_pre_hooks:
        return f"has forward hooks (pruning's, an observer's, ...), which {by} would drop"
    if not all(bool(torch.isfinite(w).all()) for w in weights):
        return "has non-finite weights: a skipped zero input would turn 0·inf = NaN into 0"
    return None


def lambda_modules(model: nn.Module) -> Iterator[tuple[str, LambdaGELU]]:
    """``(qualified name, module)`` for every ``LambdaGELU`` in ``model``, each instance once."""
    for name, m in model.named_modules():
        if isinstance(m, LambdaGELU):
            yield name, m


def replace_modules_(model: nn.Module, match: FilterFn, make: Callable[[nn.Module], nn.Module],
                     what: str = "match") -> list[str]:
    """Replace, in place, every submodule for which ``match(module, fqn)`` holds by ``make(module)``;
    returns the qualified names replaced. The surgery behind the two functions below.

    A module registered at several places is replaced by one new module, so sharing survives. Forward
    and backward hooks stay where they were in the network: they move to the new module, and their
    handles still remove them. A module whose ``forward`` was replaced on the instance (a wrapper such
    as Accelerate's hooks) is refused, before anything is replaced: the wrapper would be lost."""
    if match(model, ""):
        raise ValueError(f"the model itself is a {what}; wrap it in a container to convert it in place")
    found: list[tuple[nn.Module, str, nn.Module, str]] = []
    seen: set[int] = set()

    def visit(parent: nn.Module, prefix: str) -> None:
        for child_name, child in list(parent.named_children()):
            fqn = f"{prefix}{child_name}"
            if id(child) in seen or match(child, fqn):
                seen.add(id(child))
                found.append((parent, child_name, child, fqn))
            else:
                visit(child, fqn + ".")

    visit(model, "")
    for _, _, child, fqn in found:
        if "forward" in vars(child):
            raise ValueError(f"{fqn!r} has its forward replaced on the instance (a wrapper, e.g. Accelerate's hooks), "
                             "which replacing the module would drop; remove the wrapper before converting")
    new_for: dict[int, nn.Module] = {}
    for parent, child_name, child, _ in found:
        if id(child) not in new_for:
            new_for[id(child)] = _with_hooks_of(child, make(child))
        setattr(parent, child_name, new_for[id(child)])
    return [fqn for _, _, _, fqn in found]


_HOOKS = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks", "_forward_hooks_with_kwargs",
          "_forward_hooks_always_called", "_backward_pre_hooks", "_backward_hooks")


def _with_hooks_of(old: nn.Module, new: nn.Module) -> nn.Module:
    """``new`` with ``old``'s forward and backward hooks moved onto it: the very dictionaries move, so a
    handle that ``old.register_*_hook`` returned removes the hook from ``new``; ``old``, now out of the
    network, is left with none."""
    if any(getattr(old, attr) for attr in _HOOKS):
        for attr in _HOOKS:
            hooks = getattr(old, attr)
            setattr(new, attr, hooks)
            setattr(old, attr, type(hooks)())
        new._is_full_backward_hook, old._is_full_backward_hook = old._is_full_backward_hook, None
    return new


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


def convert_to_lambda_gelu_(model: nn.Module, config: LambdaGELUConfig | None = None,
                            filter_fn: FilterFn | None = None, device: torch.device | str | None = None,
                            example_input=None, **module_kwargs) -> list[str]:
    """Replace, in place, every GELU-like module (see ``GELU_LIKE``) by a ``LambdaGELU``.

    Args:
        config: λ₀, t and per-channel from a :class:`LambdaGELUConfig` (default
            :data:`lambda_gelu.DEFAULTS`); ``module_kwargs`` (``init_lambda=``, ``temperature=``,
            ``channel_dim=``) override single settings.
        filter_fn: ``filter_fn(module, fqn) -> bool`` chooses which modules to replace, *instead of*
            the GELU match (as torchao's ``quantize_``): it may convert other activations too.
        device: where the new λ parameters live; default: the device of the replaced module's
            nearest parent that has parameters or buffers (so a model split across devices works).
        example_input: with ``config.per_channel``, one batch (a tensor, a tuple of positional
            arguments or a dict of keyword arguments), run once to learn each layer's channel
            count along ``channel_dim``.

    Returns the qualified names replaced; raises ``ValueError`` if there was nothing to replace. The
    new λ parameters are float32 (λ needs the precision even in a bf16 model); build the optimizer
    after converting.
    """
    if filter_fn is None:
        _warn_functional_gelu(model)
    return _convert_to_lambda(model, LambdaGELU, is_gelu_like, GELU_LIKE, "GELU", config, filter_fn, device,
                              example_input, module_kwargs)


def convert_to_lambda_silu_(model: nn.Module, config: LambdaGELUConfig | None = None,
                            filter_fn: FilterFn | None = None, device: torch.device | str | None = None,
                            example_input=None, **module_kwargs) -> list[str]:
    """Replace, in place, every SiLU-like module (see ``SILU_LIKE``) by a :class:`LambdaSiLU`, x·σ(λx): the
    SwiGLU gates of Llama-family FFNs. Arguments and result as :func:`convert_to_lambda_gelu_`'s."""
    return _convert_to_lambda(model, LambdaSiLU, is_silu_like, SILU_LIKE, "SiLU", config, filter_fn, device,
                              example_input, module_kwargs)


def _convert_to_lambda(model, cls, like, names, what, config, filter_fn, device, example_input,
                       module_kwargs) -> list[str]:
    config = config or DEFAULTS
    kwargs = {"init_lambda": config.init_lambda, "temperature": config.temperature, **module_kwargs}
    cls(**kwargs)  # validate the arguments once, before touching the model
    match = filter_fn or (lambda m, fqn: like(m))
    channels = _channel_counts(model, match, example_input, kwargs.get("channel_dim", -1)) if config.per_channel else {}
    devices = _devices(model)

    def make(old: nn.Module) -> nn.Module:
        extra = {"num_channels": channels[id(old)]} if config.per_channel else {}
        return cls(**kwargs, **extra).to(device if device is not None else devices[id(old)])

    replaced = replace_modules_(model, match, make, what)
    if not replaced:
        raise ValueError(f"convert_to_lambda_{what.lower()}_ found no " + (
            "module that filter_fn accepts" if filter_fn else f"{what} module to replace (looked for: "
            + ", ".join(names) + ")"))
    return replaced


def _devices(model: nn.Module) -> dict[int, torch.device]:
    """Each submodule (by id) → a device: that of its own tensors, else of the sibling before it
    (a GELU follows the Linear that feeds it), else of the sibling after it, else its parent's."""
    out: dict[int, torch.device] = {}

    def own(m: nn.Module):
        t = next(m.parameters(), None)
        t = t if t is not None else next(m.buffers(), None)
        return None if t is None else t.device

    def visit(m: nn.Module, here: torch.device) -> None:
        out.setdefault(id(m), here)
        children = list(m.children())
        devices = [own(c) for c in children]
        for i, child in enumerate(children):
            before = next((d for d in reversed(devices[:i]) if d is not None), None)
            after = next((d for d in devices[i + 1:] if d is not None), None)
            visit(child, devices[i] or before or after or here)

    visit(model, own(model) or torch.device("cpu"))
    return out


def _channel_counts(model: nn.Module, match: FilterFn, example_input, channel_dim: int) -> dict[int, int]:
    """Run ``example_input`` through ``model`` once; the size of each matched module's input along ``channel_dim``."""
    if example_input is None:
        raise ValueError("per-channel conversion needs example_input= (one batch) to learn each layer's "
                         "channel count")
    found, handles = {}, []

    def record(mod, args):
        found.setdefault(id(mod), args[0].shape[channel_dim])  # returns None: the input is left alone

    for fqn, m in model.named_modules():
        if fqn and match(m, fqn):
            handles.append(m.register_forward_pre_hook(record))
    try:
        with torch.no_grad():
            run_batch(model, example_input)
    finally:
        for h in handles:
            h.remove()
    return found


def to_relu_(model: nn.Module, filter_fn: FilterFn | None = None, include_gelu: bool = False) -> list[str]:
    """Replace, in place, every ``LambdaGELU`` by an exact ``nn.ReLU``; returns the names replaced.

    With ``include_gelu=True`` GELU-like and SiLU-like modules are swapped too — the "direct swap" baseline
    that ReLU-izes a GELU (or SiLU) network without any hardening. The config of every Hugging Face model in ``model``
    then names ReLU, so that ``save_pretrained`` writes a checkpoint that loads as the ReLU network (or,
    where the config cannot say it, is left as it was, with a warning; see the module's docstring).
    """
    def is_target(m: nn.Module) -> bool:
        return isinstance(m, LambdaGELU) or (include_gelu and is_reluizable(m))

    match = (lambda m, fqn: is_target(m) and filter_fn(m, fqn)) if filter_fn else (lambda m, fqn: is_target(m))
    replaced = replace_modules_(model, match, lambda old: nn.ReLU(), "λ-GELU")
    if not replaced:
        looked_for = "LambdaGELU" + (", " + ", ".join(GELU_LIKE + SILU_LIKE) if include_gelu else "")
        raise ValueError(f"to_relu_ found nothing to replace (looked for: {looked_for})")
    _name_relu_in_configs_(model)
    return replaced


def _hugging_face_models(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The outermost Hugging Face models in ``model``, itself included: modules with a ``config`` whose class
    names a ``config_class``, as transformers' ``PreTrainedModel`` does (one nested in another, as GPT-2's
    ``transformer`` in its LM head model, shares its config and is left to the outer one)."""
    found: list[tuple[str, nn.Module]] = []
    for name, m in model.named_modules():
        if any(outer == "" or name.startswith(outer + ".") for outer, _ in found):
            continue
        if getattr(type(m), "config_class", None) is not None and hasattr(m, "config"):
            found.append((name, m))
    return found


def _relu_fields(config, prefix: str = "") -> dict[str, str | bool]:
    """The activation fields of a Hugging Face config that name a GELU-like activation, each with the ReLU value
    to put there; a field of a config inside it (T5Gemma's ``encoder`` and ``decoder``, a multimodal model's
    ``text_config`` and ``vision_config``) by its dotted path, ``encoder.hidden_activation``."""
    out = {}
    for name, written in config.to_dict().items():
        value = vars(config).get(name, written)  # not getattr: a field that varies by layer (Gemma 4's) raises
        if callable(getattr(value, "to_dict", None)) and hasattr(value, "model_type"):  # a config inside this one
            out.update(_relu_fields(value, f"{prefix}{name}."))
        elif name in _GELU_SWITCHES and value is True:
            out[prefix + name] = False
        elif _ACT_FIELD.search(name) and isinstance(value, str):
            gated = value.lower().startswith("gated-")
            if value.lower().removeprefix("gated-") in _GATE_VALUES:
                out[prefix + name] = "gated-relu" if gated else "relu"
    return out


def _field(config, path: str):
    """The value at a :func:`_relu_fields` path of ``config``."""
    for name in path.split("."):
        config = getattr(config, name)
    return config


def _set_field(config, path: str, value) -> None:
    owner, _, name = path.rpartition(".")
    setattr(_field(config, owner) if owner else config, name, value)


def rebuilt_from_config(hf: nn.Module, fields: dict) -> nn.Module | str:
    """``hf``'s class built on the meta device from its config with ``fields`` set, as loading a saved checkpoint
    rebuilds it (the config read back from what saving writes, so that a config which overrides a field as it loads,
    as Step-3.7's forces ``hidden_act`` to SiLU, is seen to); or why it cannot be (what the class needs beyond its
    config)."""
    config = copy.deepcopy(hf.config)
    for name, value in fields.items():
        _set_field(config, name, value)
    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return type(hf)(type(config).from_dict(config.to_dict()))
    except Exception as e:  # noqa: BLE001 - whatever the class needs beyond its config, the check cannot run
        return f"{type(hf).__name__} cannot be built from its config alone to check it ({type(e).__name__}: {e})"


def _mismatch(hf: nn.Module, fields: dict[str, str | bool], becomes_relu: FilterFn,
              with_kept: bool = True) -> str | None:
    """Where ``hf`` rebuilt from its config with ``fields`` set (as loading a saved checkpoint rebuilds it)
    would differ in an activation from ``hf`` once the modules ``becomes_relu`` accepts are ``nn.ReLU``;
    None where it would not. ``with_kept=False``: not where a module left out of the conversion would."""
    rebuilt = rebuilt_from_config(hf, fields)
    if isinstance(rebuilt, str):
        return rebuilt
    built = dict(rebuilt.named_modules())
    for name, m in hf.named_modules():
        kept = isinstance(m, KeptActivation)  # left out of the conversion: it stays as it is
        if kept and not with_kept:
            continue
        m = m.kept_module if kept else m
        relu = (not kept and becomes_relu(m, name)) or isinstance(m, nn.ReLU)
        b = built.get(name)
        if not (relu or is_reluizable(m) or isinstance(m, LambdaGELU) or is_reluizable(b) or isinstance(b, nn.ReLU)):
            continue
        expected = nn.ReLU if relu else type(m)
        if type(b) is not expected and not (relu and b is None and _relu_function_at(rebuilt, name)):
            fields = _relu_fields(hf.config)
            field = ", ".join(f"{k}={_field(hf.config, k)!r}" for k in fields) or "none"
            gate = "GELU or SiLU" if any(str(_field(hf.config, k)).lower() in ("silu", "swish") for k in fields) \
                else "GELU"
            return (f"at '{name or '<root>'}' the converted network has {expected.__name__} but its config (activation "
                    f"fields naming {gate}: {field}) builds {type(b).__name__ if b is not None else 'no module'} there")
    return None


def _relu_function_at(model: nn.Module, name: str) -> bool:
    """Whether ``model`` holds ReLU as a plain function where ``name`` would be a module (XLM's ``self.act =
    nn.functional.relu``): the same arithmetic as an ``nn.ReLU`` there."""
    parent, _, attr = name.rpartition(".")
    try:
        return getattr(model.get_submodule(parent), attr, None) in (torch.nn.functional.relu, torch.relu)
    except AttributeError:
        return False


def _fitting_fields(hf: nn.Module, becomes_relu: FilterFn) -> tuple[dict, str | None]:
    """The activation fields of ``hf``'s config to set to ReLU so that it rebuilds ``hf`` as it is once the modules
    ``becomes_relu`` accepts are ReLU: all of them, or else the most of them that do (a multimodal model whose
    vision tower a conversion left out: its ``text_config``'s field, not its ``vision_config``'s); with None, or with
    why none does: where a module left out differs under the fewest fields that build every converted module as
    ReLU (it shares one with them, as Idefics2's projector with its text model), else where a converted module
    differs under them all (no field builds it, as Aria's experts)."""
    fields = _relu_fields(hf.config)
    problem = _mismatch(hf, fields, becomes_relu)
    if problem is None or len(fields) > 6:
        return fields, problem
    subsets = [{name: fields[name] for name in names} for size in range(len(fields) - 1, -1, -1)
               for names in itertools.combinations(fields, size)]  # down to none: a config naming ReLU where it is
    fitting = next((some for some in subsets if _mismatch(hf, some, becomes_relu) is None), None)
    if fitting is not None:
        return fitting, None
    for some in [*reversed(subsets), fields]:  # the fewest fields first
        converted = _mismatch(hf, some, becomes_relu, with_kept=False)
        if converted is None:
            return fields, _mismatch(hf, some, becomes_relu)
    return fields, converted  # every field set: where a converted module still differs


def relu_config_problem(model: nn.Module, becomes_relu: FilterFn | None = None) -> str | None:
    """Why a Hugging Face model inside ``model`` (or ``model`` itself), once the modules ``becomes_relu``
    accepts (default: every GELU-like one) are exact ReLU, could not be saved with ``save_pretrained`` as a
    checkpoint that loads as that network: its config cannot name ReLU where it now is, or still builds GELU
    elsewhere. None if it could, or if ``model`` holds no Hugging Face model. Builds each on the meta device."""
    match = becomes_relu or (lambda m, fqn: is_reluizable(m))
    for prefix, hf in _hugging_face_models(model):
        outer = f"{prefix}." if prefix else ""
        _, problem = _fitting_fields(hf, lambda m, fqn: match(m, outer + fqn))
        if problem is not None:
            return f"{prefix}: {problem}" if prefix else problem
    return None


def _name_relu_in_configs_(model: nn.Module, warn: bool = True) -> None:
    """Name ReLU in the config of every Hugging Face model inside the converted ``model``, where the config
    so changed builds the network as it now is; leave the config as it was, and warn, where it does not."""
    for prefix, hf in _hugging_face_models(model):
        fields, problem = _fitting_fields(hf, lambda m, fqn: False)
        if problem is None:
            for name, value in fields.items():
                _set_field(hf.config, name, value)
        elif warn:
            warnings.warn(f"{prefix + ': ' if prefix else ''}{problem}: its config is left as it was, and "
                          "save_pretrained would write a checkpoint that does not load as this network", stacklevel=3)
