"""SparsityRegularizer: the factor's ramp, the penalty against its formula, which forwards count, modules
replaced mid-run, bad arguments, and that it does make a ReLU network sparser on real data."""
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import lambda_gelu as lg
from lambda_gelu.inference.sparse import activation_sparsity


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), lg.LambdaGELU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 2))


@pytest.mark.parametrize("stages", [1, 3])
def test_factor_rises_from_start_to_end_along_quarter_sines(stages):
    peak, start, end = 0.4, 0.2, 0.8
    f = lambda p: lg.sparsity_factor(p, peak, start, end, stages)  # noqa: E731
    assert f(0.0) == f(start) == 0.0 and f(end) == f(1.0) == peak
    grid = [i / 1000 for i in range(1001)]
    values = [f(p) for p in grid]
    assert all(b >= a for a, b in zip(values, values[1:]))  # never falls
    assert max(abs(b - a) for a, b in zip(values, values[1:])) < 0.01 * peak * stages  # no jump at a stage edge
    width = (end - start) / stages
    for i in range(stages):  # each stage's midpoint: its base plus sin(π/4) of one stage's height
        assert f(start + (i + 0.5) * width) == pytest.approx(peak * (i + math.sin(math.pi / 4)) / stages)


def test_penalty_is_the_factor_times_the_mean_over_layers_of_mean_abs_output():
    model = _mlp()
    reg = lg.SparsityRegularizer(model, total_steps=10, peak=0.5)
    reg.step(5)
    x = torch.randn(8, 4)
    h1 = model[1](model[0](x))
    h2 = model[3](model[2](h1))
    expected = reg.factor * (h1.abs().mean() + h2.abs().mean()) / 2
    model(x)
    penalty = reg.penalty()
    torch.testing.assert_close(penalty, expected)
    g, = torch.autograd.grad(penalty, model[0].weight, retain_graph=True)
    g_expected, = torch.autograd.grad(expected, model[0].weight, retain_graph=True)
    torch.testing.assert_close(g, g_expected)
    assert reg.factor == pytest.approx(0.5 * math.sin(math.pi / 4))
    assert reg.penalty().item() == 0.0  # collected outputs are used once


def test_only_forwards_that_record_gradients_count_and_a_zero_factor_costs_nothing():
    model = _mlp()
    reg = lg.SparsityRegularizer(model, total_steps=10, peak=1.0, start=0.5)
    model(torch.randn(8, 4))
    assert reg.penalty().item() == 0.0 and not reg._outputs  # before start: nothing collected
    reg.step(10)
    with torch.no_grad():
        model(torch.randn(8, 4))
    model.eval()
    model(torch.randn(8, 4))  # eval mode with gradients (reluize trains in eval mode): counted
    assert len(reg._outputs) == 2 and reg.penalty().requires_grad


def test_replaced_modules_are_picked_up_and_remove_leaves_no_hook():
    model = _mlp()
    reg = lg.SparsityRegularizer(model, total_steps=4, peak=1.0)
    reg.step(4)
    old = model[1]
    lg.to_relu_(model)
    reg.step(4)
    assert not old._forward_hooks and all(len(m._forward_hooks) == 1 for m in (model[1], model[3]))
    x = torch.randn(8, 4)
    model(x)
    h1 = F.relu(model[0](x))
    expected = (h1.mean() + F.relu(model[2](h1)).mean()) / 2
    torch.testing.assert_close(reg.penalty(), expected)
    reg.remove()
    assert not any(m._forward_hooks for m in model.modules())


def test_state_round_trip_and_global_step():
    model = _mlp()
    reg = lg.SparsityRegularizer(model, total_steps=100, peak=2.0, start=0.1, end=0.9, stages=2)
    for _ in range(37):
        reg.step()
    other = lg.SparsityRegularizer(model, total_steps=100, peak=2.0, start=0.1, end=0.9, stages=2)
    other.load_state_dict(reg.state_dict())
    assert other.factor == reg.factor == lg.sparsity_factor(0.37, 2.0, 0.1, 0.9, 2)
    other.step(90)
    assert other.factor == 2.0


@pytest.mark.parametrize("kwargs, message", [
    (dict(total_steps=0, peak=0.1), "total_steps must be a positive int"),
    (dict(total_steps=10, peak=-1.0), "peak is the penalty's final factor"),
    (dict(total_steps=10, peak=math.inf), "peak is the penalty's final factor"),
    (dict(total_steps=10, peak=0.1, start=0.5, end=0.5), "0 ≤ start < end ≤ 1"),
    (dict(total_steps=10, peak=0.1, end=1.5), "0 ≤ start < end ≤ 1"),
    (dict(total_steps=10, peak=0.1, stages=0), "stages must be a positive int"),
])
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        lg.SparsityRegularizer(_mlp(), **kwargs)


def test_a_model_without_activation_modules_is_refused():
    with pytest.raises(ValueError, match="found no activation module"):
        lg.SparsityRegularizer(nn.Sequential(nn.Linear(2, 2)), total_steps=10, peak=0.1)


def _train_digits(peak: float):
    """A ReLU MLP on scikit-learn's digits (1797 real 8×8 images), 300 full-batch steps of Adam."""
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    x, y = torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y)
    train, test = slice(0, 1400), slice(1400, None)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    reg = lg.SparsityRegularizer(model, total_steps=300, peak=peak, start=0.2, end=0.8, stages=3) if peak else None
    for _ in range(300):
        loss = F.cross_entropy(model(x[train]), y[train])
        if reg is not None:
            loss = loss + reg.penalty()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if reg is not None:
            reg.step()
    with torch.no_grad():
        acc = (model(x[test]).argmax(1) == y[test]).float().mean().item()
    stats = activation_sparsity(model, [x[test]]).values()
    return acc, sum(s["zero_fraction"] for s in stats) / len(stats)


@pytest.mark.slow
def test_the_penalty_makes_a_relu_network_sparser_at_the_same_accuracy_on_real_digits():
    acc, zeros = _train_digits(0.0)
    acc_sparse, zeros_sparse = _train_digits(0.5)
    assert acc > 0.9 and acc_sparse > acc - 0.02, (acc, acc_sparse)
    assert zeros_sparse > zeros + 0.3, (zeros, zeros_sparse)  # measured: 0.16 → 0.75
