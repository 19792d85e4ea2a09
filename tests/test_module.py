import math

import pytest
import torch
import torch.nn.functional as F

from lambda_gelu import LambdaGELU, lambda_gelu, lambda_to_raw, raw_to_lambda


@pytest.mark.parametrize("lam", [1.0, 1.0 + 1e-6, 1.5, 7.0, 159.577, 1e4])
def test_raw_parameterization_round_trips(lam):
    s = lambda_to_raw(lam, 0.1).float()
    assert math.isclose(raw_to_lambda(s, 0.1).item(), lam, rel_tol=2e-7)


def test_lambda_is_at_least_one_for_any_raw_value():
    m = LambdaGELU()
    with torch.no_grad():
        m.s.copy_(torch.tensor(-1e6))
    assert m.lam.item() == 1.0
    x = torch.randn(100)
    assert torch.equal(m(x), F.gelu(x))


def test_forward_is_lambda_gelu_of_current_lambda():
    m = LambdaGELU(init_lambda=3.0)
    x = torch.randn(10, 7)
    assert math.isclose(m.lam.item(), 3.0, rel_tol=1e-6)
    torch.testing.assert_close(m(x), lambda_gelu(x, m.lam))


def test_effective_sgd_step_on_lambda():
    """Δλ ≈ −η_s · σ(s/t)²/t² · ∂L/∂λ for a small SGD step on s."""
    m = LambdaGELU(init_lambda=2.0, temperature=0.1)
    x = torch.randn(1000) * 0.5
    loss = m(x).sum()
    loss.backward()
    lam0, s0 = m.lam.item(), m.s.detach().clone()
    dL_dlam = (x ** 2 * torch.exp(-0.5 * (lam0 * x) ** 2) / math.sqrt(2 * math.pi)).sum().item()
    eta = 1e-6
    with torch.no_grad():
        m.s -= eta * m.s.grad
    predicted = -eta * torch.sigmoid(s0 / 0.1).item() ** 2 / 0.1 ** 2 * dL_dlam
    assert math.isclose(m.lam.item() - lam0, predicted, rel_tol=1e-2)


def test_per_channel_conv_layout():
    m = LambdaGELU(init_lambda=2.0, num_channels=4, channel_dim=1)
    m.set_lambda(torch.tensor([1.5, 2.0, 4.0, 8.0]))
    x = torch.randn(2, 4, 3, 3)
    expected = torch.stack([lambda_gelu(x[:, c], lam) for c, lam in enumerate([1.5, 2.0, 4.0, 8.0])], 1)
    torch.testing.assert_close(m(x), expected)
    m(x).sum().backward()
    assert m.s.grad.shape == (4,)
    with pytest.raises(ValueError, match="4 entries but the input has 3 channels"):
        m(torch.randn(2, 3, 4, 4))


def test_freeze_keeps_s_in_the_graph_with_a_zero_gradient_and_set_lambda():
    """Frozen: s still receives a gradient (zero), so the set of parameters with gradients never
    changes; λ is the fixed buffer, whatever s does."""
    m = LambdaGELU()
    m.freeze()
    assert m.frozen and m.s.requires_grad and m.lambda_start.item() == pytest.approx(1.5)
    m(torch.randn(5, requires_grad=True)).sum().backward()
    assert m.s.grad is not None and m.s.grad.item() == 0.0
    m.set_lambda(160.0)
    assert m.lam.item() == pytest.approx(160.0, rel=1e-7)
    with torch.no_grad():
        m.s.add_(3.0)  # an optimizer's momentum or weight decay moving s
    assert m.lam.item() == pytest.approx(160.0, rel=1e-7)
    assert "frozen" in repr(m) and "lam=160" in repr(m)
    with pytest.raises(ValueError, match="λ must be ≥ 1"):
        m.set_lambda(0.5)
    m.unfreeze()  # learning resumes from the fixed value
    assert not m.frozen and m.lam.item() == pytest.approx(160.0, rel=1e-5)


def test_old_checkpoints_without_the_hardening_buffers_load_as_learning():
    m = LambdaGELU(init_lambda=3.0)
    m.load_state_dict({"s": LambdaGELU(init_lambda=2.0).s.detach()})
    assert not m.frozen and m.lam.item() == pytest.approx(2.0, rel=1e-6)


@pytest.mark.parametrize("kwargs, match", [
    ({"init_lambda": 0.9}, "init_lambda"), ({"init_lambda": float("inf")}, "init_lambda"),
    ({"temperature": 0.0}, "temperature"), ({"num_channels": 0}, "num_channels"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LambdaGELU(**kwargs)


def test_lambda_one_is_a_finite_parameter_and_exact_gelu():
    """λ = 1 once stored s = −∞: any arithmetic on parameters (norms, averages, clipping) met inf/NaN."""
    m = LambdaGELU(init_lambda=1.0)
    assert torch.isfinite(m.s) and m.lam.item() == 1.0
    x = torch.randn(100, requires_grad=True)
    assert torch.equal(m(x), F.gelu(x))
    m(x).sum().backward()
    assert m.s.grad.item() == 0.0  # exact GELU does not learn: ∂λ/∂s = σ(s/t)/t = 0 there
    assert math.isfinite(torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0).item())
    ema = torch.optim.swa_utils.AveragedModel(m)
    ema.update_parameters(m)
    assert all(torch.isfinite(p).all() for p in ema.parameters())
    m.set_lambda(1.0)
    assert torch.isfinite(m.s) and torch.equal(m(x), F.gelu(x))
    for dtype in (torch.float64, torch.float16, torch.bfloat16):  # λ = 1 exactly in every float type
        assert raw_to_lambda(m.s.detach().to(dtype), m.temperature).item() == 1.0


@pytest.mark.parametrize("cast", [lambda m: m.half(), lambda m: m.bfloat16(), lambda m: m.to(torch.float16)])
def test_lambda_keeps_its_precision_when_the_model_is_cast_to_half(cast):
    """float16 resolves λ near λ_target only to about ±0.1; s stays float32, the output in the input's dtype."""
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), LambdaGELU())
    net[1].set_lambda(159.7)
    cast(net)
    half = net[0].weight.dtype
    assert half in (torch.float16, torch.bfloat16) and net[1].s.dtype == torch.float32
    assert abs(net[1].lam.item() - 159.7) < 1e-4
    x = torch.randn(4, 8).to(half)
    h = net[0](x)
    y = net(x)
    assert y.dtype == half
    assert torch.equal(y, lambda_gelu(h.float(), net[1].lam).to(half))
    y.float().sum().backward()
    assert net[1].s.grad.dtype == torch.float32 and torch.isfinite(net[1].s.grad)
