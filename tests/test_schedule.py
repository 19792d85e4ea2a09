import copy

import pytest
import torch
import torch.nn as nn

from lambda_gelu import HardeningSchedule, LambdaGELU, lambda_param_groups, lambda_target


def _setup(seed=0, per_channel=False):
    torch.manual_seed(seed)
    kw = {"num_channels": 16} if per_channel else {}
    model = nn.Sequential(nn.Linear(4, 16), LambdaGELU(**kw), nn.Linear(16, 16), LambdaGELU(**kw), nn.Linear(16, 1))
    opt = torch.optim.SGD(lambda_param_groups(model, lr=0.05), momentum=0.9)
    return model, opt


def _train(model, opt, sched, steps, data):
    x, y = data
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        sched.step()


DATA = (torch.randn(32, 4, generator=torch.Generator().manual_seed(1)),
        torch.randn(32, 1, generator=torch.Generator().manual_seed(2)))


@pytest.mark.parametrize("per_channel", [False, True])
def test_learn_freeze_then_linear_to_target(per_channel):
    model, opt = _setup(per_channel=per_channel)
    sched = HardeningSchedule(model, total_steps=40, switch_at=0.25)
    assert sched.switch_step == 10
    history = []
    for k in range(40):
        _train(model, opt, sched, 1, DATA)
        history.append({n: torch.tensor(v, dtype=torch.float64) for n, v in sched.current_lambdas().items()})
        if k + 1 < 10:
            assert not sched.hardening and not model[1].frozen
    assert model[1].frozen and model[3].frozen
    learned = sched.learned
    for name in learned:
        assert not torch.allclose(learned[name], torch.full_like(learned[name], 1.5))  # λ did learn
        # linear between the switch (step 10 ↔ history[9]) and the end, exact target at the last step
        for k in range(10, 41):
            a = (k - 10) / 30
            expected = (1 - a) * learned[name] + a * lambda_target(0.005)
            torch.testing.assert_close(history[k - 1][name], expected, rtol=1e-6, atol=0)
        # at the last step: λ_target up to the float32 rounding of s (one ulp of λ at 160 is 1.5e-5)
        assert torch.all((history[-1][name] - lambda_target(0.005)).abs() <= 2 ** -16 * 2)


@pytest.mark.parametrize("opt_cls", [torch.optim.SGD, torch.optim.AdamW])
def test_frozen_lambda_ignores_momentum_and_optimizer(opt_cls):
    model, _ = _setup()
    opt = opt_cls(lambda_param_groups(model, lr=0.05, weight_decay=0.1), **({"momentum": 0.9} if opt_cls is
                                                                             torch.optim.SGD else {}))
    sched = HardeningSchedule(model, total_steps=20, switch_at=0.5)
    _train(model, opt, sched, 10, DATA)
    # the optimizer still holds momentum for s; a frozen λ must not move by it, and s keeps a gradient
    lam_set = model[1].lam.clone()
    opt.zero_grad(set_to_none=True)
    nn.functional.mse_loss(model(DATA[0]), DATA[1]).backward()
    assert all(p.grad is not None for p in model.parameters())  # the same parameters get gradients as before
    assert model[1].s.grad.item() == 0.0
    opt.step()
    assert torch.equal(model[1].lam, lam_set)


def test_resume_from_the_model_state_dict_alone_is_identical():
    model, opt = _setup()
    sched = HardeningSchedule(model, total_steps=30)
    _train(model, opt, sched, 30, DATA)

    model2, opt2 = _setup()
    sched2 = HardeningSchedule(model2, total_steps=30)
    _train(model2, opt2, sched2, 13, DATA)  # past the switch at 7
    ckpt = copy.deepcopy({"m": model2.state_dict(), "o": opt2.state_dict()})  # no schedule state: the model has it
    model3, opt3 = _setup(seed=123)  # different init: everything must come from the checkpoint
    sched3 = HardeningSchedule(model3, total_steps=30)
    model3.load_state_dict(ckpt["m"])
    opt3.load_state_dict(ckpt["o"])
    assert model3[1].frozen and sched3.step_count == 13 and sched3.hardening
    _train(model3, opt3, sched3, 17, DATA)
    for p, q in zip(model.state_dict().values(), model3.state_dict().values()):
        assert torch.equal(p, q)


