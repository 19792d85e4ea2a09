"""λ-SiLU, x·σ(λx): the math (gradcheck in float64, the L1 gap), the fused kernels against the reference with
tolerances from the arithmetic, exact SiLU at λ = 1, the module under the hardening schedule (its own λ_target),
and the conversion of SiLU gates to it and on to exact ReLU."""
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import lambda_gelu as lg
from lambda_gelu import lambda_silu, lambda_silu_reference, silu_l1_gap, silu_lambda_target


@pytest.mark.parametrize("lam", [1.0, 2.5, 40.0])
def test_gradcheck_in_x_and_lambda(lam):
    x = (torch.randn(24, dtype=torch.float64) * 3).requires_grad_()
    l_ = torch.tensor(lam, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: lambda_silu(a, b), (x, l_))
    assert torch.autograd.gradgradcheck(lambda a, b: lambda_silu(a, b), (x, l_))


def test_lambda_one_is_silu_bit_for_bit_on_the_eager_path():
    x = torch.randn(1000)
    with lg.backend("eager"):
        assert torch.equal(lambda_silu(x, 1.0), F.silu(x))


def test_the_l1_gap_is_2_ln2_over_lambda_and_the_target_inverts_it():
    for lam in (1.0, 3.0, 50.0):
        u = torch.linspace(-60, 60, 1_200_001, dtype=torch.float64) / lam
        gap = ((torch.sigmoid(lam * u) - (u > 0).double()).abs().sum() * (u[1] - u[0])).item()
        assert gap == pytest.approx(silu_l1_gap(lam), rel=1e-5)
    assert silu_lambda_target(0.005) == pytest.approx(2 * math.log(2) / 0.005)
    assert silu_l1_gap(silu_lambda_target(0.01)) == pytest.approx(0.01)
    with pytest.raises(ValueError, match="the gap of SiLU itself"):
        silu_lambda_target(2.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("per_channel", [False, True])
def test_fused_kernels_match_the_reference_forward_and_backward(dtype, per_channel):
    """Large tensors take the C kernels (σ from one exp with ~1e-7 relative error); the reference runs in
    float64. Bounds: a few float32 ulps of each term for float32, the bfloat16 rounding of the result for bf16."""
    torch.manual_seed(0)
    x = (torch.randn(8, 64, 300) * 4).to(dtype)
    lam = torch.rand(64) * 30 + 1 if per_channel else torch.tensor(7.3)
    xr, lr = x.double().requires_grad_(), lam.double().requires_grad_()
    ref = lambda_silu_reference(xr, lr, channel_dim=1)
    g = torch.randn_like(ref)
    ref_gx, ref_gl = torch.autograd.grad(ref, (xr, lr), g)
    xf, lf = x.clone().requires_grad_(), lam.clone().requires_grad_()
    y = lambda_silu(xf, lf, channel_dim=1)
    gx, gl = torch.autograd.grad(y, (xf, lf), g.to(dtype))
    unit = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -22
    scale = xr.detach().abs() + 1
    assert ((y.double() - ref.detach()).abs() <= 4 * unit * scale).all()
    assert ((gx.double() - ref_gx).abs() <= 4 * unit * (1 + lam.max().item() * xr.detach().abs()) * g.abs()
            + 1e-30).all()
    assert torch.allclose(gl.double(), ref_gl, rtol=1e-3 if dtype == torch.float32 else 3e-2, atol=1e-3)


def test_the_module_is_silu_at_one_hardens_to_its_own_target_and_becomes_relu():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.SiLU(), nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 2))
    x = torch.randn(16, 4)
    before = net(x)
    assert lg.convert_to_lambda_silu_(net, init_lambda=1.0) == ["1"]
    assert lg.convert_to_lambda_gelu_(net, init_lambda=1.0) == ["3"]
    assert isinstance(net[1], lg.LambdaSiLU) and torch.equal(net(x), before)
    schedule = lg.HardeningSchedule(net, total_steps=10)
    for _ in range(10):
        schedule.step()
    lams = schedule.current_lambdas()
    assert lams["1"] == pytest.approx(silu_lambda_target(0.005), rel=1e-6)  # 2 ln 2 / ε
    assert lams["3"] == pytest.approx(lg.lambda_target(0.005), rel=1e-6)  # 2 / (ε √(2π))
    hard = net(x)
    lg.to_relu_(net)
    assert sum(isinstance(m, nn.ReLU) for m in net) == 2
    assert torch.allclose(net(x), hard, atol=1e-2)


def test_the_registry_and_the_groups_know_it():
    assert lg.get_act_layer("lambda_silu") is lg.LambdaSiLU
    net = nn.Sequential(nn.Linear(4, 4), lg.LambdaSiLU(), nn.Linear(4, 2))
    groups = lg.lambda_param_groups(net, lr=1e-3)
    assert any(p is net[1].s for g in groups for p in g["params"]
               if g["lr"] == pytest.approx(9e-3) and not g["weight_decay"])


def test_sparsity_penalty_reads_lambda_silu_outputs():
    """At the end of its ramp (factor = peak = 2) the penalty is twice the mean |output| of the λ-SiLU layer."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), lg.LambdaSiLU(), nn.Linear(8, 2))
    x = torch.randn(3, 4)
    with torch.no_grad():
        expected = 2.0 * net[1](net[0](x)).abs().mean()
    reg = lg.SparsityRegularizer(net, total_steps=4, peak=2.0)
    with reg:
        reg.step(4)
        net(x)
        assert torch.allclose(reg.penalty(), expected)
