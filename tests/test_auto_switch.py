"""switch_at="auto": the switch lands where the stated rule says on scripted sign patterns, within its
bounds, is recorded in the model's state (exact resume), and bad probes get one clear error."""
import math

import pytest
import torch
import torch.nn as nn

from lambda_gelu import AutoSwitch, HardeningSchedule, LambdaGELU, lambda_param_groups

UNITS = (2, 200)  # probe examples × units: 400 signs


class Scripted(nn.Module):
    """Feeds its λ-GELU the ±1 pattern the test sets, whatever the input: the signs are the script."""

    def __init__(self):
        super().__init__()
        self.pattern = torch.ones(UNITS)

    def forward(self, x):
        return self.pattern.clone() + 0 * x


def _script(checks, seed=0):
    """Sign patterns whose check-to-check flips fall geometrically (structure forming) to a floor of a
    few random flips per check (SGD noise)."""
    g = torch.Generator().manual_seed(seed)
    p = torch.where(torch.rand(UNITS, generator=g) < 0.5, -1.0, 1.0)
    out = [p]
    for c in range(1, checks):
        flips = max(4, int(150 * 0.7 ** c))
        p = p.clone().flatten()
        p[torch.randperm(p.numel(), generator=g)[:flips]] *= -1
        out.append(p.view(UNITS))
    return out


