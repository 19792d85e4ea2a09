import re
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from lambda_gelu import LambdaGELU, LambdaGELUConfig, convert_to_lambda_gelu_, is_gelu_like, lambda_modules, to_relu_
from lambda_gelu.core.convert import eval_mode


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 8), nn.GELU(approximate="tanh"), nn.Linear(8, 2))


def test_convert_replaces_both_gelu_modes_and_keeps_outputs_at_lambda_one():
    model = _mlp()
    x = torch.randn(16, 4)
    exact = nn.Sequential(*[m if not isinstance(m, nn.GELU) else nn.GELU() for m in model])(x)
    names = convert_to_lambda_gelu_(model, init_lambda=1.0)
    assert names == ["1", "3"]
    assert [n for n, _ in lambda_modules(model)] == ["1", "3"]
    assert torch.equal(model(x), exact)  # λ = 1 is the exact GELU, bit for bit


def test_converting_tanh_gelu_changes_each_activation_by_at_most_4_7e_4():
    """The tanh form becomes the exact Φ at λ = 1: each converted activation moves by at most the
    documented bound (and by more than nothing, or the test would not be looking at the tanh form)."""
    x = torch.linspace(-10, 10, 200001)
    original = nn.GELU(approximate="tanh")
    model = nn.Sequential(original)
    convert_to_lambda_gelu_(model, init_lambda=1.0)
    gap = (model(x).double() - original(x).double()).abs().max().item()
    assert 4.0e-4 < gap <= 4.75e-4


def test_filter_fn_sees_module_and_name():
    model = _mlp()
    seen = []
    names = convert_to_lambda_gelu_(model, filter_fn=lambda m, fqn: seen.append((type(m), fqn)) or fqn == "3")
    assert names == ["3"] and isinstance(model[1], nn.GELU) and isinstance(model[3], LambdaGELU)
    assert (nn.GELU, "1") in seen


def test_shared_module_stays_shared():
    act = nn.GELU()
    model = nn.ModuleDict({"a": act, "b": nn.Sequential(act)})
    names = convert_to_lambda_gelu_(model)
    assert sorted(names) == ["a", "b.0"] and model["a"] is model["b"][0]
    assert len(list(lambda_modules(model))) == 1


def test_hooks_stay_at_their_place_in_the_network_through_both_conversions():
    """A hook on an activation (a probe recording it, a pre-hook rescaling its input) keeps running
    after the activation is replaced, and the handle it was registered with still removes it."""
    model, x = _mlp(), torch.randn(16, 4)
    gelu, seen = model[1], []
    record = model[1].register_forward_hook(lambda m, args, out: seen.append((type(m), out.detach())))
    model[1].register_forward_pre_hook(lambda m, args: (2 * args[0],))
    grads = []
    model[3].register_full_backward_hook(lambda m, grad_in, grad_out: grads.append(type(m)))

    convert_to_lambda_gelu_(model, init_lambda=1.0)
    model(x).sum().backward()
    assert seen[-1][0] is LambdaGELU and torch.equal(seen[-1][1], F.gelu(2 * model[0](x)))  # still doubled
    assert grads == [LambdaGELU] and not gelu._forward_hooks  # moved, not copied: the old module is out

    to_relu_(model)
    model(x)
    assert seen[-1][0] is nn.ReLU and torch.equal(seen[-1][1], F.relu(2 * model[0](x)))
    record.remove()
    model(x)
    assert len(seen) == 2  # removed: the λ-GELU pass and the ReLU pass, no more


def test_a_module_whose_forward_was_wrapped_on_the_instance_is_refused_before_anything_changes():
    model = _mlp()
    inner = model[3].forward
    model[3].forward = lambda x: inner(x.to(torch.float32))  # as Accelerate's hooks wrap a module
    with pytest.raises(ValueError, match=r"'3' has its forward replaced on the instance .* remove the wrapper"):
        convert_to_lambda_gelu_(model)
    assert isinstance(model[1], nn.GELU) and isinstance(model[3], nn.GELU)  # nothing half-converted


