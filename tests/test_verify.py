"""The verifier against ground truth on tiny networks: dense grids, PGD, and soundness of the bounds."""
import numpy as np
import pytest
import torch
import torch.nn as nn

from lambda_gelu.verify import _margin_spec, _milp_min, affine_layers, crown_bounds, interval_bounds, pgd_attack, verify_point


def _tiny(seed, act=nn.ReLU):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(2, 12), act(), nn.Linear(12, 12), act(), nn.Linear(12, 3)).eval()


def _grid_margins(model, lo, hi, label, n=301):
    xs = np.stack(np.meshgrid(np.linspace(lo[0], hi[0], n), np.linspace(lo[1], hi[1], n)), -1).reshape(-1, 2)
    with torch.no_grad():
        logits = model(torch.tensor(xs, dtype=torch.float64).float()).double().numpy()
    others = np.delete(logits, label, axis=1)
    return xs, logits[:, label] - others.max(1)


@pytest.mark.parametrize("seed", range(6))
def test_milp_minimum_margin_is_exact(seed):
    """The MILP's minimum of logit[y] − logit[k] is ≤ every grid value and within the grid's resolution."""
    model = _tiny(seed)
    layers, _ = affine_layers(model)
    x0 = np.array([0.3, -0.2])
    lo, hi = x0 - 0.5, x0 + 0.5
    label = int(model(torch.tensor(x0).float().unsqueeze(0)).argmax())
    bounds, spec_lower = crown_bounds(layers, lo, hi, _margin_spec(label, 3))
    xs = np.stack(np.meshgrid(np.linspace(lo[0], hi[0], 401), np.linspace(lo[1], hi[1], 401)), -1).reshape(-1, 2)
    with torch.no_grad():
        logits = model(torch.tensor(xs).float()).double().numpy()
    for row, k in enumerate([k for k in range(3) if k != label]):
        value, _, status, _ = _milp_min(_margin_spec(label, 3)[row], layers, bounds, lo, hi, 30)
        grid_min = (logits[:, label] - logits[:, k]).min()
        assert status == 0
        assert value <= grid_min + 1e-4          # sound: nothing on the grid is below the optimum
        assert grid_min - value < 0.05           # exact: the optimum is (nearly) attained on a fine grid
        assert spec_lower[row] <= value + 1e-6   # CROWN is a lower bound of the exact minimum


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("radius", [0.05, 0.3, 1.0])
def test_verdicts_agree_with_grid_and_attack(seed, radius):
    model = _tiny(seed)
    x0 = torch.tensor([0.1 * seed - 0.3, 0.2])
    label = int(model(x0.unsqueeze(0)).argmax())
    lo, hi = (x0 - radius).numpy(), (x0 + radius).numpy()
    result = verify_point(model, x0, label, lo, hi, time_limit=30)
    _, margins = _grid_margins(model, lo, hi, label)
    if result.status == "verified":
        assert margins.min() > -1e-5
        assert pgd_attack(model, x0, label, lo, hi, steps=100, restarts=5) is None
    else:
        assert result.status == "falsified"
        cex = torch.tensor(result.counterexample, dtype=torch.float32)
        assert model(cex.unsqueeze(0)).argmax().item() != label
        assert np.all(result.counterexample >= lo - 1e-6) and np.all(result.counterexample <= hi + 1e-6)


def test_both_verdicts_occur_and_the_milp_decides_some():
    """The grid test above is only meaningful if verified, falsified and MILP-decided cases all occur."""
    seen = set()
    for seed in range(8):
        model = _tiny(seed)
        x0 = torch.tensor([0.1 * seed - 0.3, 0.2])
        label = int(model(x0.unsqueeze(0)).argmax())
        for radius in (0.05, 0.3, 1.0):
            r = verify_point(model, x0, label, (x0 - radius).numpy(), (x0 + radius).numpy(), time_limit=30,
                             attack=False)
            seen.add((r.status, r.method))
    assert ("verified", "crown") in seen and ("falsified", "milp") in seen
    assert ("verified", "milp") in seen


@pytest.mark.parametrize("act", [nn.ReLU, nn.GELU])
def test_bounds_are_sound(act):
    model = _tiny(3, act)
    layers, name = affine_layers(model)
    lo, hi = np.array([-0.4, 0.1]), np.array([0.2, 0.9])
    ibp = interval_bounds(layers, name, lo, hi)
    xs = np.random.default_rng(0).uniform(lo, hi, (20000, 2))
    pre, h = [], torch.tensor(xs).float()
    for m in model:
        h = m(h)
        if isinstance(m, nn.Linear):
            pre.append(h.detach().double().numpy())
    for (l, u), z in zip(ibp, pre):
        assert np.all(z >= l - 1e-5) and np.all(z <= u + 1e-5)
    if name == "relu":
        crown, _ = crown_bounds(layers, lo, hi)
        for (l, u), (li, ui), z in zip(crown, ibp, pre):
            assert np.all(z >= l - 1e-5) and np.all(z <= u + 1e-5)
            assert np.all(l >= li - 1e-9) and np.all(u <= ui + 1e-9)
        assert np.mean(crown[-1][1] - crown[-1][0]) < np.mean(ibp[-1][1] - ibp[-1][0])


def test_unsupported_models_are_a_clear_error():
    with pytest.raises(ValueError, match="'1' is a Tanh"):
        affine_layers(nn.Sequential(nn.Linear(2, 2), nn.Tanh(), nn.Linear(2, 2)))
    with pytest.raises(ValueError, match="needs a ReLU network"):
        verify_point(_tiny(0, nn.GELU), torch.zeros(2), 0, -np.ones(2), np.ones(2))
