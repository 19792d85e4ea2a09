import pytest
import torch
import torch.nn as nn

from lambda_gelu import LambdaGELU, lambda_param_groups


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), LambdaGELU(init_lambda=2.0), nn.Linear(16, 16),
                         LambdaGELU(init_lambda=2.0), nn.Linear(16, 1))


def test_groups_split_lambda_from_the_rest():
    model = _model()
    groups = lambda_param_groups(model, lr=0.1, weight_decay=0.01, multiplier=9)
    by_name = {g["name"]: g for g in groups}
    assert by_name["lambda"]["lr"] == pytest.approx(0.9) and by_name["lambda"]["weight_decay"] == 0.0
    assert by_name["default"]["lr"] == 0.1 and by_name["default"]["weight_decay"] == 0.01
    assert len(by_name["lambda"]["params"]) == 2
    assert sum(p.numel() for g in groups for p in g["params"]) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("opt_cls", [torch.optim.SGD, torch.optim.AdamW])
def test_lambda_descends_and_gets_no_weight_decay(opt_cls):
    """Under SGD and AdamW, s moves against ∂L/∂s (so λ against ∂L/∂λ), and a heavy weight decay on
    the other parameters leaves s exactly where an optimizer without decay would put it."""
    model = _model()
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    kwargs = {"momentum": 0.9} if opt_cls is torch.optim.SGD else {}
    opt = opt_cls(lambda_param_groups(model, lr=1e-2, weight_decay=0.5), **kwargs)
    lam_modules = [model[1], model[3]]
    # the same optimizer on s alone, without any weight decay
    ref_s = [m.s.detach().clone().requires_grad_() for m in lam_modules]
    ref_opt = opt_cls([{"params": ref_s, "lr": 9e-2, "weight_decay": 0.0}], **kwargs)
    for step in range(5):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        grads = [m.s.grad.clone() for m in lam_modules]
        before = [m.s.detach().clone() for m in lam_modules]
        opt.step()
        for r, g in zip(ref_s, grads):
            r.grad = g
        ref_opt.step()
        for m, r in zip(lam_modules, ref_s):
            torch.testing.assert_close(m.s.detach(), r.detach(), rtol=0, atol=1e-7)
        if step == 0:  # first step: the move is against the gradient for both optimizers
            for m, b, g in zip(lam_modules, before, grads):
                assert torch.sign(m.s.detach() - b) == -torch.sign(g)


def test_no_lambda_in_model_is_a_clear_error():
    with pytest.raises(ValueError, match="found no LambdaGELU.*convert_to_lambda_gelu_"):
        lambda_param_groups(nn.Linear(2, 2), lr=0.1)
    with pytest.raises(ValueError, match="lr must be"):
        lambda_param_groups(_model(), lr=-1)


def test_biases_and_norms_can_stay_out_of_weight_decay():
    model = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), LambdaGELU(), nn.Linear(16, 1))
    by_name = {g["name"]: g for g in lambda_param_groups(model, lr=0.1, weight_decay=0.05, no_decay_1d=True)}
    assert {id(p) for p in by_name["default"]["params"]} == {id(model[0].weight), id(model[3].weight)}
    assert by_name["no_decay"]["weight_decay"] == 0.0 and len(by_name["no_decay"]["params"]) == 4
    assert by_name["lambda"]["params"] == [model[2].s]


def test_composes_with_existing_groups():
    """Layer-wise learning rates: each group's λ gets c times that group's rate and no decay; groups
    built before conversion (without λ) get a λ group at c·lr; the rest is kept as given."""
    model = _model()
    groups = [{"params": list(model[0].parameters()) + [model[1].s], "lr": 0.01, "weight_decay": 0.1},
              {"params": list(model[2].parameters()) + list(model[4].parameters()) + [model[3].s], "lr": 0.1}]
    out = lambda_param_groups(model, lr=0.5, multiplier=9, groups=groups)
    assert [(len(g["params"]), g["lr"], g.get("weight_decay")) for g in out] == [
        (2, 0.01, 0.1), (1, pytest.approx(0.09), 0.0), (4, 0.1, None), (1, pytest.approx(0.9), 0.0)]
    torch.optim.AdamW(out)  # a valid optimizer: every parameter once
    before = [{"params": [p for n, p in model.named_parameters() if not n.endswith(".s")], "lr": 0.02}]
    out = lambda_param_groups(model, lr=0.02, groups=before)
    assert out[-1]["name"] == "lambda" and len(out[-1]["params"]) == 2 and out[-1]["lr"] == pytest.approx(0.18)
    with pytest.raises(ValueError, match="groups hold no entry for 4 parameters .* .2.weight."):
        lambda_param_groups(model, lr=0.1, groups=[{"params": list(model[0].parameters())}])
