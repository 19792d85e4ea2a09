"""The fused kernels (C for float32 on CPU, Inductor's otherwise) against the eager formulas and the
plain reference, and λ-GELU inside a user's torch.compile'd model: no graph breaks."""
import math
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import lambda_gelu as lg
from lambda_gelu import _native
from lambda_gelu.core import _compiled
from lambda_gelu.core.functional import COMPILED_MIN_NUMEL, lambda_gelu, lambda_gelu_reference

import bounds
from bounds import assert_within


def _grads(fn, x, lam, gy, **kw):
    xi, li = x.clone().requires_grad_(), lam.clone().requires_grad_()
    y = fn(xi, li, **kw)
    y.backward(gy)
    return y.detach(), xi.grad, li.grad


CASES = [  # (shape, channel_dim or None for one λ, dtype, backend)
    ((64, 2048), None, torch.float32, "auto"),
    ((4, 16, 32, 32), 1, torch.float32, "auto"),
    ((8, 128, 96), -1, torch.float32, "auto"),
    ((3, 7, 5, 1000), 1, torch.float32, "auto"),  # runs that do not split evenly among threads
    ((64, 2048), None, torch.float32, "inductor"),
    ((4, 16, 32, 32), 1, torch.float32, "inductor"),
    ((8, 128, 96), -1, torch.float32, "inductor"),
    ((64, 2048), None, torch.bfloat16, "auto"),
    ((4, 16, 32, 32), 1, torch.bfloat16, "auto"),
    ((8, 128, 96), -1, torch.bfloat16, "auto"),
    ((64, 2048), None, torch.bfloat16, "inductor"),
    ((64, 2048), None, torch.float16, "auto"),
]


def test_float32_and_bfloat16_on_cpu_use_the_c_kernels():
    assert _native.library() is not None, _native.error()
    x = torch.randn(256, 512)
    assert lg.core.functional._fused_kernels(x) is _native
    assert lg.core.functional._fused_kernels(x.bfloat16()) is _native
    assert lg.core.functional._fused_kernels(x.half()) is _compiled
    with lg.backend("inductor"):
        assert lg.core.functional._fused_kernels(x) is _compiled


@pytest.fixture(scope="module", params=_native.ISAS)
def kernels(request):
    """Every build: the native one and the architecture's baseline, so that the developer's CPU is not
    the only one whose rounding the tests ever see."""
    return _native.Kernels(request.param)


def _reference_terms(x, lam, gy, kw):
    """The reference's output, input gradient and the terms g·x²·φ(λx) of ∂L/∂λ, in float64."""
    y, gx, _ = _grads(lambda_gelu_reference, x.double(), lam.double(), gy.double(), **kw)
    lam_b = lg.core.functional._broadcastable_lambda(lam.double(), x, kw.get("channel_dim", -1))
    xd = x.double()
    terms = gy.double() * xd * xd * torch.exp(-0.5 * (lam_b * xd) ** 2) / math.sqrt(2 * math.pi)
    return y, gx, terms


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("shape, channel_dim", [((6, 12, 1999), 1), ((1999, 72), -1), ((143_929,), None)])
def test_c_kernels_agree_with_the_reference_for_any_thread_count(kernels, threads, shape, channel_dim):
    """Each thread sums its own share of ∂L/∂λ; the result must not depend on how many there are,
    nor on the instruction set beyond the rounding bounds."""
    g = torch.Generator().manual_seed(1)
    x, gy = torch.randn(shape, generator=g) * 3, torch.randn(shape, generator=g)
    assert x.numel() >= 3 * _native.GRAIN  # enough work for three threads
    kw = {} if channel_dim is None else {"channel_dim": channel_dim}
    lam = torch.tensor(1.7) if channel_dim is None else 1 + 5 * torch.rand(shape[channel_dim], generator=g)
    lam_b = lg.core.functional._broadcastable_lambda(lam, x, channel_dim if channel_dim is not None else -1)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        y = kernels.forward(x, lam_b)
        gx, gl = kernels.backward(gy, x, lam_b, True)
    finally:
        torch.set_num_threads(old)
    y_ref, gx_ref, terms = _reference_terms(x, lam, gy, kw)
    assert_within(y, y_ref, bounds.forward_bound(x, y_ref), "forward")
    assert_within(gx, gx_ref, bounds.grad_x_bound(gy, gx_ref), "∂L/∂x")
    dims = [d for d in range(x.dim()) if channel_dim is None or d != channel_dim % x.dim()]
    per_channel = terms.sum(dims) if dims else terms
    bound = (torch.stack([bounds.sum_bound(t) for t in terms.movedim(channel_dim, 0)])
             if channel_dim is not None else bounds.sum_bound(terms))
    assert_within(gl.reshape(lam.shape), per_channel, bound, "∂L/∂λ")


