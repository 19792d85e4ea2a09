"""The op against its math: gradcheck, the reference implementation, non-finite inputs, half types, memory."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch.autograd.graph import saved_tensors_hooks

import lambda_gelu as lg
from lambda_gelu import l1_gap, lambda_gelu, lambda_gelu_reference, lambda_target

import bounds
from bounds import assert_within

LAMBDAS = [1.0, 4.0, 160.0, 1e4]


def _inputs(lam, shape, seed=0):
    """Inputs where the gate is neither 0 nor 1: λx spread over about [-4, 4], plus some plain N(0,1)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    x = torch.where(torch.rand(shape, generator=g) < 0.7, x * 1.5 / lam, x)
    return x


@pytest.mark.parametrize("lam", LAMBDAS)
@pytest.mark.parametrize("per_channel", [False, True])
def test_gradcheck_and_gradgradcheck(lam, per_channel):
    x = _inputs(lam, (3, 4, 5)).requires_grad_()
    if per_channel:  # channels along dim 1, λ spread around the test value
        lam_t = (lam * torch.tensor([1.0, 1.5, 2.0, 3.0], dtype=torch.float64)).requires_grad_()
        fn = lambda x, l: lambda_gelu(x, l, channel_dim=1)
    else:
        lam_t = torch.tensor(lam, dtype=torch.float64, requires_grad=True)
        fn = lambda_gelu
    eps = 1e-6 / max(1.0, lam)  # the finite difference must resolve φ(λx), whose scale is 1/λ
    assert torch.autograd.gradcheck(fn, (x, lam_t), eps=eps, atol=1e-6, rtol=1e-4)
    assert torch.autograd.gradgradcheck(fn, (x, lam_t), eps=eps, atol=1e-5, rtol=1e-3)


def test_derivatives_match_closed_forms():
    x = torch.linspace(-4, 4, 101, dtype=torch.float64, requires_grad=True)
    lam = torch.tensor(2.5, dtype=torch.float64, requires_grad=True)
    y = lambda_gelu(x, lam)
    gx, gl = torch.autograd.grad(y.sum(), (x, lam))
    z = (lam * x).detach()
    phi = torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    xd = x.detach()
    torch.testing.assert_close(y.detach(), xd * torch.special.ndtr(z), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(gx, torch.special.ndtr(z) + z * phi, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(gl, (xd * xd * phi).sum(), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("lam", LAMBDAS)
@pytest.mark.parametrize("channel_dim", [None, 1, -1])
def test_fast_matches_reference_fp32(lam, channel_dim):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(64, 8, 33, generator=g) * torch.logspace(-4, 4, 33)).float()  # |x| up to ~1e4
    lam_t = torch.tensor(lam) if channel_dim is None else lam * (1 + torch.rand(x.shape[channel_dim], generator=g))
    kw = {} if channel_dim is None else {"channel_dim": channel_dim}
    gy = torch.randn(x.shape, generator=g)
    outs = []
    for fn in (lambda_gelu, lambda_gelu_reference):
        xi, li = x.clone().requires_grad_(), lam_t.clone().requires_grad_()
        y = fn(xi, li, **kw)
        y.backward(gy)
        outs.append((y, xi.grad, li.grad))
    (y, gx, gl), (y_ref, gx_ref, gl_ref) = outs
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gx, gx_ref, rtol=1e-5, atol=1e-5)
    # The λ gradient is a sum of many terms: compare against an exact float64 sum.
    x64, l64 = x.double(), lam_t.double()
    lb = l64 if channel_dim is None else l64.view((-1,) + (1,) * (x.dim() - channel_dim % x.dim() - 1))
    z = lb * x64
    exact = (gy.double() * x64 * x64 * torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi))
    exact = exact.sum() if channel_dim is None else exact.sum_to_size(lb.shape).view(-1)
    scale = exact.abs().max().clamp_min(1e-30)
    assert ((gl.double() - exact).abs().max() / scale) < 1e-4
    assert ((gl_ref.double() - exact).abs().max() / scale) < 1e-4


