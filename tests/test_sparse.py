"""lambda_gelu.inference.sparse: the sparse-input linear layer equals the dense one within the rounding of its sums,
sparsify_ finds exactly the layers fed by a ReLU (nn.Sequential, GPT-2, BERT, MPNet), and refuses clearly."""
import pytest
import torch
import torch.nn as nn
import torch.nn.utils.prune as prune
from torch.nn.utils import parametrize

import lambda_gelu as lg
from lambda_gelu import _native
from lambda_gelu.inference.sparse import SparseLinear, sparse_linear_reference, sparsify_

EPS = torch.finfo(torch.float32).eps


def _relu_input(n, width, zeros, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, width, generator=g).abs()
    return torch.where(torch.rand(n, width, generator=g) < zeros, 0.0, x)


def assert_close_to_dense(y, x, weight_t, bias):
    """|y − exact| ≤ γ_k · (Σ|x_i w_ij| + |b_j|) in float32, exact computed in float64, k the number of
    terms (the standard bound for a sum of products in any order, with or without fused multiply-adds)."""
    x64, w64 = x.double().reshape(-1, x.shape[-1]), weight_t.double()
    exact = x64 @ w64 + (0 if bias is None else bias.double())
    k = x.shape[-1] + 1
    bound = k * EPS / (1 - k * EPS) * (x64.abs() @ w64.abs() + (0 if bias is None else bias.double().abs()))
    err = (y.double().reshape(exact.shape) - exact).abs()
    assert (err <= bound + 1e-30).all(), (err - bound).max()


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    """The kernel's serial path and its parallel one (taken when the work exceeds a grain per thread)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(previous)


@pytest.mark.parametrize("n", [1, 4, 16])
@pytest.mark.parametrize("zeros", [0.5, 0.9, 0.99, 1.0])
def test_sparse_linear_equals_dense_within_rounding(n, zeros, threads):
    torch.manual_seed(0)
    dense = nn.Linear(384, 96)
    x = _relu_input(n, 384, zeros)
    layer = SparseLinear.from_dense(dense, max_density=1.0)  # always the sparse path
    with torch.inference_mode():
        y = layer(x)
    assert y.shape == (n, 96)
    assert_close_to_dense(y, x, dense.weight.t(), dense.bias)
    assert_close_to_dense(sparse_linear_reference(x, layer.weight_t, dense.bias), x, dense.weight.t(), dense.bias)
    if zeros == 1.0:  # nothing active: exactly the bias
        assert torch.equal(y, dense.bias.detach().expand(n, 96))


def test_the_c_kernel_is_what_runs():
    assert _native.library() is not None, _native.error()  # built on every supported machine (test_compiled)
    layer = SparseLinear.from_dense(nn.Linear(64, 8), max_density=1.0)
    x = _relu_input(2, 64, 0.8)
    with torch.inference_mode():
        fast = layer(x)
    torch.testing.assert_close(fast, sparse_linear_reference(x, layer.weight_t, layer.bias), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", [1, 3, 16])
def test_the_kernels_union_of_active_inputs_is_active_inputs(n):
    """The C kernel lists the batch's active inputs itself; the list equals the torch reference's,
    NaN counted as active and −0 as zero as `x != 0` does, for one row and several."""
    from lambda_gelu.inference.sparse import active_inputs
    kernels = _native.library()
    assert kernels is not None, _native.error()
    for zeros in (0.0, 0.9, 1.0):
        x = _relu_input(n, 300, zeros, seed=n)
        x[0, 7], x[-1, 11] = float("nan"), -0.0
        out = torch.full((300,), -1, dtype=torch.int64)
        k = kernels.active_union_f32(x.data_ptr(), n, 300, out.data_ptr())
        assert torch.equal(out[:k], active_inputs(x)), (zeros, k)


def test_leading_dimensions_no_bias_and_dense_fallback():
    torch.manual_seed(1)
    dense = nn.Linear(128, 32, bias=False)
    x = _relu_input(6, 128, 0.9).reshape(2, 3, 128)
    with torch.inference_mode():
        y = SparseLinear.from_dense(dense, max_density=1.0)(x)
        assert y.shape == (2, 3, 32)
        assert_close_to_dense(y, x, dense.weight.t(), None)
        busy = _relu_input(4, 128, 0.1)  # 90% active: over max_density, so the dense layer runs, bit for bit
        assert torch.equal(SparseLinear.from_dense(dense, max_density=0.35)(busy), dense(busy))


def test_wrong_input_width_is_one_clear_error():
    layer = SparseLinear.from_dense(nn.Linear(64, 16), max_density=1.0)
    with torch.inference_mode(), pytest.raises(ValueError, match=r"last dimension must be 64"):
        layer(torch.rand(4, 32))  # 128 numbers: as many as two rows of 64, so only the check can tell


def test_other_dtypes_use_the_reference():
    dense = nn.Linear(64, 16).double()
    x = _relu_input(3, 64, 0.8).double()
    with torch.inference_mode():
        torch.testing.assert_close(SparseLinear.from_dense(dense, 1.0)(x), dense(x))


def test_inference_only():
    layer = SparseLinear.from_dense(nn.Linear(8, 4))
    with pytest.raises(RuntimeError, match="for inference"):
        layer(torch.rand(2, 8))
    with torch.no_grad():
        layer(torch.rand(2, 8))


def test_state_dict_is_the_dense_layers():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    sparsify_(model, min_weights=0)
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_load_state_dict_reaches_the_sparse_path():
    torch.manual_seed(0)
    model, other = (nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 8)) for _ in range(2))
    sparsify_(model, max_density=1.0, min_weights=0)
    model.load_state_dict(other.state_dict())  # writes `weight`; the kernel reads the transposed copy
    x = torch.randn(3, 8)
    with torch.inference_mode():
        torch.testing.assert_close(model(x), other(x))


def test_float32_layer_under_a_float64_default_dtype():
    dense = nn.Linear(64, 16)
    x = _relu_input(2, 64, 0.9)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # the kernel's buffers must not follow it
    try:
        with torch.inference_mode():
            torch.testing.assert_close(SparseLinear.from_dense(dense, 1.0)(x), dense(x))
    finally:
        torch.set_default_dtype(previous)


def test_sparsify_sequential_only_after_relu():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 16),
                          nn.Sequential(nn.ReLU(), nn.Linear(16, 4)))
    x = torch.randn(5, 8)
    with torch.inference_mode():
        ref = model(x)
        assert sparsify_(model, min_weights=0) == ["2", "5.1"]
        assert isinstance(model[4], nn.Linear)  # fed by a GELU (negative outputs, no zeros): left alone
        torch.testing.assert_close(model(x), ref)


def test_sparsify_refuses_models_without_eligible_layers():
    with pytest.raises(ValueError, match="no linear layer fed directly by an nn.ReLU"):
        sparsify_(nn.Sequential(nn.Linear(4, 4), nn.GELU(), nn.Linear(4, 4)))
    weird = nn.Sequential(nn.ReLU(), nn.Linear(4, 4))
    with torch.no_grad():
        weird[1].weight[0, 0] = float("inf")  # a skipped zero input would hide 0·inf = NaN
    with pytest.raises(ValueError, match="found 1 linear layer.*none it can replace.*'1' has non-finite weights"):
        sparsify_(weird)


def _qat_linear(n_in, n_out):
    import torch.ao.nn.qat as qat
    return qat.Linear(n_in, n_out, qconfig=torch.ao.quantization.get_default_qat_qconfig("fbgemm"))


def _parametrized(layer):
    class Doubled(nn.Module):
        def forward(self, w):
            return 2 * w
    parametrize.register_parametrization(layer, "weight", Doubled())
    return layer


def _pruned(layer):
    prune.l1_unstructured(layer, "weight", amount=0.5)  # weight = weight_orig · mask, in a pre-hook
    return layer


def _hooked(layer):
    layer.register_forward_hook(lambda mod, args, out: 2 * out)
    return layer


@pytest.mark.parametrize("make, why", [
    (_qat_linear, "is a Linear with a forward of its own"),  # fake-quantizes its weight in forward
    (lambda i, o: _parametrized(nn.Linear(i, o)), "has a parametrization"),
    (lambda i, o: _pruned(nn.Linear(i, o)), "has forward hooks"),
    (lambda i, o: _hooked(nn.Linear(i, o)), "has forward hooks"),
])
def test_sparsify_never_replaces_a_layer_it_would_not_reproduce(make, why):
    """A SparseLinear computes x·Wᵀ + b and nothing else: a layer that computes more (its own forward, a
    parametrization, hooks the replacement would drop) is left as it is, so the outputs do not move."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), make(64, 64), nn.ReLU(), nn.Linear(64, 8)).eval()
    x = torch.randn(5, 16)
    with torch.no_grad():
        model(x)  # the QAT layer's observers see data once
        ref = model(x)
    with torch.inference_mode():
        assert sparsify_(model, min_weights=0) == ["4"]  # the plain layer only
        torch.testing.assert_close(model(x), ref)
    alone = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), make(64, 64)).eval()
    with pytest.raises(ValueError, match=f"none it can replace without changing what it computes: '2' {why}"):
        sparsify_(alone, min_weights=0)