def test_the_two_builds_are_different_code():
    """The baseline build must not silently be the native one (then only one ISA would be tested)."""
    native, baseline = _native.Kernels("native"), _native.Kernels("baseline")
    assert native.path != baseline.path
    assert "-march=native" in _native._flags("native") and "-march=native" not in _native._flags("baseline")


def _assembly(unit: str, march: str, isa: str, tmp_path) -> str:
    """The assembly of one kernel source compiled for -march=``march`` with the ``isa`` build's other flags (skipped
    where the compiler does not know the target)."""
    cc = os.environ.get("CC", "cc")
    flags = [f for f in _native._flags(isa) if not f.startswith("-march=") and f not in ("-shared", "-fPIC")]
    out = tmp_path / "unit.s"
    done = subprocess.run([cc, *flags, f"-march={march}", "-S", str(_native.HERE / unit), "-o", str(out)],
                          capture_output=True, text=True)
    if done.returncode != 0 and "-march=" in done.stderr:  # an older compiler that does not know the target
        pytest.skip(f"{cc} does not know -march={march}")
    assert done.returncode == 0, done.stderr[-800:]
    return out.read_text()


@pytest.mark.skipif(_native._ARCH not in ("x86_64", "amd64"), reason="x86's instruction sets")
@pytest.mark.parametrize("march, isa, want", [
    ("sapphirerapids", "native", r"vpdpwssd\s.*%zmm"),  # AVX-512 VNNI: multiply, add pairs and accumulate at once
    ("skylake-avx512", "native", r"vpmaddwd\s.*%zmm"),  # AVX-512 without VNNI
    ("haswell", "native", r"vpmaddwd\s.*%ymm"),  # AVX2
    ("x86-64", "baseline", r"\spmaddwd\s.*%xmm"),  # the architecture's baseline, SSE2
])
@pytest.mark.parametrize("unit", ["gated.c", "decode.c", "argmax.c"])
def test_the_int8_sums_compile_to_each_x86_cpus_own_multiply_adds(march, isa, want, unit, tmp_path):
    """The int8 × int16 sums (the int8 FFN, attention and output screen) are plain C loops the compiler vectorizes
    for the CPU it builds for: checked on the assembly for each target, which need not be this machine's."""
    assert re.search(want, _assembly(unit, march, isa, tmp_path))


@pytest.mark.skipif(_native._ARCH not in ("x86_64", "amd64"), reason="x86's instruction sets")
@pytest.mark.parametrize("march, isa, avx2", [("sapphirerapids", "native", True), ("haswell", "native", True),
                                              ("x86-64", "baseline", False)])
def test_the_4_bit_sums_are_avx2s_unsigned_by_signed_multiply_adds_and_plain_c_elsewhere(march, isa, avx2, tmp_path):
    """int4.h's AVX2 loop multiplies codes by int8 in vpmaddubsw; a build without AVX2 compiles the plain loops."""
    assert bool(re.search(r"vpmaddubsw\s.*%ymm", _assembly("gated.c", march, isa, tmp_path))) == avx2


def test_unknown_instruction_set_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown instruction set 'avx9'"):
        _native.Kernels("avx9")


@pytest.mark.slow
def test_without_a_compiler_the_c_kernels_fall_back_with_one_warning(tmp_path):
    code = ("import warnings, torch, lambda_gelu as lg\n"
            "from lambda_gelu import _native\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    x = torch.randn(300, 300, requires_grad=True)\n"
            "    lg.lambda_gelu(x, 2.0).sum().backward()\n"
            "    lg.lambda_gelu(x, 2.0).sum().backward()\n"
            "assert lg.core.functional._fused_kernels(x) is lg.core._compiled, 'should fall back to Inductor'\n"
            "msgs = [str(m.message) for m in w if 'C kernels' in str(m.message)]\n"
            "assert len(msgs) == 1 and 'no-such-compiler' in msgs[0], msgs\n"
            "print('ok')\n")
    env = {**os.environ, "CC": "no-such-compiler", "LAMBDA_GELU_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("shape, channel_dim, dtype, backend", CASES)
def test_fused_kernels_match_eager_and_reference(shape, channel_dim, dtype, backend):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=g) * 2).to(dtype)
    assert x.numel() >= COMPILED_MIN_NUMEL
    gy = torch.randn(shape, generator=g).to(dtype)
    lam = torch.tensor(2.5) if channel_dim is None else 1 + 3 * torch.rand(shape[channel_dim], generator=g)
    kw = {} if channel_dim is None else {"channel_dim": channel_dim}
    with lg.backend(backend):
        compiled = _grads(lambda_gelu, x, lam, gy, **kw)
    assert _compiled.failed() == {} and _native.error() is None
    with lg.backend("eager"):
        eager = _grads(lambda_gelu, x, lam, gy, **kw)
    reference = _grads(lambda_gelu_reference, x.float(), lam, gy.float(), **kw)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
    for c, e, r in zip(compiled, eager, reference):
        assert c.dtype == e.dtype and c.shape == e.shape
        torch.testing.assert_close(c, e, **tol)
        torch.testing.assert_close(c.float(), r.float(), **(tol if c is not compiled[2] else dict(rtol=1e-4, atol=1e-4)))


