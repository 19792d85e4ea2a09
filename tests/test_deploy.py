"""ONNX export check, int8 quantization with ONNX Runtime, and sparsity — needs the [deploy] extra."""
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import lambda_gelu as lg

pytest.importorskip("onnxruntime")
from lambda_gelu.deploy import onnx as deploy  # noqa: E402


def _mlp(act):
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 64), act(), nn.Linear(64, 64), act(), nn.Linear(64, 10))


def test_export_flags_gelu_and_passes_relu(tmp_path):
    gelu = _mlp(nn.GELU)
    with pytest.raises(ValueError, match="smooth nonlinearities \\{'Erf': 2\\}.*to_relu_"):
        deploy.export_onnx(gelu, torch.randn(1, 64), tmp_path / "gelu.onnx")
    report = deploy.export_onnx(gelu, torch.randn(1, 64), tmp_path / "gelu.onnx", allow_smooth=True)
    assert report.smooth_ops == {"Erf": 2}

    model = _mlp(nn.GELU)
    lg.convert_to_lambda_gelu_(model)
    lg.to_relu_(model)
    report = deploy.export_onnx(model, torch.randn(1, 64), tmp_path / "relu.onnx")
    assert report.smooth_ops == {} and report.nonlinear_ops == {"Relu": 2}
    runner = deploy.OnnxRunner(tmp_path / "relu.onnx")
    x = torch.randn(5, 64)  # batch dimension is dynamic
    np.testing.assert_allclose(runner(x.numpy()), model(x).detach().numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("head, op", [(lambda: nn.Softmax(-1), "Softmax"), (lambda: nn.LogSoftmax(-1), "LogSoftmax"),
                                      (lambda: nn.LayerNorm(10), "LayerNormalization"), (nn.Tanh, "Tanh")])
def test_export_flags_what_stays_smooth_in_a_relu_network(tmp_path, head, op):
    """A ReLU MLP is piecewise linear only up to its head: a softmax or a LayerNorm is not, and the
    check must not call the graph clean."""
    model = nn.Sequential(_mlp(nn.ReLU), head())
    with pytest.raises(ValueError, match=f"smooth nonlinearities {{'{op}': 1}}.*allow_smooth=True"):
        deploy.export_onnx(model, torch.randn(1, 64), tmp_path / "m.onnx")
    assert deploy.export_onnx(model, torch.randn(1, 64), tmp_path / "m.onnx", allow_smooth=True).smooth_ops == {op: 1}


def _digits():
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32)
    return x[:1400], torch.tensor(y[:1400]), x[1400:], torch.tensor(y[1400:])


@pytest.mark.parametrize("act", [nn.ReLU, nn.GELU])
def test_int8_keeps_accuracy_and_relu_graph_is_all_integer(tmp_path, act):
    xtr, ytr, xte, yte = _digits()
    model = _mlp(act)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(30):
        for i in range(0, len(xtr), 100):
            opt.zero_grad()
            F.cross_entropy(model(xtr[i:i + 100]), ytr[i:i + 100]).backward()
            opt.step()
    model.eval()
    fp32 = (model(xte).argmax(1) == yte).float().mean().item()
    deploy.export_onnx(model, xtr[:1], tmp_path / "m.onnx", allow_smooth=True)
    info = deploy.quantize_int8(tmp_path / "m.onnx", tmp_path / "m8.onnx", [xtr[i:i + 100].numpy() for i in range(0, 500, 100)])
    int8 = (deploy.OnnxRunner(tmp_path / "m8.onnx")(xte.numpy()).argmax(1) == yte.numpy()).mean()
    assert fp32 > 0.9
    assert abs(int8 - fp32) < 0.02  # stated tolerance: 2 accuracy points
    if act is nn.ReLU:
        assert info["float_ops"] == {} and info["op_counts"]["QGemm"] == 3
        assert info["op_counts"]["QuantizeLinear"] == 1 and info["op_counts"]["DequantizeLinear"] == 1
    else:
        assert info["float_ops"].get("Erf") == 2


def test_sparsity_on_a_hand_built_net():
    lin = nn.Linear(2, 3)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 0.0]]))
        lin.bias.copy_(torch.tensor([0.0, 0.0, -1.0]))
    model = nn.Sequential(lin, nn.ReLU())
    stats = deploy.activation_sparsity(model, [torch.tensor([[1.0, 5.0]]), torch.tensor([[2.0, -3.0]])])
    assert stats == {"1": {"zero_fraction": pytest.approx(4 / 6), "outputs": 6, "dead_fraction": pytest.approx(2 / 3)}}
    with pytest.raises(ValueError, match="no nn.ReLU"):
        deploy.activation_sparsity(nn.Sequential(nn.Linear(2, 2)), [torch.zeros(1, 2)])


@pytest.mark.parametrize("use", ["export_onnx", "activation_sparsity"])
def test_each_module_gets_its_own_mode_back(tmp_path, use):
    """A frozen eval-mode BatchNorm inside a model being trained stays in eval mode: model.train(was_training)
    would switch it back to train, and its running statistics would move at the next step."""
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Dropout(0.5), nn.Linear(4, 2)).train()
    model[1].eval()
    x = torch.randn(8, 3)
    if use == "export_onnx":
        deploy.export_onnx(model, x, tmp_path / "m.onnx")
    else:
        deploy.activation_sparsity(model, [x])
    assert model.training and not model[1].training and model[3].training


class _Baked(nn.Module):
    """A forward whose trace freezes a value of its example: the graph then computes something else."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 4)

    def forward(self, x):
        return torch.relu(self.linear(x)) * float(x.abs().sum())


def test_an_export_that_computes_something_else_than_torch_is_refused(tmp_path):
    with pytest.raises(ValueError, match="computes something else than torch.*not traced with"):
        deploy.export_onnx(_Baked(), torch.randn(1, 8), tmp_path / "baked.onnx", allow_smooth=True)


def test_interleaved_rounds_time_every_call_once_a_round():
    order = []
    times = deploy.time_interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, rounds=3,
                                    warmup=1)
    assert order == ["a", "b"] * 4 and {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3}
