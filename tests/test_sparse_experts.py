"""A mixture's experts with exact ReLU gates (tiny random Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE configs): sparsify_
replaces the experts module transformers keeps as two tensors, each routed expert computed from its active units, equal
to the dense experts within a bound from the arithmetic, the same tokens decoded; what is not the formula stays."""
import copy
import io

import pytest
import torch

from lambda_gelu import _native
from lambda_gelu.inference.sparse import sparsify_
from lambda_gelu.inference.experts import SparseExperts, experts_problem, sparse_experts_reference
from lambda_gelu.inference.gated import FUSED_ROWS

transformers = pytest.importorskip("transformers")
H, UNITS, EXPERTS, K = 32, 48, 4, 2
FAMILIES = ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe"]
U32 = 2.0 ** -24


def _model(family="qwen3_moe", act="relu"):
    config = transformers.AutoConfig.for_model(
        family, hidden_size=H, intermediate_size=64, moe_intermediate_size=UNITS, shared_expert_intermediate_size=UNITS,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_local_experts=EXPERTS,
        num_experts=EXPERTS, num_experts_per_tok=K, vocab_size=100, max_position_embeddings=128, hidden_act=act,
        pad_token_id=0, eos_token_id=1, bos_token_id=2)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def _routing(tokens, seed=0):
    g = torch.Generator().manual_seed(seed)
    index = torch.stack([torch.randperm(EXPERTS, generator=g)[:K] for _ in range(tokens)])
    return torch.randn(tokens, H, generator=g), index, torch.rand(tokens, K, generator=g)


def _bound(experts, x, index, weights):
    """Σ_j |w_j|·(a_j ⊙ b_j)·|down_j|ᵀ times (2H + I + K + 4)·u, a_j = |x|·|gate_j|ᵀ and b_j = |x|·|up_j|ᵀ: the
    gate, up and down sums' roundings (H, H and I terms, in any order), the product, the weight and the k-term sum."""
    gate_up, down = experts.gate_up_proj.detach().double(), experts.down_proj.detach().double()
    units = down.shape[2]  # Mixtral's experts are intermediate_size wide, the others' moe_intermediate_size
    x64, out = x.double(), torch.zeros(len(x), H, dtype=torch.float64)
    for t in range(len(x)):
        for j in range(K):
            e = int(index[t, j])
            a, b = x64[t].abs() @ gate_up[e, :units].abs().t(), x64[t].abs() @ gate_up[e, units:].abs().t()
            out[t] += abs(float(weights[t, j])) * ((a * b) @ down[e].abs().t())
    return (2 * H + units + K + 4) * U32 * out + 1e-30


def _exact(experts, x, index, weights):
    return sparse_experts_reference(x.double(), experts.gate_up_proj.detach().double(),
                                    experts.down_proj.detach().double(), index, weights.double())