def test_hugging_face_activation_classes_are_recognised():
    activations = pytest.importorskip("transformers.activations")
    for name in ("GELUActivation", "NewGELUActivation", "GELUTanh", "PytorchGELUTanh",
                 "FastGELUActivation", "AccurateGELUActivation"):
        assert is_gelu_like(getattr(activations, name)()), name
    assert not is_gelu_like(activations.QuickGELUActivation())  # x·σ(1.702x): not a Φ gate
    assert not is_gelu_like(activations.ClippedGELUActivation(-10, 10))  # clipped: not GELU beyond the clip

    class GELUActivation(nn.Module):  # a user's own class that only shares the name
        def forward(self, x):
            return torch.tanh(x)
    assert not is_gelu_like(GELUActivation())
    model = nn.Sequential(nn.Linear(4, 4), activations.NewGELUActivation(), nn.Linear(4, 4), activations.GELUActivation())
    assert convert_to_lambda_gelu_(model) == ["1", "3"]


def test_nothing_to_convert_names_what_was_looked_for():
    with pytest.raises(ValueError, match="found no GELU module.*torch.nn.GELU.*NewGELUActivation"):
        convert_to_lambda_gelu_(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
    with pytest.raises(ValueError, match="to_relu_ found nothing to replace \\(looked for: LambdaGELU\\)"):
        to_relu_(_mlp())
    with pytest.raises(ValueError, match="init_lambda"):
        convert_to_lambda_gelu_(_mlp(), init_lambda=0.5)
    with pytest.raises(ValueError, match="the model itself"):
        convert_to_lambda_gelu_(nn.GELU())


class _FunctionalGELUBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.GELU()

    def forward(self, x):
        return F.gelu(self.fc(self.act(x)))


def test_functional_gelu_is_reported():
    model = nn.Sequential(_FunctionalGELUBlock())
    with pytest.warns(UserWarning, match="_FunctionalGELUBlock.forward .* seems to apply gelu as a function"):
        names = convert_to_lambda_gelu_(model)
    assert names == ["0.act"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        convert_to_lambda_gelu_(_mlp())  # nothing functional there: no warning


def test_to_relu_is_exact_relu_and_direct_swap():
    model = _mlp()
    convert_to_lambda_gelu_(model, init_lambda=3.0)
    assert to_relu_(model) == ["1", "3"]
    assert all(type(model[i]) is nn.ReLU for i in (1, 3))
    gelu_model = _mlp()
    assert to_relu_(gelu_model, include_gelu=True) == ["1", "3"]
    assert all(type(gelu_model[i]) is nn.ReLU for i in (1, 3))


def test_high_lambda_approaches_the_relu_model():
    model = _mlp()
    convert_to_lambda_gelu_(model)
    for _, m in lambda_modules(model):
        m.set_lambda(1e5)
    x = torch.randn(256, 4)
    y = model(x)
    to_relu_(model)
    assert (y - model(x)).abs().max() < 1e-4


def test_config_and_keyword_overrides():
    model = _mlp()
    convert_to_lambda_gelu_(model, config=LambdaGELUConfig(init_lambda=2.0, temperature=0.5), temperature=0.2)
    assert model[1].lam.item() == pytest.approx(2.0) and model[1].temperature == 0.2
    with pytest.raises(ValueError, match="LambdaGELUConfig.epsilon=0.9 is invalid"):
        LambdaGELUConfig(epsilon=0.9)


def test_filter_fn_replaces_the_default_match():
    model = nn.Sequential(nn.Linear(4, 8), nn.SiLU(), nn.Linear(8, 8), nn.GELU())
    names = convert_to_lambda_gelu_(model, filter_fn=lambda m, fqn: isinstance(m, nn.SiLU))
    assert names == ["1"] and isinstance(model[1], LambdaGELU) and isinstance(model[3], nn.GELU)
    with pytest.raises(ValueError, match="found no module that filter_fn accepts"):
        convert_to_lambda_gelu_(_mlp(), filter_fn=lambda m, fqn: False)


def test_new_lambdas_go_to_the_device_of_their_neighbours_or_the_one_given():
    model = nn.Sequential(nn.Sequential(nn.Linear(4, 8, device="meta"), nn.GELU()), nn.Linear(8, 8), nn.GELU())
    convert_to_lambda_gelu_(model)
    assert model[0][1].s.device.type == "meta" and model[2].s.device.type == "cpu"
    model = _mlp()
    convert_to_lambda_gelu_(model, device="meta")
    assert model[1].s.device.type == "meta"


def test_per_channel_learns_the_channel_counts_from_an_example():
    model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 5), nn.GELU())
    with pytest.raises(ValueError, match="needs example_input"):
        convert_to_lambda_gelu_(model, config=LambdaGELUConfig(per_channel=True))
    convert_to_lambda_gelu_(model, config=LambdaGELUConfig(per_channel=True), example_input=torch.randn(2, 4))
    assert model[1].lam.shape == (8,) and model[3].lam.shape == (5,)
    assert model(torch.randn(3, 4)).shape == (3, 5)