def reference_switch(patterns, total, rule):
    """The rule of AutoSwitch, written out plainly: check at every multiple of `every` steps."""
    every = max(1, round(rule.every * total))
    earliest, latest = math.ceil(rule.earliest * total), int(rule.latest * total)
    history, best, stale = [patterns[0]], math.inf, 0
    for k in range(1, total + 1):
        if k >= latest:
            return k
        if k % every:
            continue
        p = patterns[k // every]
        if len(history) >= rule.window:
            drift = (p != history[-rule.window]).double().mean().item()
            best, stale = (drift, 0) if drift < (1 - rule.min_gain) * best else (best, stale + 1)
        history.append(p)
        if stale >= rule.patience and k >= earliest:
            return k


def _run_script(patterns, total, rule, stop=None):
    src = Scripted()
    model = nn.Sequential(src, LambdaGELU())
    src.pattern = patterns[0]
    sched = HardeningSchedule(model, total, switch_at=rule, probe=torch.zeros(UNITS))
    every = max(1, round(rule.every * total))
    for k in range(1, (stop or total) + 1):
        src.pattern = patterns[min(k // every, len(patterns) - 1)]  # what a check at step k sees
        sched.step()
    return model, sched


def test_switch_lands_where_the_rule_says():
    total, rule = 100, AutoSwitch()
    patterns = _script(total // 2 + 1)
    expected = reference_switch(patterns, total, rule)
    assert 10 < expected < 50  # settled on its own, strictly inside the bounds
    model, sched = _run_script(patterns, total, rule)
    assert sched.switch_step == expected and int(model[1].switch_step) == expected
    assert model[1].frozen and abs(model[1].lam.item() - sched.lambda_target) < 1e-3


def test_string_auto_is_the_default_rule():
    model = nn.Sequential(nn.Linear(3, 8), LambdaGELU())
    sched = HardeningSchedule(model, 50, switch_at="auto", probe=torch.randn(4, 3))
    assert sched.auto == AutoSwitch() and sched.switch_step is None and not sched.hardening
    assert sched.switch_at == "auto" and int(model[1].switch_checks) == 1  # the step-0 pattern is taken


def test_bounds_hold():
    total = 100
    constant = [torch.ones(UNITS)] * 60  # settled from the start: waits for `earliest`
    _, sched = _run_script(constant, total, AutoSwitch(earliest=0.3))
    assert sched.switch_step == 30 == reference_switch(constant, total, AutoSwitch(earliest=0.3))
    patient = AutoSwitch(patience=10 ** 6)  # never settles: switches at `latest`
    _, sched = _run_script(_script(60), total, patient)
    assert sched.switch_step == 50


def _train_model(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 32), LambdaGELU(), nn.Dropout(0.1), nn.Linear(32, 32), LambdaGELU(),
                          nn.Linear(32, 1))
    opt = torch.optim.SGD(lambda_param_groups(model, lr=0.05), momentum=0.9)
    return model, opt


DATA = torch.randn(60, 32, 6, generator=torch.Generator().manual_seed(3))
PROBE = torch.randn(64, 6, generator=torch.Generator().manual_seed(4))


def _steps(model, opt, sched, ks):
    torch.manual_seed(1000 + ks.start)  # dropout masks depend on the step, not on the run's history
    for k in ks:
        x = DATA[k]
        opt.zero_grad()
        nn.functional.mse_loss(model(x), x.sum(1, keepdim=True).sin()).backward()
        opt.step()
        sched.step()


def test_resume_from_state_dict_continues_exactly():
    total = 60
    model, opt = _train_model()
    sched = HardeningSchedule(model, total, "auto", probe=PROBE)
    for k in range(total):
        _steps(model, opt, sched, range(k, k + 1))
    assert sched.switch_step is not None and sched.hardening

    model2, opt2 = _train_model()
    sched2 = HardeningSchedule(model2, total, "auto", probe=PROBE)
    for k in range(21):
        _steps(model2, opt2, sched2, range(k, k + 1))
    state, opt_state = model2.state_dict(), opt2.state_dict()
    model3, opt3 = _train_model(seed=7)  # other weights: everything must come from the checkpoint
    model3.load_state_dict(state)
    opt3.load_state_dict(opt_state)
    sched3 = HardeningSchedule(model3, total, "auto", probe=PROBE)
    assert sched3.step_count == 21 and int(model3[1].switch_checks) == int(model2[1].switch_checks)
    for k in range(21, total):
        _steps(model3, opt3, sched3, range(k, k + 1))
    assert sched3.switch_step == sched.switch_step
    for key, value in model.state_dict().items():
        assert torch.equal(value, model3.state_dict()[key]), key


def test_probing_leaves_training_untouched():
    model, opt = _train_model()
    model.train()
    model[2].eval()  # a mixed train/eval tree is restored module by module
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    HardeningSchedule(model, 40, "auto", probe=PROBE)
    assert model.training and not model[2].training and model[4].training
    assert all(torch.equal(p.grad, torch.ones_like(p)) for p in model.parameters())


def test_tuple_and_dict_probes():
    class Keyword(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.act = nn.Linear(3, 5), LambdaGELU()

        def forward(self, x, scale=1.0):
            return self.act(self.lin(x) * scale)

    for probe in ({"x": torch.randn(4, 3), "scale": 2.0}, (torch.randn(4, 3), 2.0)):
        model = Keyword()
        HardeningSchedule(model, 10, "auto", probe=probe)
        assert model.act.switch_signs.shape == (AutoSwitch().window, 3)  # 20 signs → 3 bytes


@pytest.mark.parametrize("kwargs, message", [
    ({"switch_at": "auto"}, "needs probe="),
    ({"switch_at": 0.25, "probe": PROBE}, "only used with switch_at='auto'"),
    ({"switch_at": "soon"}, "or 'auto'"),
    ({"switch_at": "auto", "probe": torch.randn(4, 5)}, "could not run its probe batch"),
])
def test_bad_arguments(kwargs, message):
    model, _ = _train_model()
    with pytest.raises((ValueError, RuntimeError), match=message):
        HardeningSchedule(model, 40, **kwargs)


def test_probe_that_never_reaches_a_lambda_gelu():
    class Skips(nn.Module):
        def __init__(self):
            super().__init__()
            self.act = LambdaGELU()

        def forward(self, x):
            return x

    with pytest.raises(ValueError, match="without reaching any LambdaGELU"):
        HardeningSchedule(Skips(), 40, "auto", probe=PROBE)


def test_resume_with_another_probe_size_is_refused():
    model, _ = _train_model()
    HardeningSchedule(model, 40, "auto", probe=PROBE)
    model[1].hardening_step.fill_(0)
    model[1].switch_checks.fill_(1)
    sched = HardeningSchedule(model, 40, "auto", probe=PROBE[:8])
    with pytest.raises(ValueError, match="resume with the same probe batch"):
        for _ in range(2):
            sched.step()


@pytest.mark.parametrize("kwargs", [{"every": 0}, {"window": 0}, {"patience": 1.5}, {"min_gain": 1},
                                    {"earliest": 0.6, "latest": 0.5}, {"latest": 1.0}])
def test_autoswitch_validates(kwargs):
    with pytest.raises(ValueError, match="AutoSwitch"):
        AutoSwitch(**kwargs)
