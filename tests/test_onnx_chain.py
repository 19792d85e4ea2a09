"""What the verifier reads from ONNX: torch's own exports (shared weights included), and one clear line for what it
does not model exactly — another dtype, an operator of another domain, mismatched shapes, external data outside
the model's folder."""
import os

import numpy as np
import pytest
import torch
import torch.nn as nn

from lambda_gelu.verify.onnx_chain import OnnxChainError, load_onnx_chain
from onnx_nets import chain_onnx, run_onnx

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")


def test_an_export_with_shared_weights_reads_as_the_same_network(tmp_path):
    """torch's exporter stores equal weights once and adds an Identity of the initializer for the second use."""
    from lambda_gelu.deploy.onnx import export_onnx
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)).eval()
    with torch.no_grad():
        model[2].weight.copy_(model[0].weight), model[2].bias.copy_(model[0].bias)
    path = export_onnx(model, torch.randn(1, 4), tmp_path / "shared.onnx").path
    assert "Identity" in [n.op_type for n in onnx.load(path).graph.node]
    x = torch.randn(64, 4)
    with torch.no_grad():
        assert torch.allclose(load_onnx_chain(path)(x), model(x), atol=1e-6)


def _layers(seed=0, sizes=(3, 5, 2)):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(b, a)), rng.normal(size=b)) for a, b in zip(sizes, sizes[1:])]


def test_the_chain_computes_what_onnx_runtime_computes(tmp_path):
    path = chain_onnx(tmp_path / "n.onnx", _layers())
    x = np.random.default_rng(1).normal(size=(100, 3)).astype(np.float32)
    with torch.no_grad():
        ours = load_onnx_chain(path)(torch.from_numpy(x)).double().numpy()
    assert np.allclose(ours, run_onnx(path, x), atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_a_network_in_another_dtype_is_refused(tmp_path, dtype):
    with pytest.raises(OnnxChainError, match=f"{np.dtype(dtype).name}: the verifier models float32"):
        load_onnx_chain(chain_onnx(tmp_path / "n.onnx", _layers(), dtype=dtype))


def test_a_relu_of_another_domain_is_refused(tmp_path):
    with pytest.raises(OnnxChainError, match="domain 'com.example'"):
        load_onnx_chain(chain_onnx(tmp_path / "n.onnx", _layers(), relu_domain="com.example"))


def test_a_bias_of_the_wrong_length_is_one_line(tmp_path):
    (W0, b0), (W1, b1) = _layers()
    with pytest.raises(OnnxChainError, match="adds a bias of shape"):
        load_onnx_chain(chain_onnx(tmp_path / "n.onnx", [(W0, b0[:3]), (W1, b1)]))


def test_layers_whose_sizes_do_not_chain_are_one_line(tmp_path):
    (W0, b0), (W1, b1) = _layers()
    with pytest.raises(OnnxChainError, match="a layer of 5 outputs feeds one of 4 inputs"):
        load_onnx_chain(chain_onnx(tmp_path / "n.onnx", [(W0, b0), (W1[:, :4], b1)]))


def test_an_input_shape_that_is_not_one_row_a_sample_is_refused(tmp_path):
    with pytest.raises(OnnxChainError, match="does not give one row of 3 values"):
        load_onnx_chain(chain_onnx(tmp_path / "n.onnx", _layers(), input_shape=["N", 2, 3]))


def test_external_data_outside_the_models_folder_is_refused(tmp_path):
    """A weight stored as external data that links out of the folder is never read, whatever onnx would do."""
    from onnx.external_data_helper import convert_model_to_external_data
    model = onnx.load(str(chain_onnx(tmp_path / "n.onnx", _layers(sizes=(3, 64, 2)))))
    folder = tmp_path / "model"
    folder.mkdir()
    convert_model_to_external_data(model, location="weights.bin", size_threshold=0)
    onnx.save(model, str(folder / "m.onnx"))
    assert load_onnx_chain(folder / "m.onnx")[0].in_features == 3  # inside: read
    secret = tmp_path / "secret.bin"
    os.replace(folder / "weights.bin", secret)
    os.symlink(secret, folder / "weights.bin")
    with pytest.raises(OnnxChainError, match="not a regular file inside"):
        load_onnx_chain(folder / "m.onnx")
