"""The gate threshold (``gate_zeros``): a bias lowered on every ReLU gate of a gated FFN until the share of exact
zeros asked for is reached; the function is unchanged when the biases are added, the checkpoint reloads with them
in plain transformers (mlp_bias), the sparse block reads them, a share per layer gives each layer its own, the
share can be reached at once, before the refit (``gate_zeros_at_once``), and a family that could not save them is
refused before anything changes."""
import copy
import importlib

import pytest
import torch

import lambda_gelu as lg
from lambda_gelu.hf.evaluate import relu_zeros
from lambda_gelu.reluize import GateThreshold, ReluizeConfig, Reluizer, refit_after_swap_
from lambda_gelu.reluize.threshold import shift_gates_
from lambda_gelu.inference.sparse import sparsify_

transformers = pytest.importorskip("transformers")
SMALL = dict(hidden_size=32, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
             vocab_size=100, max_position_embeddings=64)


def _model(config_class=None):
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config((config_class or transformers.LlamaConfig)(**SMALL)).eval()


def _batches(n=4):
    g = torch.Generator().manual_seed(1)
    return [{"input_ids": torch.randint(0, 100, (4, 12), generator=g)} for _ in range(n)]


def test_the_gates_reach_the_share_of_zeros_and_the_checkpoint_reloads_with_its_biases(tmp_path):
    model, batches = _model(), _batches()
    swapped = copy.deepcopy(model)
    lg.to_relu_(swapped, include_gelu=True)
    before = relu_zeros(swapped, batches)
    lg.reluize(model, batches, steps=40, gate_zeros=0.9, lr=1e-3)
    zeros = relu_zeros(model, batches)
    assert sum(before.values()) / 2 < 0.6  # a random gate: about half its outputs are zero
    assert abs(sum(zeros.values()) / 2 - 0.9) < 0.03  # averaged over the layers, on the batches it trained on
    assert model.config.mlp_bias is True and model.model.layers[0].mlp.gate_proj.bias.max() < 0
    model.save_pretrained(tmp_path)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    tokens = batches[0]
    with torch.no_grad():
        want = model(**tokens).logits
        torch.testing.assert_close(reloaded(**tokens).logits, want, rtol=0, atol=0)
    dense = copy.deepcopy(reloaded)
    assert sparsify_(reloaded, min_weights=0) == ["model.layers.0.mlp", "model.layers.1.mlp"]
    with torch.inference_mode():  # the sparse blocks read the biases: the same greedy tokens
        prompt = {"input_ids": tokens["input_ids"][:1, :5]}
        assert torch.equal(reloaded.generate(**prompt, max_new_tokens=6, do_sample=False),
                           dense.generate(**prompt, max_new_tokens=6, do_sample=False))


def test_adding_the_biases_leaves_the_function_as_it_was_and_the_optimizer_built_after_trains_them():
    model, batch = _model(), _batches(1)[0]
    with torch.no_grad():
        want = model(**batch).logits
    reluizer = Reluizer(model, total_steps=10, gate_zeros=0.8, schedule="anneal")
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, want)  # zero biases, and the anneal at λ = 1
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    biases = [model.model.layers[0].mlp.up_proj.bias]
    assert any(p is biases[0] for p in optimizer.param_groups[0]["params"])
    reluizer.loss(batch).backward()
    optimizer.step()
    reluizer.step()
    assert reluizer.state_dict()["threshold"]["step"] == 1 and reluizer.threshold.start is not None
    reluizer.finish()
    assert not model.model.layers[0].mlp.gate_proj._forward_hooks  # the sampling hooks are gone


def test_a_family_that_cannot_save_the_biases_is_refused_before_anything_changes():
    model = _model(transformers.Qwen2Config)  # no mlp_bias: its checkpoint would load without them
    state = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match=r"^gate_zeros: Qwen2ForCausalLM's config has no mlp_bias"):
        lg.reluize(model, _batches(), steps=2, gate_zeros=0.9)
    assert model.model.layers[0].mlp.gate_proj.bias is None and type(model.model.layers[0].mlp.act_fn) is not \
        torch.nn.ReLU
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=100))
    with pytest.raises(ValueError, match="no gated FFN"):
        lg.reluize(gpt2, _batches(), steps=2, gate_zeros=0.9)
    with pytest.raises(ValueError, match="no gated FFN"):
        GateThreshold(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.GELU()), 10, 0.9)
    # gate and up in one layer: a bias there would shift up's half too
    phi3 = transformers.AutoModelForCausalLM.from_config(transformers.Phi3Config(**SMALL, pad_token_id=0))
    with pytest.raises(ValueError, match=r"^gate_zeros: its gated FFNs hold gate and up in one layer \(gate_up_proj\)"):
        lg.reluize(phi3, _batches(), steps=2, gate_zeros=0.9)
    assert phi3.model.layers[0].mlp.gate_up_proj.bias is None