def test_sparsify_leaves_small_layers_dense():
    """Below MIN_WEIGHTS the sparse path's fixed cost per call outweighs its saving: such layers stay
    nn.Linear unless min_weights=0; a model with only small ones gets an error saying so."""
    from lambda_gelu.inference.sparse import MIN_WEIGHTS
    small, large = 64, MIN_WEIGHTS // 64  # layer 2: 64 × 64 weights; 4: 64 × large = MIN_WEIGHTS; 6: large × 4
    model = nn.Sequential(nn.Linear(8, small), nn.ReLU(), nn.Linear(small, small), nn.ReLU(), nn.Linear(small, large),
                          nn.ReLU(), nn.Linear(large, 4))
    assert sparsify_(model) == ["4"]
    assert type(model[2]) is nn.Linear and isinstance(model[4], SparseLinear) and type(model[6]) is nn.Linear
    assert sparsify_(model, min_weights=0) == ["2", "6"]  # the rest; "4" is no longer an nn.Linear
    only_small = nn.Sequential(nn.Linear(8, small), nn.ReLU(), nn.Linear(small, 4))
    with pytest.raises(ValueError, match=r"all are smaller than min_weights=\d+ weights \(largest: 256\).*min_weights=0"):
        sparsify_(only_small)
    for bad in (-1, 0.5, True):
        with pytest.raises(ValueError, match="min_weights is a number of weights"):
            sparsify_(only_small, min_weights=bad)