def test_lambda_gradient_avoids_cancellation_at_160():
    """Differentiating GELU(λx)/λ in float32 subtracts two nearly equal sums at λ = 160; the direct
    form Σ g·x²·φ(λx) does not. On a layer-sized input ours is orders of magnitude closer."""
    g = torch.Generator().manual_seed(0)
    x, gy = torch.randn(1 << 20, generator=g) * 3, torch.randn(1 << 20, generator=g)
    x64 = x.double()
    exact = (gy.double() * x64 ** 2 * torch.exp(-0.5 * (160 * x64) ** 2) / math.sqrt(2 * math.pi)).sum().item()
    lam = torch.tensor(160.0, requires_grad=True)
    (ours,) = torch.autograd.grad(lambda_gelu(x, lam), lam, gy)
    lam2 = torch.tensor(160.0, requires_grad=True)
    (naive,) = torch.autograd.grad(F.gelu(lam2 * x) / lam2, lam2, gy)
    ours_err, naive_err = abs(ours.item() - exact) / abs(exact), abs(naive.item() - exact) / abs(exact)
    assert ours_err < 1e-5
    assert naive_err > 100 * ours_err  # why the direct form exists


def test_lambda_one_is_gelu():
    x = torch.randn(1000) * 5
    with lg.backend("eager"):  # the eager path reuses F.gelu's kernel: bit for bit
        assert torch.equal(lambda_gelu(x, 1.0), F.gelu(x))
        assert torch.equal(lambda_gelu(x, torch.tensor(1.0)), F.gelu(x))
    big = torch.randn(512, 512) * 5  # the fused path: the same function, computed within the kernels' bound
    ref = F.gelu(big.double())
    assert_within(lambda_gelu(big, 1.0), ref, bounds.forward_bound(big, ref), "λ = 1 vs GELU")


def test_large_lambda_is_relu():
    x = torch.randn(10000) * 3
    assert (lambda_gelu(x, 1e6) - F.relu(x)).abs().max() < 1e-5


PATHS = {"eager": ("eager", 1), "c": ("auto", 1 << 14), "inductor": ("inductor", 1 << 14)}  # backend, repeat


@pytest.mark.parametrize("lam", [1.0, 160.0, 1e4])
@pytest.mark.parametrize("path", PATHS)
def test_finite_inputs_give_finite_results_at_every_lambda(lam, path):
    """Even where λx overflows float32 (|x| up to 3.4e38, λ up to 1e4): the limits x and −0."""
    backend, repeat = PATHS[path]
    x = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 1e4, -1e4, 1e30, -1e30, 1e36, -1e36, 3.4e38, -3.4e38]).repeat(repeat)
    xa, lam_t = x.clone().requires_grad_(), torch.tensor(lam, requires_grad=True)
    with lg.backend(backend):
        y = lambda_gelu(xa, lam_t)
        y.sum().backward()
    assert torch.isfinite(y).all() and torch.isfinite(xa.grad).all() and torch.isfinite(lam_t.grad)
    big = x.abs() >= 1e30  # Φ(λx) is 0 or 1 in float32 there: ReLU exactly, gradient the step
    assert torch.equal(y[big], F.relu(x[big])) and torch.equal(xa.grad[big], (x[big] > 0).float())


@pytest.mark.parametrize("lam", [1.0, 160.0, 1e4])
@pytest.mark.parametrize("path", PATHS)
def test_nonfinite_inputs_behave_like_gelu(lam, path):
    """NaN gives NaN. ±inf: the eager path gives what this platform's own F.gelu gives (it differs
    between CPUs: NaN with some vector units, ±inf or 0 with others); the fused kernels give the
    limits +inf → +inf and −inf → −inf·0 = NaN."""
    backend, repeat = PATHS[path]
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.0]).repeat(repeat)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    with lg.backend(backend):
        y = lambda_gelu(xa, torch.tensor(lam))
        y.sum().backward()
    nan, pos, neg = x.isnan(), x == float("inf"), x == -float("inf")
    assert y[nan].isnan().all() and xa.grad[nan].isnan().all()
    if path == "eager":
        F.gelu(xb).sum().backward()  # λ·(±inf) = ±inf: the same input for F.gelu at every λ
        inf = pos | neg
        torch.testing.assert_close(y[inf], F.gelu(x)[inf], equal_nan=True, rtol=0, atol=0)
        torch.testing.assert_close(xa.grad[inf], xb.grad[inf], equal_nan=True, rtol=0, atol=0)
    else:
        assert (y[pos] == float("inf")).all() and y[neg].isnan().all()


