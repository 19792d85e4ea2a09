"""VNN-LIB beside ONNX: properties written, read back and decided from the ONNX file give the in-memory verifier's
verdicts; a known counterexample is found; what the reader or the ONNX chain does not model is refused by name."""
import pytest
import torch
import torch.nn as nn

from lambda_gelu.verify import verify_point
from lambda_gelu.verify.vnnlib import VERDICTS, VNNLibError, read_property, read_robustness, write_robustness
from lambda_gelu.cli import main

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
    from lambda_gelu.deploy.onnx import export_onnx
    model, x, y = _mlp()
    path = tmp_path_factory.mktemp("onnx") / "mlp.onnx"
    export_onnx(model, x[:1], path)
    return model, x, y, path


def _verdict(capsys, onnx_path, vnnlib_path):
    assert main(["verify", str(onnx_path), str(vnnlib_path), "--time-limit", "20"]) == 0
    return capsys.readouterr().out.split()[0]


@pytest.mark.slow
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
     "(assert (<= X_0 1))(assert (>= X_0 0))(assert (<= (* Y_0 Y_1) 0))", r"\(\* Y_0 Y_1\) .* is not linear"),
    ("(declare-const X_0 Real)(declare-const Y_0 Real)(declare-const Y_1 Real)"
     "(assert (<= X_0 1))(assert (>= X_0 0))(assert (< Y_1 0.5))", r"\(< Y_1 0.5\)"),
    ("(declare-const X_0 Real)(declare-const Y_0 Real)(declare-const Y_1 Real)"
     "(assert (<= X_0 1))(assert (or (>= X_0 0) (>= Y_1 Y_0)))", "inputs take only bounds"),
    ("(declare-const X_0 Real)(declare-const Y_0 Real)(declare-const Y_1 Real)"
     "(assert (<= X_0 1))(assert (>= X_0 0))(assert (not (>= Y_1 Y_0)))", r"\(not"),
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
        read_property(prop)
    assert main(["verify", str(exported[3]), str(prop)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1


def test_an_onnx_graph_with_an_operator_the_verifier_does_not_model_is_refused(tmp_path, capsys):
    from lambda_gelu.deploy.onnx import export_onnx
    model = nn.Sequential(nn.Linear(4, 8), nn.Sigmoid(), nn.Linear(8, 2)).eval()
    path = tmp_path / "sigmoid.onnx"
    export_onnx(model, torch.randn(1, 4), path, allow_smooth=True)
    prop = write_robustness(tmp_path / "p.vnnlib", [0] * 4, [1] * 4, 0, 2)
    assert main(["verify", str(path), str(prop)]) == 2
    assert "operator Sigmoid" in capsys.readouterr().err


def _three_outputs(tmp_path):
    """Y_0 = 0.5, Y_1 = x, Y_2 = −x on x ∈ [−1, 1]: Y_1 ≥ Y_0 and Y_2 ≥ Y_0 never hold together."""
    import numpy as np
    from onnx_nets import chain_onnx
    hidden = (np.array([[1.0], [-1.0]]), np.zeros(2))
    out = (np.array([[0.0, 0.0], [1.0, -1.0], [-1.0, 1.0]]), np.array([0.5, 0.0, 0.0]))
    return chain_onnx(tmp_path / "three.onnx", [hidden, out])


_BOX = "(declare-const X_0 Real)(assert (>= X_0 -1))(assert (<= X_0 1))"


def _decide(capsys, net, prop_path, text):
    prop_path.write_text(text)
    code = main(["verify", str(net), str(prop_path)])
    out, err = capsys.readouterr()
    return code, out.split("\n")[0] if code == 0 else err.strip()


def test_separate_asserts_hold_together(tmp_path, capsys):
    net, p = _three_outputs(tmp_path), tmp_path / "p.vnnlib"
    ys = "".join(f"(declare-const Y_{j} Real)" for j in range(3))
    assert _decide(capsys, net, p, _BOX + ys + "(assert (>= Y_1 Y_0))(assert (>= Y_2 Y_0))") == (0, "unsat")
    assert _decide(capsys, net, p, _BOX + ys + "(assert (and (>= Y_1 Y_0) (>= Y_2 Y_0)))") == (0, "unsat")
    assert _decide(capsys, net, p, _BOX + ys + "(assert (or (>= Y_1 Y_0) (>= Y_2 Y_0)))") == (0, "sat")
    # a conjunction that can hold: Y_1 ≥ Y_0 and Y_2 ≤ −0.7 (x ≥ 0.7)
    code, verdict = _decide(capsys, net, p, _BOX + ys + "(assert (>= Y_1 Y_0))(assert (<= (- Y_2) -0.7 ))")
    assert (code, verdict) == (0, "unsat")  # −Y_2 = x ≤ −0.7 contradicts Y_1 = x ≥ 0.5
    assert _decide(capsys, net, p, _BOX + ys + "(assert (>= Y_1 Y_0))(assert (<= Y_2 (* 2 -0.35)))") == (0, "sat")


@pytest.mark.parametrize("declared, why", [
    ("(declare-const Y_0 Real)(declare-const Y_1 Real)", "declares 2 outputs, but the network has 3"),
    ("".join(f"(declare-const Y_{j} Real)" for j in range(4)), "declares Y_3, but the network has 3 outputs"),
])
def test_outputs_the_network_does_not_have_are_refused(tmp_path, capsys, declared, why):
    code, err = _decide(capsys, _three_outputs(tmp_path), tmp_path / "p.vnnlib",
                        _BOX + declared + "(assert (>= Y_1 Y_0))")
    assert code == 2 and why in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("inputs, why", [
    ("(declare-const X_0 Real)(declare-const X_1 Real)(assert (>= X_0 -1))(assert (<= X_0 1))",
     "declares X_1, but the network has 1 inputs"),
    ("(declare-const X_0 Real)(assert (>= X_0 -1))", "X_0 has no upper bound"),
])
def test_inputs_the_network_does_not_have_or_unbounded_are_refused(tmp_path, capsys, inputs, why):
    ys = "".join(f"(declare-const Y_{j} Real)" for j in range(3))
    code, err = _decide(capsys, _three_outputs(tmp_path), tmp_path / "p.vnnlib", inputs + ys + "(assert (>= Y_1 Y_0))")
    assert code == 2 and why in err


def test_a_robustness_property_reads_back_as_its_label(tmp_path):
    prop = write_robustness(tmp_path / "r.vnnlib", [0, 0], [1, 1], 2, 4)
    r = read_robustness(prop)
    assert (r.label, r.num_classes) == (2, 4)
    general = read_property(prop)
    assert len(general.unsafe) == 3 and all(C.shape == (1, 4) and d[0] == 0 for C, d in general.unsafe)
    (tmp_path / "c.vnnlib").write_text(prop.read_text() + "(assert (>= Y_0 0.5))")
    with pytest.raises(VNNLibError, match="not a classification-robustness property"):
        read_robustness(tmp_path / "c.vnnlib")


def _one_line_within(capsys, args, limit_bytes):
    """The CLI's exit code and message, with the peak memory Python allocated on the way."""
    import tracemalloc
    tracemalloc.start()
    code = main(args)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    err = capsys.readouterr().err.strip()
    assert peak < limit_bytes, f"{peak / 2**20:.0f} MiB"
    assert code == 2 and err.startswith("error: ") and len(err.splitlines()) == 1, err
    return err


@pytest.mark.slow
def test_hostile_property_files_are_one_line_in_bounded_memory(tmp_path, capsys, exported):
    net = str(exported[3])
    deep = tmp_path / "deep.vnnlib"
    deep.write_text("(assert " + "(and " * 600 + "(>= Y_1 Y_0)" + ")" * 601)
    assert "nested deeper than" in _one_line_within(capsys, ["verify", net, str(deep)], 64 << 20)
    parens = tmp_path / "parens.vnnlib"
    parens.write_text("(" * (50 << 20))
    assert "nested deeper than" in _one_line_within(capsys, ["verify", net, str(parens)], 64 << 20)
    atom = tmp_path / "atom.vnnlib"
    atom.write_text("(assert " + "7" * (20 << 20) + ")")
    assert "longer than" in _one_line_within(capsys, ["verify", net, str(atom)], 64 << 20)
    comment = tmp_path / "comment.vnnlib"  # a comment never ends: skipped a chunk at a time, nothing kept
    comment.write_text("; " + "x" * (40 << 20))
    assert "must all be declared" in _one_line_within(capsys, ["verify", net, str(comment)], 64 << 20)
    big = tmp_path / "big.vnnlib"  # valid-looking and huge: many asserts of one disjunction
    with open(big, "w") as f:
        f.write("".join(f"(declare-const X_{i} Real)" for i in range(4)))
        f.write("".join(f"(declare-const Y_{j} Real)" for j in range(3)))
        f.write("".join(f"(assert (<= X_{i} 1))(assert (>= X_{i} 0))" for i in range(4)))
        f.write("(assert (or " + "(>= Y_1 Y_0) " * 3_000_000 + "))")
    assert "tokens: too large" in _one_line_within(capsys, ["verify", net, str(big)], 256 << 20)


@pytest.mark.skipif(not __import__("os").path.exists("/dev/zero"), reason="needs /dev/zero")
def test_an_endless_file_as_property_is_one_line(capsys, exported):
    assert "longer than" in _one_line_within(capsys, ["verify", str(exported[3]), "/dev/zero"], 64 << 20)