@pytest.mark.parametrize("family", ["gpt2", "bert", "mpnet"])
def test_sparsify_hugging_face_blocks(family):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if family == "gpt2":
        cfg = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=50, activation_function="relu")
        model, expected = transformers.GPT2Model(cfg), ["h.0.mlp.c_proj", "h.1.mlp.c_proj"]
    else:
        Config, Model = ((transformers.BertConfig, transformers.BertModel) if family == "bert"
                         else (transformers.MPNetConfig, transformers.MPNetModel))
        cfg = Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                     vocab_size=50, hidden_act="relu")
        model = Model(cfg)
        expected = [f"encoder.layer.{i}.output.dense" for i in range(2)]
    model.eval()
    ids = torch.randint(0, 50, (2, 7))
    with torch.inference_mode():
        ref = model(input_ids=ids).last_hidden_state
        assert sparsify_(model, max_density=1.0, min_weights=0) == expected
        torch.testing.assert_close(model(input_ids=ids).last_hidden_state, ref, rtol=1e-4, atol=1e-5)


UNGATED = {  # an ungated FFN as each family names it, ReLU: the second projection's qualified name in layer i
    "gpt_neox": (lambda t: t.GPTNeoXConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                           num_attention_heads=2, hidden_act="relu", vocab_size=50),
                 "gpt_neox.layers.{}.mlp.dense_4h_to_h"),
    "starcoder2": (lambda t: t.Starcoder2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                num_attention_heads=2, num_key_value_heads=1, hidden_act="relu",
                                                vocab_size=50), "model.layers.{}.mlp.c_proj"),
    "phi": (lambda t: t.PhiConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                  hidden_act="relu", vocab_size=50), "model.layers.{}.mlp.fc2"),
    "gptj": (lambda t: t.GPTJConfig(n_embd=32, n_layer=2, n_head=2, rotary_dim=8, activation_function="relu",
                                    vocab_size=50), "transformer.h.{}.mlp.fc_out"),
    "opt": (lambda t: t.OPTConfig(hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=2,
                                  word_embed_proj_dim=32, activation_function="relu", vocab_size=50),
            "model.decoder.layers.{}.fc2"),
}


@pytest.mark.parametrize("family", list(UNGATED))
def test_sparsify_finds_the_ungated_ffns_of_other_families(family):
    """GPT-NeoX (Pythia), StarCoder2, Phi, GPT-J and OPT name their FFN's projections otherwise than GPT-2: their
    second projection reads the ReLU's output all the same, and is replaced; the model computes what it did."""
    transformers = pytest.importorskip("transformers")
    make, name = UNGATED[family]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(make(transformers)).eval()
    ids = torch.randint(0, 50, (2, 7))
    with torch.inference_mode():
        ref = model(ids).logits
        assert sparsify_(model, max_density=1.0, min_weights=0) == [name.format(i) for i in range(2)]
        assert all(isinstance(model.get_submodule(name.format(i)), SparseLinear) for i in range(2))
        torch.testing.assert_close(model(ids).logits, ref, rtol=1e-4, atol=1e-5)


def test_sparsify_leaves_gelu_hugging_face_blocks_alone():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                  vocab_size=50)  # hidden_act="gelu"
    with pytest.raises(ValueError, match="no linear layer"):
        sparsify_(transformers.BertModel(cfg))


def test_lab_models_after_relu_substitution():
    from lambda_gelu_lab.models import MLP, Block
    mlp, block = MLP(20, (64, 64), 5, nn.GELU), Block(16, 2, 4, nn.GELU)
    for model in (mlp, block):
        lg.to_relu_(model, include_gelu=True)  # the direct swap
    assert sparsify_(mlp, min_weights=0) == ["3", "5"]  # Flatten, Linear, ReLU, Linear, ReLU, Linear
    assert sparsify_(block, min_weights=0) == ["mlp.2"]


def test_sparsifying_twice_says_the_model_is_already_sparsified():
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))
    sparsify_(model, min_weights=0)
    with pytest.raises(ValueError, match="already sparsified: 1 of its modules"):
        sparsify_(model, min_weights=0)