@pytest.mark.parametrize("kwargs, match", [
    ({"total_steps": 0}, "total_steps"), ({"total_steps": 10, "switch_at": 1.0}, "switch_at"),
    ({"total_steps": 10, "epsilon": 0.01, "lambda_target": 100.0}, "not both"),
    ({"total_steps": 10, "lambda_target": 0.5}, "lambda_target"),
])
def test_bad_arguments(kwargs, match):
    model, _ = _setup()
    with pytest.raises(ValueError, match=match):
        HardeningSchedule(model, **kwargs)
    with pytest.raises(ValueError, match="found no LambdaGELU"):
        HardeningSchedule(nn.Linear(2, 2), total_steps=10)


def test_wrapped_models_and_a_trainers_global_step():
    """torch.compile's '_orig_mod.' and DDP's 'module.' do not change the layer names; a trainer's
    global step may drive the schedule instead of counting calls."""
    model, opt = _setup()
    sched = HardeningSchedule(torch.compile(model), total_steps=40)
    assert set(sched.modules) == {"1", "3"}
    sched.step(25)  # jump: frozen at step 10's λ (the current one), then a = 15/30
    assert sched.step_count == 25 and model[1].frozen
    assert model[1].lam.item() == pytest.approx(0.5 * 1.5 + 0.5 * lambda_target(0.005), rel=1e-6)
    with pytest.raises(ValueError, match="global_step must be ≥ 0"):
        sched.step(-1)


@pytest.mark.parametrize("per_channel", [False, True])
def test_freeze_false_keeps_learning_on_the_same_line_and_ends_at_the_target(per_channel):
    """The freeze ablation: λ_k = (1 − a)·λ(s_k) + a·λ_target with s still trained; its gradient is
    (1 − a) times the unblended one, and the end is λ_target exactly."""
    model, opt = _setup(per_channel=per_channel)
    sched = HardeningSchedule(model, total_steps=40, switch_at=0.25, freeze=False)
    _train(model, opt, sched, 20, DATA)
    m = model[1]
    assert not m.frozen and bool(m.lambda_annealing) and sched.hardening
    a = (20 - 10) / 30
    learned = 1.0 + nn.functional.softplus(m.s.detach().double() / m.temperature)
    torch.testing.assert_close(m.lam.double(), (1 - a) * learned + a * lambda_target(0.005), rtol=1e-6, atol=0)
    assert not torch.equal(m.lambda_start, learned.float())  # s moved after the switch: λ(s) is still learned

    x = torch.randn(8, 16, dtype=torch.float64)  # ∂f/∂s through the blend = (1 − a)·∂f/∂λ·∂λ/∂s
    m64 = copy.deepcopy(m).double()
    g, = torch.autograd.grad(m64(x).sum(), m64.s)
    lam = m64.lam
    dlam_ds = torch.sigmoid(m64.s / m64.temperature) / m64.temperature
    df_dlam = (x ** 2 * torch.exp(-0.5 * (lam * x) ** 2) / (2 * torch.pi) ** 0.5).sum(0)
    expected = (1 - a) * df_dlam * dlam_ds
    torch.testing.assert_close(g, expected if per_channel else expected.sum())

    _train(model, opt, sched, 20, DATA)
    for layer in (model[1], model[3]):
        assert torch.all((layer.lam - lambda_target(0.005)).abs() <= 2 ** -16 * 2)
    g, = torch.autograd.grad(model(DATA[0]).sum(), model[1].s)
    assert torch.all(g == 0)  # at a = 1 the blend ignores s


def test_freeze_setting_must_match_the_model_it_resumes():
    model, opt = _setup()
    sched = HardeningSchedule(model, total_steps=20, switch_at=0.25, freeze=False)
    _train(model, opt, sched, 10, DATA)
    with pytest.raises(ValueError, match="was hardened with freeze=False; resume with the same freeze= setting"):
        HardeningSchedule(model, total_steps=20, switch_at=0.25)
    state = sched.state_dict()
    again = HardeningSchedule(model, total_steps=20, switch_at=0.25, freeze=False)
    again.load_state_dict(state)
    older = {k: v for k, v in state.items() if k != "freeze"}  # a state saved before freeze= existed
    with pytest.raises(ValueError, match="schedule state has freeze=True but this schedule has False"):
        again.load_state_dict(older)
    frozen, opt = _setup()
    sched = HardeningSchedule(frozen, total_steps=20, switch_at=0.25)
    _train(frozen, opt, sched, 10, DATA)
    with pytest.raises(ValueError, match="was hardened with freeze=True"):
        HardeningSchedule(frozen, total_steps=20, switch_at=0.25, freeze=False)