@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 1e-2), (torch.float16, 2e-3)])
def test_half_types_match_fp32(dtype, tol):
    g = torch.Generator().manual_seed(3)
    x32 = torch.randn(256, 64, generator=g) * 2
    gy = torch.randn(256, 64, generator=g)
    xh = x32.to(dtype).requires_grad_()
    lam_h = torch.tensor(3.0, requires_grad=True)
    y = lambda_gelu(xh, lam_h)
    y.backward(gy.to(dtype))
    assert y.dtype == dtype and xh.grad.dtype == dtype and lam_h.grad.dtype == torch.float32
    # the fp32 result on the same (rounded) input; the difference is the output rounding only
    xr = xh.detach().float().requires_grad_()
    lam_r = torch.tensor(3.0, requires_grad=True)
    yr = lambda_gelu(xr, lam_r)
    yr.backward(gy.to(dtype).float())
    torch.testing.assert_close(y.float(), yr, rtol=tol, atol=tol)
    torch.testing.assert_close(xh.grad.float(), xr.grad, rtol=tol, atol=tol)
    torch.testing.assert_close(lam_h.grad, lam_r.grad, rtol=1e-5, atol=1e-5)


def _saved_bytes(fn, x):
    total = []

    def pack(t):
        total.append(t.numel() * t.element_size())
        return t

    with saved_tensors_hooks(pack, lambda t: t):
        fn(x)
    return sum(total), len(total)


@pytest.mark.parametrize("backend", ["auto", "eager"])
def test_saves_only_the_input_like_gelu(backend):
    x = torch.randn(512, 1024, requires_grad=True)
    lam = torch.tensor(2.0, requires_grad=True)
    gelu_bytes, gelu_count = _saved_bytes(F.gelu, x)
    with lg.backend(backend):
        ours_bytes, ours_count = _saved_bytes(lambda t: lambda_gelu(t, lam), x)
    naive_bytes, _ = _saved_bytes(lambda t: t * 0.5 * (1 + torch.erf(lam * t / math.sqrt(2))), x)
    assert gelu_count == 1 and gelu_bytes == x.numel() * 4
    assert ours_bytes == gelu_bytes + lam.numel() * 4  # x, plus the 4-byte λ
    assert naive_bytes >= 3 * gelu_bytes


def test_l1_gap_and_target():
    # E(λ) by numerical integration of |Φ(λx) − H(x)|
    xs = torch.linspace(-50, 50, 2_000_001, dtype=torch.float64)
    for lam in (1.0, 7.0):
        gap = torch.trapezoid((torch.special.ndtr(lam * xs) - (xs > 0).double()).abs(), xs)
        assert abs(gap.item() - l1_gap(lam)) < 1e-6
    assert abs(lambda_target(0.005) - 159.577) < 1e-3
    assert abs(l1_gap(lambda_target(0.01)) - 0.01) < 1e-12


@pytest.mark.parametrize("bad, match", [
    (lambda: lambda_gelu(torch.arange(3), 2.0), "floating-point tensor"),
    (lambda: lambda_gelu(torch.randn(3), -1.0), "positive"),
    (lambda: lambda_gelu(torch.randn(2, 3), torch.ones(4)), "4 entries but the input has 3"),
    (lambda: lambda_gelu(torch.randn(2, 3), torch.ones(2, 3)), "0-dim .* or 1-dim"),
    (lambda: lambda_target(0.9), "epsilon must be in"),
])
def test_bad_input_is_one_clear_error(bad, match):
    with pytest.raises((ValueError, TypeError), match=match):
        bad()


@pytest.mark.parametrize("lam", [float("inf"), torch.tensor(float("inf")), torch.tensor(0.0), torch.tensor(-1.0),
                                 torch.tensor(float("nan")), torch.tensor([1.5, float("inf")])])
def test_a_lambda_that_is_not_finite_and_positive_is_refused_on_every_path(lam):
    """λ = ∞ once gave NaN at x = 0 (and NaN input gradients on the fused path); a 0-dim tensor λ was never
    checked, and the eager and fused paths then disagreed. Each backend refuses it with one line."""
    x = torch.randn(70_000, 2)  # large enough for the fused kernels
    for backend in ("eager", "auto"):
        with lg.backend(backend):
            with pytest.raises(ValueError, match="λ must be finite and positive"):
                lambda_gelu(x, lam, channel_dim=-1)


def test_the_module_refuses_an_infinite_lambda():
    from lambda_gelu import LambdaGELU
    with pytest.raises(ValueError, match="the ReLU limit is nn.ReLU itself"):
        LambdaGELU().set_lambda(float("inf"))