def test_frozen_lambda_backward_skips_the_reduction():
    x = torch.randn(128, 1024, requires_grad=True)
    y = lambda_gelu(x, torch.tensor(3.0))  # λ needs no gradient
    y.sum().backward()
    with lg.backend("eager"):
        x2 = x.detach().clone().requires_grad_()
        lambda_gelu(x2, torch.tensor(3.0)).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-6, atol=1e-6)


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown λ-GELU backend 'fast'; choose one of auto, inductor, eager"):
        lg.set_backend("fast")


def _block(width):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, width), lg.LambdaGELU(), nn.Linear(width, width),
                         lg.LambdaGELU(num_channels=width), nn.Linear(width, 8))


@pytest.mark.slow
@pytest.mark.parametrize("width", [256, 1024], ids=["small: formulas fused by Inductor", "large: C kernels as ops"])
def test_user_compiled_model_has_no_graph_breaks_and_matches_eager(width):
    model = _block(width)
    x = torch.randn(128, 64)
    explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    ops = {str(n.target) for g in explanation.graphs for sub in g.modules() if isinstance(sub, torch.fx.GraphModule)
           for n in sub.graph.nodes}  # the autograd.Function's body is a subgraph
    assert ("lambda_gelu.forward" in " ".join(ops)) == (128 * width >= COMPILED_MIN_NUMEL)

    torch._dynamo.reset()
    compiled = torch.compile(_block(width), fullgraph=True)
    y = compiled(x)
    y.square().sum().backward()
    eager = _block(width)
    y_ref = eager(x)
    y_ref.square().sum().backward()
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    for p, q in zip(compiled.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_many_variants_in_one_process_all_stay_compiled():
    """dtypes × kinds of λ × which gradients: every kernel keeps its own cache, none falls back."""
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for shape, channel_dim in (((256, 512), None), ((4, 32, 32, 32), 1), ((64, 8, 256), -1), ((1, 8, 64, 128), 1)):
            kw = {} if channel_dim is None else {"channel_dim": channel_dim}
            for lam_grad in (True, False):
                x = torch.randn(shape, dtype=dtype, requires_grad=True)
                lam = torch.tensor(2.0) if channel_dim is None else torch.full((shape[channel_dim],), 2.0)
                lam.requires_grad_(lam_grad)
                lambda_gelu(x, lam, **kw).float().sum().backward()
                assert x.grad is not None and (lam.grad is not None) == lam_grad
    assert _compiled.failed() == {}


def test_bfloat16_c_kernels_are_the_float32_ones_rounded(kernels):
    """bfloat16 in, float32 arithmetic, round to nearest even out. The two loops may be vectorized
    and contracted differently, so the float32 results may differ in their last bits, which can move
    the rounding to the neighbouring bfloat16 value, never further."""
    g = torch.Generator().manual_seed(2)
    x = torch.cat([torch.randn(70_000, generator=g) * 4, torch.tensor([float("nan"), float("inf"), -float("inf"),
                                                                          0.0, -0.0, 3e38, -3e38, 1e-40])])
    xb, gb, lam = x.bfloat16(), torch.randn(x.shape, generator=g).bfloat16(), torch.tensor(2.5)

    def within_one_bf16_ulp(b, f):
        nan = torch.isnan(b)
        assert torch.equal(nan, torch.isnan(f)) and nan.any()
        b, f = b[~nan].float(), f[~nan]
        same_inf = torch.isinf(b) & (b == f)
        ulp = torch.clamp(f.abs() * 2.0 ** -7, min=2.0 ** -133)  # ≥ the spacing of bfloat16 values at f
        assert_within(b[~same_inf], f[~same_inf], ulp[~same_inf], "bfloat16 vs float32 rounded")

    within_one_bf16_ulp(kernels.forward(xb, lam), kernels.forward(xb.float(), lam))
    gx_b, gl_b = kernels.backward(gb, xb, lam, True)
    gx_f, gl_f = kernels.backward(gb.float(), xb.float(), lam, True)
    within_one_bf16_ulp(gx_b, gx_f)
    assert gl_b.isnan() and gl_f.isnan()  # NaN in x: NaN in ∂L/∂λ
    n = 70_000  # the finite part alone: both sum the same float32 terms, in orders that may differ
    xd = xb[:n].double()
    terms = gb[:n].double() * xd * xd * torch.exp(-0.5 * (2.5 * xd) ** 2) / math.sqrt(2 * math.pi)
    gl_b = kernels.backward(gb[:n], xb[:n], lam, True)[1]
    gl_f = kernels.backward(gb[:n].float(), xb[:n].float(), lam, True)[1]
    assert_within(gl_b, gl_f, 2 * bounds.sum_bound(terms), "∂L/∂λ, bfloat16 vs float32")
