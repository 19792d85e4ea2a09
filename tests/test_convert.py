import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from lambda_gelu import LambdaGELU, convert_to_lambda_gelu_, is_gelu_like, lambda_modules, to_relu_


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 8), nn.GELU(approximate="tanh"), nn.Linear(8, 2))


def test_convert_replaces_both_gelu_modes_and_keeps_outputs_at_lambda_one():
    model = _mlp()
    x = torch.randn(16, 4)
    exact = nn.Sequential(*[m if not isinstance(m, nn.GELU) else nn.GELU() for m in model])(x)
    names = convert_to_lambda_gelu_(model, init_lambda=1.0)
    assert names == ["1", "3"]
    assert [n for n, _ in lambda_modules(model)] == ["1", "3"]
    assert torch.equal(model(x), exact)  # λ = 1 is the exact GELU, bit for bit


def test_converting_tanh_gelu_changes_each_activation_by_at_most_4_7e_4():
    """The tanh form becomes the exact Φ at λ = 1: each converted activation moves by at most the
    documented bound (and by more than nothing, or the test would not be looking at the tanh form)."""
    x = torch.linspace(-10, 10, 200001)
    original = nn.GELU(approximate="tanh")
    model = nn.Sequential(original)
    convert_to_lambda_gelu_(model, init_lambda=1.0)
    gap = (model(x).double() - original(x).double()).abs().max().item()
    assert 4.0e-4 < gap <= 4.75e-4


def test_filter_fn_sees_module_and_name():
    model = _mlp()
    seen = []
    names = convert_to_lambda_gelu_(model, filter_fn=lambda m, fqn: seen.append((type(m), fqn)) or fqn == "3")
    assert names == ["3"] and isinstance(model[1], nn.GELU) and isinstance(model[3], LambdaGELU)
    assert (nn.GELU, "1") in seen


def test_shared_module_stays_shared():
    act = nn.GELU()
    model = nn.ModuleDict({"a": act, "b": nn.Sequential(act)})
    names = convert_to_lambda_gelu_(model)
    assert sorted(names) == ["a", "b.0"] and model["a"] is model["b"][0]
    assert len(list(lambda_modules(model))) == 1


def test_hugging_face_activation_classes_are_recognised():
    activations = pytest.importorskip("transformers.activations")
    for name in ("GELUActivation", "NewGELUActivation", "GELUTanh", "PytorchGELUTanh",
                 "FastGELUActivation", "AccurateGELUActivation"):
        assert is_gelu_like(getattr(activations, name)()), name
    assert not is_gelu_like(activations.QuickGELUActivation())  # x·σ(1.702x): not a Φ gate
    assert not is_gelu_like(activations.ClippedGELUActivation(-10, 10))  # clipped: not GELU beyond the clip

    class GELUActivation(nn.Module):  # a user's own class that only shares the name
        def forward(self, x):
            return torch.tanh(x)
    assert not is_gelu_like(GELUActivation())
    model = nn.Sequential(nn.Linear(4, 4), activations.NewGELUActivation(), nn.Linear(4, 4), activations.GELUActivation())
    assert convert_to_lambda_gelu_(model) == ["1", "3"]


def test_nothing_to_convert_names_what_was_looked_for():
    with pytest.raises(ValueError, match="found no GELU module.*torch.nn.GELU.*NewGELUActivation"):
        convert_to_lambda_gelu_(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
    with pytest.raises(ValueError, match="to_relu_ found nothing to replace \\(looked for: LambdaGELU\\)"):
        to_relu_(_mlp())
    with pytest.raises(ValueError, match="init_lambda"):
        convert_to_lambda_gelu_(_mlp(), init_lambda=0.5)
    with pytest.raises(ValueError, match="the model itself"):
        convert_to_lambda_gelu_(nn.GELU())


class _FunctionalGELUBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.GELU()

    def forward(self, x):
        return F.gelu(self.fc(self.act(x)))


def test_functional_gelu_is_reported():
    model = nn.Sequential(_FunctionalGELUBlock())
    with pytest.warns(UserWarning, match="_FunctionalGELUBlock.forward .* seems to apply gelu as a function"):
        names = convert_to_lambda_gelu_(model)
    assert names == ["0.act"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        convert_to_lambda_gelu_(_mlp())  # nothing functional there: no warning


def test_to_relu_is_exact_relu_and_direct_swap():
    model = _mlp()
    convert_to_lambda_gelu_(model, init_lambda=3.0)
    assert to_relu_(model) == ["1", "3"]
    assert all(type(model[i]) is nn.ReLU for i in (1, 3))
    gelu_model = _mlp()
    assert to_relu_(gelu_model, include_gelu=True) == ["1", "3"]
    assert all(type(gelu_model[i]) is nn.ReLU for i in (1, 3))


def test_high_lambda_approaches_the_relu_model():
    model = _mlp()
    convert_to_lambda_gelu_(model)
    for _, m in lambda_modules(model):
        m.set_lambda(1e5)
    x = torch.randn(256, 4)
    y = model(x)
    to_relu_(model)
    assert (y - model(x)).abs().max() < 1e-4