def _timm():
    """timm, or None where it does not import: it needs torchvision, which does not load beside every
    torch build (e.g. PyPI's torchvision beside a CPU-only torch)."""
    try:
        import timm
        return timm
    except Exception:  # noqa: BLE001 - ImportError, or torchvision's RuntimeError on a mismatched build
        return None


def test_timm_activations_are_recognised_and_lambda_gelu_is_a_timm_act_layer():
    """timm's own GELU modules (ConvNeXt and others use them) and its act_layer convention (every
    activation takes `inplace`). Where timm does not import, the classes are checked by their
    qualified names, as the library recognises them."""
    assert type(LambdaGELU(inplace=True)(torch.ones(1))) is torch.Tensor
    if _timm() is not None:
        from timm.layers import GELU, GELUTanh
    else:
        GELU = type("GELU", (nn.Module,), {"__module__": "timm.layers.activations", "forward": lambda s, x: F.gelu(x)})
        GELUTanh = type("GELUTanh", (nn.Module,), {"__module__": "timm.layers.activations",
                                                   "forward": lambda s, x: F.gelu(x, approximate="tanh")})
    model = nn.Sequential(nn.Linear(4, 4), GELU(), nn.Linear(4, 4), GELUTanh())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # timm's F.gelu inside GELU.forward is not "functional gelu" to warn about
        assert convert_to_lambda_gelu_(model) == ["1", "3"]


@pytest.mark.parametrize("name", ["vit_tiny_patch16_224", "convnext_atto"])
def test_real_timm_models_convert_exactly_build_with_lambda_gelu_and_become_relu(name):
    """Real timm models built without weights: a ViT (nn.GELU) and a ConvNeXt (timm's GELU). Converted
    at λ = 1 they compute what they computed; built with act_layer=LambdaGELU every block has one."""
    timm = _timm()
    if timm is None:
        pytest.skip("timm does not import here (it needs a torchvision that loads beside this torch)")
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=3).eval()
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        before = model(x)
        replaced = convert_to_lambda_gelu_(model, config=LambdaGELUConfig(init_lambda=1.0))
        assert replaced and not any(is_gelu_like(m) for m in model.modules())
        torch.testing.assert_close(model(x), before, rtol=1e-4, atol=1e-5)  # λ = 1 is GELU
    assert len(to_relu_(model)) == len(replaced) and not any(isinstance(m, LambdaGELU) for m in model.modules())

    built = timm.create_model(name, pretrained=False, num_classes=3, act_layer=LambdaGELU)
    assert sum(isinstance(m, LambdaGELU) for m in built.modules()) == len(replaced)
    assert built(x).shape == (2, 3)


def test_eval_mode_puts_each_module_back_in_its_own_mode_even_after_an_error():
    model = _mlp().train()
    model[2].eval()  # a frozen layer inside a model being trained
    with eval_mode(model):
        assert not any(m.training for m in model.modules())
        model[4].train()  # switched inside: put back too
    assert [m.training for m in model.modules()] == [True, True, True, False, True, True]
    with pytest.raises(RuntimeError, match="inside"), eval_mode(model):
        raise RuntimeError("inside")
    assert [m.training for m in model.modules()] == [True, True, True, False, True, True]


