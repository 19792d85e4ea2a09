"""Error bounds derived from the arithmetic, so that tests hold on every CPU and compiler.

Builds for different CPUs round differently: with or without fused multiply-adds, in vectors of
different widths, summing in different orders. A test that compares against one machine's bits
fails on the next; these bounds are what every correct build must meet.
"""
import torch

U32 = 2.0 ** -24   # float32 unit roundoff
UNIT = {torch.float32: U32, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float64: 2.0 ** -53}
PHI_ERR = 0.75e-7  # |Φ̂ − Φ| of the C kernels: erf by A&S 7.1.26 is within 1.5e-7 and Φ = (1 + erf(z/√2))/2
OPS = 16           # float32 roundings allowed per element (the kernels use fewer than 16)
BLOCK = 1024       # the C kernels sum ∂L/∂λ in float32 over blocks of at most this many elements


def assert_within(actual: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor, what: str) -> None:
    """|actual − expected| ≤ bound element by element (all in float64)."""
    err = (actual.double() - expected.double()).abs()
    bad = ~(err <= bound.double())
    if bad.any():
        i = int(bad.flatten().nonzero()[0])
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.numel()} elements outside the bound; first at "
                             f"{i}: |{actual.flatten()[i].item()!r} − {expected.flatten()[i].item()!r}| = "
                             f"{err.flatten()[i].item():.3g} > {bound.double().flatten()[i].item():.3g}")


def forward_bound(x: torch.Tensor, y_ref: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """x·Φ(λx) computed in float32 with an approximate Φ, stored in ``dtype``."""
    return x.double().abs() * (PHI_ERR + OPS * U32) + y_ref.double().abs() * UNIT[dtype] + 1e-38


def grad_x_bound(g: torch.Tensor, gx_ref: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """g·(Φ(z) + z·φ(z)): the factor is at most 1.25 in size, its error PHI_ERR + OPS roundings."""
    return g.double().abs() * (PHI_ERR + 1.25 * OPS * U32) + gx_ref.double().abs() * UNIT[dtype] + 1e-38


def sum_bound(terms: torch.Tensor) -> torch.Tensor:
    """Σ t_i where each t_i carries OPS roundings and the sum runs in float32 over blocks of BLOCK
    (then in float64): |error| ≤ (OPS + BLOCK)·u·Σ|t_i|, in any order of summation."""
    return (OPS + BLOCK) * U32 * terms.double().abs().sum()
