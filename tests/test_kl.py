"""The chunked KL of the logits-kl loss against the plain formula: its value and its gradient."""
import pytest
import torch

from lambda_gelu.reluize import kl as kl_module
from lambda_gelu.reluize.kl import kl_divergence, kl_reference


def _logits(*shape, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (3 * torch.randn(*shape, generator=g, dtype=torch.float64)).to(dtype)


def _weights(shape, seed=1):
    mask = (torch.rand(shape, generator=torch.Generator().manual_seed(seed)) > 0.3).double()
    return mask / mask.sum()


@pytest.fixture(params=[1, 7, 10 ** 9], ids=["one-row-chunks", "ragged-chunks", "one-chunk"])
def rows(request, monkeypatch):
    """Chunks of 1 position, of 7 (the last one short), and all positions in one."""
    monkeypatch.setattr(kl_module, "CHUNK_ELEMENTS", request.param * 97)
    return request.param


def test_value_and_gradient_equal_the_plain_formula_in_float64(rows):
    s, t, w = _logits(3, 11, 97).requires_grad_(True), _logits(3, 11, 97, seed=2), _weights((3, 11))
    fast = kl_divergence(s, t, w)
    (grad_fast,) = torch.autograd.grad(2.5 * fast, s)
    ref = kl_reference(s, t, w)
    (grad_ref,) = torch.autograd.grad(2.5 * ref, s)
    assert fast.dtype == torch.float64 and fast.item() > 0
    torch.testing.assert_close(fast, ref, rtol=1e-12, atol=0)
    torch.testing.assert_close(grad_fast, grad_ref, rtol=1e-10, atol=1e-15)


@pytest.mark.slow
def test_gradcheck(rows):
    s, t, w = _logits(2, 5, 97).requires_grad_(True), _logits(2, 5, 97, seed=2), _weights((2, 5))
    assert torch.autograd.gradcheck(lambda x: kl_divergence(x, t, w), (s,))


def test_float32_and_bfloat16_logits_agree_with_the_plain_formula_within_their_rounding():
    for dtype in (torch.float32, torch.bfloat16):
        s, t, w = _logits(4, 9, 2000, dtype=dtype).requires_grad_(True), _logits(4, 9, 2000, dtype=dtype, seed=2), \
            _weights((4, 9)).float()
        fast = kl_divergence(s, t, w)
        (grad_fast,) = torch.autograd.grad(fast, s)
        ref = kl_reference(s, t, w)
        (grad_ref,) = torch.autograd.grad(ref, s)
        exact = kl_reference(s.double(), t.double(), w.double())
        assert fast.dtype == torch.float32 and grad_fast.dtype == dtype
        # both sum 36 × 2000 float32 terms, in different orders: a few thousand roundings of 2^-24 each
        assert abs(fast.item() - exact.item()) <= 1e-4 * exact.item()
        assert abs(ref.item() - exact.item()) <= 1e-4 * exact.item()
        # each gradient element is w·(softmax(s) − softmax(t)), a difference of two float32 probabilities rounded to
        # the logits' dtype: apart by a few float32 roundings of the probabilities and one of the dtype at most
        q_s, p_t = torch.softmax(s.double(), -1), torch.softmax(t.double(), -1)
        bound = (8 * torch.finfo(torch.float32).eps * (q_s + p_t) * w.double().unsqueeze(-1)
                 + torch.finfo(dtype).eps * grad_ref.double().abs())
        assert ((grad_fast.double() - grad_ref.double()).abs() <= bound).all()


def test_an_enclosing_autocast_leaves_the_kl_in_float32():
    s, t, w = _logits(2, 3, 300, dtype=torch.float32), _logits(2, 3, 300, dtype=torch.float32, seed=2), \
        torch.full((2, 3), 1 / 6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = kl_divergence(s, t, w)
    assert torch.equal(inside, kl_divergence(s, t, w))


def test_identical_logits_give_zero_and_no_gradient_for_the_teacher():
    s = _logits(2, 3, 50).requires_grad_(True)
    t = s.detach().clone().requires_grad_(True)
    value = kl_divergence(s, t, torch.full((2, 3), 1 / 6))
    assert value.item() == 0.0
    value.backward()
    assert t.grad is None and s.grad.abs().max().item() == 0.0


def test_shapes_that_do_not_fit_are_refused_in_one_line():
    with pytest.raises(ValueError, match=r"student \(2, 3, 5\), teacher \(2, 3, 6\)"):
        kl_divergence(torch.zeros(2, 3, 5), torch.zeros(2, 3, 6), torch.ones(2, 3))
    with pytest.raises(ValueError, match="weights"):
        kl_divergence(torch.zeros(2, 3, 5), torch.zeros(2, 3, 5), torch.ones(6))