def test_a_share_per_layer_gives_each_layer_its_own_share_of_zeros():
    """One share per gated FFN: each layer's gates shift by their own quantile, so the layers end as unequally
    sparse as asked (one pooled shift would leave them where their gates sit)."""
    model, batches = _model(), _batches()
    lg.to_relu_(model, include_gelu=True)
    threshold = GateThreshold(model, total_steps=40, target=[0.6, 0.95])
    for step in range(40):
        model(**batches[step % len(batches)])  # grad enabled: a training forward, sampled
        threshold.step()
    threshold.remove()
    zeros = list(relu_zeros(model, batches).values())
    assert abs(zeros[0] - 0.6) < 0.03 and abs(zeros[1] - 0.95) < 0.03
    assert threshold.start.shape == (2,) and threshold.state_dict()["step"] == 40


def test_the_gates_shifted_before_the_refit_start_at_the_share_and_the_refit_solves_for_them():
    """``gate_zeros_at_once``: the gates lowered at once to the share on the refit's batches, the swap, then the refit
    solves each FFN's ``down`` for the shifted ReLU gates: the same weights as :func:`shift_gates_` then
    :func:`refit_after_swap_` give, and the share of zeros asked for before any step."""
    model, batches = _model(), _batches()
    by_hand = copy.deepcopy(model)
    result = lg.reluize(model, batches, steps=10, gate_zeros=0.9, gate_zeros_at_once=True, refit=len(batches),
                        callback=lambda entry: True)  # stopped after the refit, before the first step
    assert result.stopped and result.log[-1]["step"] == 0
    shift = shift_gates_(by_hand, batches, 0.9)
    refit_after_swap_(by_hand, batches)
    gates = [(a.mlp.gate_proj.bias, b.mlp.gate_proj.bias) for a, b in zip(model.model.layers, by_hand.model.layers)]
    assert shift > 0 and all(torch.equal(a, b) and torch.all(a == -shift) for a, b in gates)
    for mine, theirs in zip(model.model.layers, by_hand.model.layers):
        torch.testing.assert_close(mine.mlp.down_proj.weight, theirs.mlp.down_proj.weight, rtol=0, atol=0)
        torch.testing.assert_close(mine.mlp.down_proj.bias, theirs.mlp.down_proj.bias, rtol=0, atol=0)
    zeros = list(relu_zeros(model, batches).values())  # pooled: near the share, the second layer's input moved
    assert abs(sum(zeros) / 2 - 0.9) < 0.02 and all(abs(z - 0.9) < 0.05 for z in zeros)
    for at_once in (True, False):  # no refit: the first batch gives the shift, held from the first step on
        without = _model()
        lg.reluize(without, batches, steps=8, gate_zeros=0.9, gate_zeros_at_once=at_once, callback=lambda e: True)
        share = sum(relu_zeros(without, batches).values()) / 2
        assert abs(share - 0.9) < 0.03 if at_once else share < 0.6  # ramped: a step of eight from the model's own


@pytest.mark.parametrize("shares", [[0.9], [0.9, 0.9, 0.9], [0.5, 1.0], [-0.1, 0.5]])
def test_shares_not_one_per_gated_ffn_in_range_are_one_line_and_change_nothing(shares):
    model = _model()
    with pytest.raises(ValueError, match=r"^gate_zeros: one share in \[0, 1\) per gated FFN, 2 here; got "):
        GateThreshold(model, 10, shares)
    assert model.model.layers[0].mlp.gate_proj.bias is None and not model.config.mlp_bias


@pytest.mark.parametrize("settings, message", [
    (dict(gate_zeros=1.0), r"gate_zeros is a share of zeros to reach, in \[0, 1\); got 1.0"),
    (dict(gate_zeros=-0.1), r"gate_zeros is a share"),
    (dict(gate_zeros=0.9, schedule="blockwise"), "gate_zeros: not used by schedule='blockwise'"),
    (dict(gate_zeros_at_once=True),
     r"^gate_zeros_at_once: lowers the gates to gate_zeros at once; give gate_zeros > 0 with it, or leave it out"),
    (dict(gate_zeros=0.9, gate_zeros_at_once="yes"), r"^gate_zeros_at_once is True or False, got 'yes'"),
])
def test_a_bad_share_is_one_line(settings, message):
    with pytest.raises(ValueError, match=message):
        ReluizeConfig(**settings)


def test_the_threshold_trains_at_its_own_default_learning_rate_unless_one_is_given(monkeypatch):
    """Shifting the gates costs more than the swap, so the distillation repairs it at 10× the swap's default rate
    (studies/smollm2_sparsity.md); an lr given is kept, and ``replace`` resolves the default afresh."""
    assert ReluizeConfig().learning_rate == 5e-5
    assert ReluizeConfig(gate_zeros=0.8).learning_rate == 5e-4
    assert ReluizeConfig(gate_zeros=0.8, lr=1e-4).learning_rate == 1e-4
    assert ReluizeConfig().replace(gate_zeros=0.8).learning_rate == 5e-4
    api = importlib.import_module("lambda_gelu.reluize.api")  # lambda_gelu.reluize is also the function
    rates, adamw = [], api.adamw
    monkeypatch.setattr(api, "adamw", lambda model, lr, decay: rates.append(lr) or adamw(model, lr, decay))
    for settings in (dict(gate_zeros=0.8), dict(gate_zeros=0.8, lr=1e-4), {}):
        lg.reluize(_model(), _batches(1), steps=1, **settings)
    assert rates == [5e-4, 1e-4, 5e-5]
    with pytest.raises(ValueError, match=r"^lr is a finite number ≥ 0, got -1"):
        ReluizeConfig(lr=-1)