@pytest.mark.parametrize("family", FAMILIES)
def test_the_sparse_experts_equal_the_dense_ones_within_float_rounding_and_decode_the_same_tokens(family):
    from lambda_gelu.hf import LeanDecoder
    model = _model(family)
    dense = copy.deepcopy(model)
    replaced = sparsify_(model, min_weights=0)
    assert [n for n in replaced if n.endswith("experts")] == [f"model.layers.{i}.mlp.experts" for i in range(2)]
    for layer, dense_layer in zip(model.model.layers, dense.model.layers):
        experts = layer.mlp.experts
        assert isinstance(experts, SparseExperts)
        for tokens in (1, 3, 4 * FUSED_ROWS):  # decoding; a short prompt; experts with more tokens than the C call
            x, index, weights = _routing(tokens, seed=tokens)
            with torch.inference_mode():
                got, want = experts(x, index, weights), dense_layer.mlp.experts(x, index, weights)
            exact, bound = _exact(experts, x, index, weights), _bound(experts, x, index, weights)
            assert ((got.double() - exact).abs() <= bound).all(), (tokens, (got.double() - exact).abs().max())
            assert ((want.double() - exact).abs() <= bound).all()
    ids = torch.randint(3, 100, (1, 6), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        torch.testing.assert_close(model(ids).logits, dense(ids).logits, rtol=1e-5, atol=1e-5)
        want = dense.generate(ids, max_new_tokens=8, do_sample=False)
        assert torch.equal(model.generate(ids, max_new_tokens=8, do_sample=False), want)
    assert torch.equal(LeanDecoder(model).generate(ids, max_new_tokens=8), want)


def test_the_c_path_is_what_runs_and_equals_its_reference():
    assert _native.library() is not None, _native.error()  # built on every supported machine (test_compiled)
    experts = SparseExperts(_model().model.layers[0].mlp.experts)
    x, index, weights = _routing(FUSED_ROWS)
    calls = []
    original = experts._expert
    experts._expert = lambda *a: calls.append(a[1]) or original(*a)
    with torch.inference_mode():
        got = experts(x, index, weights)
    assert sorted(calls) == sorted(set(index.flatten().tolist()))  # one C call an expert routed to, none for others
    want = sparse_experts_reference(x, experts.gate_up_proj, experts.down_proj, index, weights)
    assert ((got.double() - want.double()).abs() <= 2 * _bound(experts, x, index, weights)).all()


def test_a_slot_routed_nowhere_adds_nothing():
    """transformers marks a token's slot that no expert takes (capacity, a masked expert) by the index E."""
    experts = SparseExperts(_model().model.layers[0].mlp.experts)
    x, index, weights = _routing(3)
    nowhere = index.clone()
    nowhere[:, 1] = EXPERTS
    with torch.inference_mode():
        got = experts(x, nowhere, weights)
    exact = _exact(experts, x, index[:, :1], weights[:, :1])
    assert ((got.double() - exact).abs() <= _bound(experts, x, index, weights)).all()


def test_the_int8_experts_are_their_dequantized_reference_within_rounding_and_near_the_float_ones():
    from lambda_gelu.inference.experts import _int8_reference
    model = _model()
    float_ = copy.deepcopy(model)
    sparsify_(model, min_weights=0, int8=True)
    sparsify_(float_, min_weights=0)
    experts = model.model.layers[0].mlp.experts
    assert "int8=True" in repr(experts)
    x, index, weights = _routing(5)
    with torch.inference_mode():
        got, near = experts(x, index, weights), float_.model.layers[0].mlp.experts(x, index, weights)
    want = _int8_reference(x.double(), {n: t.double() if t.is_floating_point() else t
                                        for n, t in experts._buffers.items()}, UNITS, index, weights.double())
    assert ((got.double() - want).abs() <= 2 * _bound(experts, x, index, weights) + 1e-6).all()
    assert (got - near).abs().max() <= 0.02 * near.abs().max()  # the weights' rounding: a few parts in a thousand


def test_the_state_dict_is_the_experts_and_the_copies_follow_what_they_were_made_from():
    model = _model()
    state = copy.deepcopy(model.state_dict())
    sparsify_(model, min_weights=0)
    assert model.state_dict().keys() == state.keys()
    experts = model.model.layers[0].mlp.experts
    x, index, weights = _routing(2)
    with torch.inference_mode():
        before = experts(x, index, weights)
    state["model.layers.0.mlp.experts.down_proj"] *= 2
    model.load_state_dict(state)
    with torch.inference_mode():
        torch.testing.assert_close(experts(x, index, weights), 2 * before, rtol=1e-5, atol=1e-6)
    twin = copy.deepcopy(model)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    with torch.no_grad():
        experts.gate_up_proj.neg_()  # a new gate in place: its screen made again, not the old one's units ruled out
        exact = _exact(experts, x, index, weights)
        assert ((experts(x, index, weights).double() - exact).abs() <= _bound(experts, x, index, weights)).all()
        for copied in (twin, loaded):
            torch.testing.assert_close(copied.model.layers[0].mlp.experts(x, index, weights), 2 * before, rtol=1e-5,
                                       atol=1e-6)


def test_the_sparse_experts_have_no_backward():
    model = _model()
    sparsify_(model, min_weights=0)
    x, index, weights = _routing(1)
    with pytest.raises(RuntimeError, match="SparseExperts is for inference and has no backward"):
        model.model.layers[0].mlp.experts(x.requires_grad_(), index, weights)


def test_experts_that_are_not_the_formula_or_not_relu_stay_dense_and_say_why():
    silu = _model(act="silu")
    with pytest.raises(ValueError, match="found no linear layer fed directly by an nn.ReLU.* a mixture's experts"):
        sparsify_(silu, min_weights=0)
    model = _model()
    experts = model.model.layers[0].mlp.experts
    experts.register_forward_hook(lambda *a: None)
    hooked = "has forward hooks (pruning's, an observer's, ...), which SparseExperts would drop"
    assert experts_problem(experts) == hooked
    infinite = _model().model.layers[0].mlp.experts
    infinite.down_proj.data[0, 0, 0] = float("inf")  # a skipped zero unit would hide 0·inf = NaN
    assert experts_problem(infinite) == "has non-finite weights: a skipped zero input would turn 0·inf = NaN into 0"
    other, forward = model.model.layers[1].mlp.experts, model.model.layers[1].mlp.experts.forward
    other.forward = lambda x, index, weights: 2 * forward(x, index, weights)
    assert experts_problem(other).startswith("computes something else than Σ w·down_e(relu(gate_e(x))")
    with pytest.raises(ValueError, match=r"found 2 experts module\(s\) with a ReLU gate, but can replace none: "
                                         r"'model.layers.0.mlp.experts' has forward hooks"):
        sparsify_(model, min_weights=0)
    assert not any(isinstance(m, SparseExperts) for m in model.modules())
    with pytest.raises(ValueError, match="smaller than min_weights"):
        sparsify_(_model())