def _tiny_hugging_face(kind: str):
    """Small real Hugging Face models whose configs name their GELU in different fields."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=100)
    return {
        "roberta": lambda: transformers.RobertaModel(transformers.RobertaConfig(**small, max_position_embeddings=40)),
        "distilbert": lambda: transformers.DistilBertModel(transformers.DistilBertConfig(  # its field: activation
            dim=32, n_layers=2, n_heads=2, hidden_dim=64, vocab_size=100)),
        "t5": lambda: transformers.T5EncoderModel(transformers.T5Config(  # feed_forward_proj="gated-gelu"
            d_model=32, d_ff=64, num_layers=2, num_heads=2, d_kv=16, vocab_size=100, feed_forward_proj="gated-gelu")),
        "gpt2": lambda: transformers.GPT2Model(transformers.GPT2Config(  # activation_function="gelu_new"
            n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32)),
    }[kind]().eval()


@pytest.mark.parametrize("kind", ["roberta", "distilbert", "t5", "gpt2"])
@pytest.mark.parametrize("path", ["direct swap", "λ-GELU"])
def test_a_relu_network_saved_with_save_pretrained_loads_as_itself(kind, path, tmp_path):
    """transformers rebuilds a model from its config when it loads: to_relu_ names ReLU in whichever field
    the config names its GELU in, so the checkpoint loads as the ReLU network, bit for bit."""
    model = _tiny_hugging_face(kind)
    gelus = {name for name, m in model.named_modules() if is_gelu_like(m)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the config can say it: no warning
        if path == "λ-GELU":
            convert_to_lambda_gelu_(model, init_lambda=3.0)
        assert set(to_relu_(model, include_gelu=path == "direct swap")) == gelus and len(gelus) == 2
    model.save_pretrained(tmp_path)
    loaded = type(model).from_pretrained(tmp_path).eval()
    assert {name for name, m in loaded.named_modules() if isinstance(m, nn.ReLU)} == gelus
    assert not any(is_gelu_like(m) for m in loaded.modules())
    ids = torch.randint(3, 100, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).last_hidden_state, model(input_ids=ids).last_hidden_state,
                                   rtol=0, atol=0)


def test_a_config_that_cannot_name_the_converted_network_is_left_as_it_was_with_a_warning():
    """Half a RoBERTa converted: its one hidden_act cannot say which layers are ReLU, so the config stays (a
    checkpoint would load as GELU) and to_relu_ says where; relu_config_problem tells it beforehand, also
    for a Hugging Face model inside another module."""
    from lambda_gelu import relu_config_problem

    first = "encoder.layer.0.intermediate.intermediate_act_fn"
    second = "encoder.layer.1.intermediate.intermediate_act_fn"
    model = _tiny_hugging_face("roberta")
    assert relu_config_problem(model) is None and relu_config_problem(_mlp()) is None
    half = lambda m, fqn: fqn == first  # noqa: E731
    expected = (rf"at '{second}' the converted network has GELUActivation but its config \(activation fields naming "
                r"GELU: hidden_act='gelu'\) builds ReLU there")
    assert re.fullmatch(expected, relu_config_problem(model, half))
    assert re.fullmatch("inner: " + expected, relu_config_problem(nn.ModuleDict({"inner": model}),
                                                                  lambda m, fqn: fqn == "inner." + first))
    with pytest.warns(UserWarning, match=expected + ": its config is left as it was, and save_pretrained would "
                                                    "write a checkpoint that does not load as this network"):
        assert to_relu_(model, include_gelu=True, filter_fn=half) == [first]
    assert model.config.hidden_act == "gelu"

    wrapped = nn.ModuleDict({"inner": _tiny_hugging_face("distilbert")})  # as sentence-transformers holds one
    to_relu_(wrapped, include_gelu=True)
    assert wrapped["inner"].config.activation == "relu"


def test_kept_modules_are_left_out_of_a_conversion_and_put_back_after():
    from lambda_gelu.core.keep import KeptActivation, kept
    model = nn.Sequential(nn.Linear(3, 3), nn.GELU(), nn.Linear(3, 3), nn.GELU())
    tower = model[3]
    x = torch.randn(4, 3)
    with kept(model, ["3"]):
        assert isinstance(model[3], KeptActivation) and not any(m is tower for m in model.modules())
        assert to_relu_(model, include_gelu=True) == ["1"]
        torch.testing.assert_close(model(x), tower(model[2](torch.relu(model[0](x)))))
    assert model[3] is tower and isinstance(model[1], nn.ReLU)
    with pytest.raises(ValueError, match="kept: 0 holds weights"):
        with kept(model, ["0"]):
            pass
    assert isinstance(model[0], nn.Linear)

