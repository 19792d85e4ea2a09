"""VNN-LIB beside ONNX: properties written, read back and decided from the ONNX file give the in-memory verifier's
verdicts; a known counterexample is found; what the reader or the ONNX chain does not model is refused by name."""
import pytest
import torch
import torch.nn as nn

from lambda_gelu.verify import verify_point
from lambda_gelu.vnnlib import VERDICTS, VNNLibError, read_robustness, write_robustness
from lambda_gelu_lab.cli import main

onnx = pytest.importorskip("onnx")


def _mlp():
    """A small ReLU MLP trained on three Gaussian blobs in 4-D: robust near the centres, not between them."""
    torch.manual_seed(0)
    centres = torch.tensor([[2.0, 0, 0, 0], [0, 2.0, 0, 0], [0, 0, 2.0, 0]])
    y = torch.arange(3).repeat_interleave(200)
    x = centres[y] + 0.6 * torch.randn(600, 4)
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(300):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model.eval(), x, y


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from lambda_gelu.deploy import export_onnx
    model, x, y = _mlp()
    path = tmp_path_factory.mktemp("onnx") / "mlp.onnx"
    export_onnx(model, x[:1], path)
    return model, x, y, path


def _verdict(capsys, onnx_path, vnnlib_path):
    assert main(["verify", str(onnx_path), str(vnnlib_path), "--time-limit", "20"]) == 0
    return capsys.readouterr().out.split()[0]


def test_exported_properties_read_back_give_the_in_memory_verdicts(exported, tmp_path, capsys):
    model, x, y, path = exported
    verdicts = []
    for i, eps in [(i, eps) for i in range(0, 600, 60) for eps in (0.05, 0.8)]:  # 20 properties
        point = x[i]
        label = int(model(point.unsqueeze(0)).argmax())
        lo, hi = (point - eps).numpy(), (point + eps).numpy()
        prop_path = write_robustness(tmp_path / f"p{i}_{eps}.vnnlib", lo, hi, label, 3)
        prop = read_robustness(prop_path)
        assert prop.label == label and (prop.lo == lo.astype("float64")).all() and (prop.hi == hi.astype("float64")).all()
        expected = VERDICTS[verify_point(model, torch.as_tensor((lo + hi) / 2), label, lo, hi, time_limit=20).status]
        verdicts.append(expected)
        assert _verdict(capsys, path, prop_path) == expected, (i, eps)
    assert {"sat", "unsat"} <= set(verdicts)  # both kinds were decided, not only one


def test_a_known_counterexample_is_found_and_printed_inside_the_box(exported, tmp_path, capsys):
    model, x, y, path = exported
    a, b = x[y == 0][0], x[y == 1][0]  # a box from a class-0 point to a class-1 point holds both classes
    lo, hi = torch.minimum(a, b).numpy(), torch.maximum(a, b).numpy()
    label = int(model(a.unsqueeze(0)).argmax())
    prop = write_robustness(tmp_path / "wide.vnnlib", lo, hi, label, 3)
    assert main(["verify", str(path), str(prop)]) == 0
    out = capsys.readouterr().out.split("\n")
    assert out[0] == "sat"
    values = [float(line.strip("()").split()[1]) for line in out[1:] if line.strip().startswith(("((X_", "(X_"))]
    cex = torch.tensor(values[:4])
    assert (cex >= torch.as_tensor(lo) - 1e-6).all() and (cex <= torch.as_tensor(hi) + 1e-6).all()
    assert int(model(cex.unsqueeze(0)).argmax()) != label


@pytest.mark.parametrize("text, construct", [
    ("(declare-const X_0 Real)(declare-const Y_0 Real)(declare-const Y_1 Real)"
     "(assert (<= X_0 1))(assert (>= X_0 0))(assert (<= (+ Y_0 Y_1) 0))", r"\(<= \(\+ Y_0 Y_1\) 0\)"),
    ("(declare-const X_0 Real)(declare-const Y_0 Real)(declare-const Y_1 Real)"
     "(assert (<= X_0 1))(assert (>= X_0 0))(assert (>= Y_1 0.5))", r"\(>= Y_1 0.5\)"),
    ("(declare-const X_0 Int)", "only 'X_i Real'"),
    ("(declare-const X_0 Real)(declare-const Y_0 Real)(declare-const Y_1 Real)"
     "(assert (>= X_0 0))(assert (>= Y_1 Y_0))", "X_0 has no upper bound"),
    ("(define-fun f () Real 1)", "command 'define-fun' is not supported"),
    ("(assert (<= X_0 1)", "unbalanced"),
])
def test_a_property_the_reader_does_not_support_is_refused_by_name(tmp_path, text, construct, exported, capsys):
    prop = tmp_path / "p.vnnlib"
    prop.write_text(text)
    with pytest.raises(VNNLibError, match=construct):
        read_robustness(prop)
    assert main(["verify", str(exported[3]), str(prop)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1


def test_an_onnx_graph_with_an_operator_the_verifier_does_not_model_is_refused(tmp_path, capsys):
    from lambda_gelu.deploy import export_onnx
    model = nn.Sequential(nn.Linear(4, 8), nn.Sigmoid(), nn.Linear(8, 2)).eval()
    path = tmp_path / "sigmoid.onnx"
    export_onnx(model, torch.randn(1, 4), path, allow_smooth=True)
    prop = write_robustness(tmp_path / "p.vnnlib", [0] * 4, [1] * 4, 0, 2)
    assert main(["verify", str(path), str(prop)]) == 2
    assert "operator Sigmoid" in capsys.readouterr().err
