"""ScreenedArgmax: the index of a linear layer's largest output, from int8 copies of its rows and the float32 rows of
the few that can hold it, is the argmax of the exact (float64) outputs — near ties and exact ties included — reads
the rows its float64 reference leaves, and hands to the layer itself what it cannot bound (a NaN or an infinity,
another dtype)."""
import pytest
import torch
import torch.nn as nn

from lambda_gelu import _native
from lambda_gelu.inference.screened_argmax import ScreenedArgmax, screened_argmax_reference


def _layer(rows, d, bias, seed=0):
    torch.manual_seed(seed)
    layer = nn.Linear(d, rows, bias=bias)
    nn.init.normal_(layer.weight)
    return layer


def _exact(layer, x):
    y = layer.weight.double() @ x.double()
    return int((y + layer.bias.double() if layer.bias is not None else y).argmax())


@pytest.fixture(autouse=True)
def _kernels():
    if _native.library() is None:  # test_sparse's test_the_c_kernel_is_what_runs fails where they do not build
        pytest.skip(f"the C kernels did not build: {_native.error()}")


@pytest.mark.parametrize("rows, d, bias", [(1003, 37, True), (5000, 64, False), (4097, 576, True), (3, 5, False)])
def test_the_index_is_the_exact_outputs_argmax_from_the_rows_the_reference_leaves(rows, d, bias):
    layer = _layer(rows, d, bias)
    head = ScreenedArgmax(layer)
    for seed in range(6):
        x = torch.randn(d, generator=torch.Generator().manual_seed(seed)) * (0.1 + seed)
        index, left = screened_argmax_reference(x, layer.weight, layer.bias, head.screen)
        assert int(head(x)) == index == _exact(layer, x)
        assert head.rows_read == len(left)
    if rows > 100:  # Gaussian rows: the largest output stands out from all but a few
        assert head.rows_read < rows // 20


def test_near_ties_are_read_and_decided_exactly_and_exact_ties_go_to_the_first():
    layer = _layer(2000, 64, False)
    x = torch.randn(64, generator=torch.Generator().manual_seed(3))
    top = _exact(layer, x)
    with torch.no_grad():
        for i, k in enumerate((11, 1500)):  # rows whose outputs differ from the top's by a few float32 ulps
            layer.weight[k] = layer.weight[top]
            layer.weight[k, int(x.abs().argmax())] += (1 - 2 * i) * 4e-6 * torch.sign(x[int(x.abs().argmax())])
    head = ScreenedArgmax(layer)
    assert int(head(x)) == _exact(layer, x) == 11 and head.rows_read >= 3
    with torch.no_grad():
        layer.weight[7] = layer.weight[11]
    head.refresh()
    assert int(head(x)) == 7 == int(layer(x).argmax())  # equal rows: the first, as torch.argmax
    with torch.no_grad():  # read as runs side by side, row 501 (a run's second row) comes before row 12
        layer.weight[12], layer.weight[501] = layer.weight[11], layer.weight[11]
        layer.weight[7], layer.weight[11] = -layer.weight[11], -layer.weight[11]
    head.refresh()
    assert int(head(x)) == 12 == int(layer(x).argmax())


def test_batches_and_what_it_cannot_bound_go_as_the_layer_gives_them():
    layer = _layer(300, 16, True)
    head = ScreenedArgmax(layer)
    x = torch.randn(2, 3, 16, generator=torch.Generator().manual_seed(0))
    assert torch.equal(head(x), layer(x).argmax(-1))
    for bad in (float("nan"), float("inf")):
        y = x[0, 0].clone()
        y[4] = bad
        assert int(head(y)) == int(layer(y).argmax()) and head.rows_read == 300
    with torch.no_grad():
        layer.weight[42, 3] = float("nan")  # a row whose output is NaN: the layer's argmax gives it
    head.refresh()
    assert int(head(x[0, 0])) == int(layer(x[0, 0]).argmax()) == 42
    half = nn.Linear(16, 300).to(torch.bfloat16)
    assert ScreenedArgmax(half).screen is None
    assert torch.equal(ScreenedArgmax(half)(x.to(torch.bfloat16)), half(x.to(torch.bfloat16)).argmax(-1))
    with pytest.raises(TypeError, match=r"^ScreenedArgmax screens an nn.Linear, got Conv1d$"):
        ScreenedArgmax(nn.Conv1d(3, 3, 1))


def test_a_weight_changed_in_place_or_replaced_is_screened_again():
    layer = _layer(2000, 32, True)
    head, x = ScreenedArgmax(layer), torch.randn(32, generator=torch.Generator().manual_seed(5))
    assert int(head(x)) == _exact(layer, x)
    with torch.no_grad():
        layer.weight.neg_()  # the old screen would bound the old logits
    assert int(head(x)) == _exact(layer, x)
    layer.weight = nn.Parameter(torch.randn(2000, 32, generator=torch.Generator().manual_seed(6)))
    assert int(head(x)) == _exact(layer, x)
