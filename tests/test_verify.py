"""The verifier against ground truth on tiny networks: dense grids, PGD, and soundness of the bounds."""
import copy
import itertools

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.utils.prune as prune

import lambda_gelu as lg

from lambda_gelu.verify.bounds import _margin_spec, affine_layers, crown_bounds, float_error, interval_bounds, unit_roundoff
from lambda_gelu.verify.milp import _milp_min, pgd_attack, verify_point


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
        value, proven, _, status, _ = _milp_min(_margin_spec(label, 3)[row], layers, bounds, lo, hi, 30)
        grid_min = (logits[:, label] - logits[:, k]).min()
        assert status == 0
        assert proven <= value + 1e-9 and value - proven <= 1e-4 * max(1.0, abs(value))  # HiGHS's gap at most
        assert value <= grid_min + 1e-4          # sound: nothing on the grid is below the optimum
        assert grid_min - value < 0.05           # exact: the optimum is (nearly) attained on a fine grid
        assert spec_lower[row] <= value + 1e-6   # CROWN is a lower bound of the exact minimum


@pytest.mark.slow
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


def _enumerated_min(c_out, layers, lo, hi):
    """min c_out·logits over the box by brute force: one linear program per activation pattern of the
    hidden units (each unit fixed on, z ≥ 0, or off, z ≤ 0), the least optimum over all patterns."""
    from scipy.optimize import linprog
    hidden = [W.shape[0] for W, _ in layers[:-1]]
    best = np.inf
    for pattern in itertools.product((0.0, 1.0), repeat=sum(hidden)):
        A, c = np.eye(len(lo)), np.zeros(len(lo))  # the current layer's input as A·x + c
        rows, rhs, at = [], [], 0
        for (W, b), n in zip(layers[:-1], hidden):
            zA, zc = W @ A, W @ c + b
            on = np.array(pattern[at:at + n])
            at += n
            sign = np.where(on == 1, -1.0, 1.0)    # on: −z ≤ 0; off: z ≤ 0
            rows.append(sign[:, None] * zA), rhs.append(-sign * zc)
            A, c = on[:, None] * zA, on * zc
        WL, bL = layers[-1]
        res = linprog(c_out @ WL @ A, A_ub=np.vstack(rows), b_ub=np.concatenate(rhs),
                      bounds=list(zip(lo, hi)), method="highs")
        if res.status == 0:
            best = min(best, res.fun + c_out @ (WL @ c + bL))
    return best


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_milp_equals_exhaustive_enumeration_of_activation_patterns(seed):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 3)).eval()
    layers, _ = affine_layers(model)
    lo, hi = np.array([-0.8, -0.3, 0.1]), np.array([0.4, 0.6, 0.9])
    bounds, _ = crown_bounds(layers, lo, hi)
    for c_out in _margin_spec(0, 3):
        value, proven, _, status, _ = _milp_min(c_out, layers, bounds, lo, hi, 30)
        assert status == 0
        assert value == pytest.approx(_enumerated_min(c_out, layers, lo, hi), abs=1e-6)
        assert proven <= _enumerated_min(c_out, layers, lo, hi) + 1e-6  # the proven bound is a lower bound


class _Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.hidden, self.out = nn.Linear(2, 8), nn.Linear(8, 8), nn.Linear(8, 3)

    def forward(self, x):
        h = torch.relu(self.inp(x))
        return self.out(torch.relu(self.hidden(h)) + h)


class _FunctionalRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(2, 12))
        self.head = nn.Linear(12, 3)

    def forward(self, x):
        return self.head(nn.functional.relu(self.body(x)))


def _fake_quantized(model):
    """Quantization-aware training's Linear in place of the first: an nn.Linear whose forward fake-quantizes
    its weight, a leaf module to torch.fx; read as a plain Linear, it would be verified with weights it does
    not use."""
    from torch.ao.nn.qat import Linear as QATLinear
    from torch.ao.quantization import get_default_qat_qconfig
    model[0] = QATLinear(model[0].in_features, model[0].out_features, qconfig=get_default_qat_qconfig("fbgemm"))
    return model.eval()


@pytest.mark.parametrize("build, why", [
    (lambda: nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 8), nn.Linear(8, 3)), "another Linear"),
    (_Residual, "residual"),
    (lambda: nn.Sequential(nn.Linear(2, 8), nn.Dropout(0.5), nn.ReLU(), nn.Linear(8, 3)), r"model\.eval\(\)"),
    (lambda: nn.Sequential(nn.Linear(2, 8), lg.LambdaGELU(), nn.Linear(8, 3)), "to_relu_"),
    (lambda: nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 3)), "one kind"),
    (lambda: nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 3)), "'1' is a Tanh"),
    (lambda: _fake_quantized(nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 3))),
     r"'0' is a Linear \(from torch\.ao\.nn\.qat"),
])
def test_structures_it_does_not_model_are_refused_not_verified(build, why):
    """Each of these has points the verifier would misjudge if it read the Linear layers in
    registration order, as it once did; where the box holds a misclassified point, a verdict of
    "verified" would be a false certificate."""
    torch.manual_seed(0)
    model = build()
    with pytest.raises(ValueError, match=why):
        verify_point(model, torch.zeros(2), 0, -np.ones(2), np.ones(2), attack=False)


@pytest.mark.parametrize("hook", ["output", "root", "pre", "global", "prune"])
def test_forward_hooks_are_refused_not_verified(hook):
    """A hook runs when the model is called, not in its traced forward: each of these models classifies the
    centre of the box otherwise than the hook-free chain the verifier would read (which it verifies)."""
    torch.manual_seed(0)
    model = _tiny(0).eval()
    x0 = torch.tensor([0.5, 0.5])
    label = int(model(x0.unsqueeze(0)).argmax())
    lo, hi = (x0 - 0.01).numpy(), (x0 + 0.01).numpy()
    assert verify_point(model, x0, label, lo, hi, attack=False).status == "verified"
    if hook == "output":
        handle = model[4].register_forward_hook(lambda m, args, out: -out)
    elif hook == "root":
        handle = model.register_forward_hook(lambda m, args, out: -out)
    elif hook == "pre":
        handle = model[4].register_forward_pre_hook(lambda m, args: (-args[0],))
    elif hook == "global":
        handle = nn.modules.module.register_module_forward_hook(lambda m, args, out: -out if m is model else out)
    else:
        prune.l1_unstructured(model[2], "weight", amount=0.9)
    try:
        if hook != "prune":  # pruning keeps the class here; its hook would recompute a stale weight unseen
            assert int(model(x0.unsqueeze(0)).argmax()) != label
        with pytest.raises(ValueError, match="forward hooks"):
            verify_point(model, x0, label, lo, hi, attack=False)
    finally:
        if hook != "prune":
            handle.remove()


def test_residual_box_with_a_counterexample_is_not_certified():
    torch.manual_seed(1)
    model = _Residual().eval()
    lo, hi = -3 * np.ones(2), 3 * np.ones(2)
    label = int(model(torch.zeros(1, 2)).argmax())
    _, margins = _grid_margins(model, lo, hi, label)
    assert margins.min() < 0  # the box contains misclassified points
    with pytest.raises(ValueError, match="residual"):
        verify_point(model, torch.zeros(2), label, lo, hi, attack=False)


@pytest.mark.parametrize("radius", [0.05, 0.5])
def test_functional_relu_and_nested_modules_are_read_in_forward_order(radius):
    torch.manual_seed(2)
    model = _FunctionalRelu().eval()
    x0 = torch.tensor([0.2, -0.1])
    label = int(model(x0.unsqueeze(0)).argmax())
    lo, hi = (x0 - radius).numpy(), (x0 + radius).numpy()
    result = verify_point(model, x0, label, lo, hi, attack=False)
    _, margins = _grid_margins(model, lo, hi, label)
    assert (result.status == "verified") == (margins.min() > 0)


def test_unsupported_models_are_a_clear_error():
    with pytest.raises(ValueError, match="the first Linear layer takes 2"):
        verify_point(_tiny(0), torch.zeros(2, 2), 0, -np.ones(4), np.ones(4))
    with pytest.raises(ValueError, match="needs a ReLU network"):
        verify_point(_tiny(0, nn.GELU), torch.zeros(2), 0, -np.ones(2), np.ones(2))


@pytest.mark.parametrize("label, lo, hi, why", [
    (0, [0.5, 0.0], [0.4, 1.0], r"empty: lo\[0\] = 0.5 > hi\[0\] = 0.4"),  # would verify anything, vacuously
    (0, [-np.inf, 0.0], [1.0, 1.0], "must be finite"),
    (0, [np.nan, 0.0], [1.0, 1.0], "must be finite"),
    (3, [0.0, 0.0], [1.0, 1.0], r"integer in \[0, 3\); got 3"),
    (-1, [0.0, 0.0], [1.0, 1.0], r"got -1"),  # would index the last class from the end
    (1.0, [0.0, 0.0], [1.0, 1.0], "got 1.0"),
    (True, [0.0, 0.0], [1.0, 1.0], "got True"),
    (0, [0.0, 0.0, 0.0], [1.0, 1.0], "have 3 and 2 values"),
    (0, [0.0, 0.0, 0.0], [1.0, 1.0, 1.0], "the input has 2 values, the box 3"),
])
def test_a_bad_box_or_label_is_a_clear_error(label, lo, hi, why):
    with pytest.raises(ValueError, match=why):
        verify_point(_tiny(0), torch.zeros(2), label, np.array(lo), np.array(hi), attack=False)
    if "got" not in why and "input" not in why:  # the box itself: the bounds refuse it too
        with pytest.raises(ValueError, match=why):
            crown_bounds(affine_layers(_tiny(0))[0], np.array(lo), np.array(hi))


def test_labels_as_numpy_and_torch_integers_are_accepted():
    model, x0 = _tiny(0), torch.tensor([0.2, -0.1])
    label = int(model(x0.unsqueeze(0)).argmax())
    lo, hi = (x0 - 0.01).numpy(), (x0 + 0.01).numpy()
    expected = verify_point(model, x0, label, lo, hi, attack=False).status
    for as_given in (np.int64(label), torch.tensor(label)):
        assert verify_point(model, x0, as_given, lo, hi, attack=False).status == expected


def test_non_finite_weights_are_refused():
    model = _tiny(0)
    with torch.no_grad():
        model[2].weight[3, 0] = float("nan")
    with pytest.raises(ValueError, match="'2' has non-finite weights"):
        verify_point(model, torch.zeros(2), 0, -np.ones(2), np.ones(2), attack=False)


@pytest.mark.parametrize("radius", [1.0, 0.02])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_float_error_bounds_the_rounding_of_the_float_forward(dtype, radius):
    """On random points of the box, the network run in ``dtype`` is within float_error of the same weights
    run in float64, logit by logit and margin by margin. The bound is the worst case (γₙ = n·u per sum),
    far above the rounding seen here, but not vacuous for float32 on a small box."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)).eval()
    model.to(dtype)
    layers, _ = affine_layers(model)  # the dtype's weights, exactly, in float64
    x0 = torch.rand(64, dtype=torch.float64) * 2 - 1
    lo, hi = (x0 - radius).numpy(), (x0 + radius).numpy()
    err = float_error(layers, crown_bounds(layers, lo, hi)[0], lo, hi, unit_roundoff(model))
    xs = (x0 - radius + 2 * radius * torch.rand(4096, 64, dtype=torch.float64)).to(dtype)
    with torch.no_grad():
        computed = model(xs).double()
        exact = copy.deepcopy(model).double()(xs.double())  # the points the low-precision network takes, exactly
    observed = (computed - exact).abs().max(0).values.numpy()
    assert np.all(observed <= err)
    spec = _margin_spec(3, 10)  # and the margins logit[3] − logit[k], which cancel part of it
    margin_err = float_error(layers, crown_bounds(layers, lo, hi)[0], lo, hi, unit_roundoff(model), spec)
    assert np.all(np.abs((computed - exact).numpy() @ spec.T).max(0) <= margin_err)
    if dtype is torch.float32 and radius < 0.1:
        assert err.max() < 1e-3, err.max()


def test_unit_roundoff_follows_dtype_and_refuses_reduced_precision_products():
    model = _tiny(0)
    assert unit_roundoff(model) == 2.0 ** -24 and unit_roundoff(_tiny(0).double()) == 2.0 ** -53
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")  # float32 products may run in bfloat16
        with pytest.raises(ValueError, match="set_float32_matmul_precision"):
            verify_point(model, torch.zeros(2), 0, -np.ones(2), np.ones(2), attack=False)
    finally:
        torch.set_float32_matmul_precision(before)
    wide = nn.Sequential(nn.Linear(2, 300), nn.ReLU(), nn.Linear(300, 3)).to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"300 \+ 1 terms|301 terms"):
        float_error(affine_layers(wide)[0], crown_bounds(affine_layers(wide)[0], -np.ones(2), np.ones(2))[0],
                    -np.ones(2), np.ones(2), unit_roundoff(wide))


def test_a_margin_within_the_rounding_is_not_certified():
    """Two logits whose exact difference is 1e-9 everywhere: exactly, the property holds on any box;
    but float32 rounds each logit by far more, so its forward can make them tie or swap."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    with torch.no_grad():
        model[2].weight[1] = model[2].weight[0]
        model[2].bias[1] = model[2].bias[0] - 1e-9
    x0 = torch.tensor([0.3, -0.2])
    lo, hi = (x0 - 0.1).numpy(), (x0 + 0.1).numpy()
    result = verify_point(model, x0, 0, lo, hi, attack=False)
    assert result.status == "timeout" and "rounding" in result.detail["note"]
    with torch.no_grad():
        model[2].bias[1] = model[2].bias[0] - 1.0  # a margin of 1: certified
    assert verify_point(model, x0, 0, lo, hi, attack=False).status == "verified"


def test_a_class_left_undecided_does_not_hide_a_counterexample_in_the_next():
    """Class 1's margin is 1e-9 everywhere (within the rounding: undecided), but CROWN bounds it loosely
    (two copies of one ReLU, one added and one subtracted), so its MILP runs first; class 2 wins for
    x₁ > 0.2. The verdict is the counterexample, not the first class's "timeout"."""
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 3)).eval()
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]))
        model[0].bias.zero_()
        model[2].weight.copy_(torch.tensor([[0.0, 0.0, 0.0], [-1.0, 1.0, 0.0], [0.0, 0.0, 1.0]]))
        model[2].bias.copy_(torch.tensor([0.0, -1e-9, -0.2]))
    x0, lo, hi = torch.zeros(2), -np.ones(2), np.ones(2)
    layers = affine_layers(model)[0]
    bounds, spec_lower = crown_bounds(layers, lo, hi, _margin_spec(0, 3))
    assert spec_lower[0] < spec_lower[1] < 0  # the undecided class comes first
    result = verify_point(model, x0, 0, lo, hi, attack=False)
    assert result.status == "falsified" and result.method == "milp" and result.detail["class"] == 2
    with torch.no_grad():
        model[2].bias[2] = -2.0  # class 2 never wins: only the undecided class is left
    result = verify_point(model, x0, 0, lo, hi, attack=False)
    assert result.status == "timeout" and result.detail["class"] == 1 and "rounding" in result.detail["note"]


def test_a_box_too_wide_to_bound_is_refused_without_warnings():
    """Bounds of 1e300 overflowed float64 with numpy's warnings on the way; now one ValueError, nothing printed."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="reaches beyond"):
            verify_point(_tiny(0), torch.zeros(2), 0, np.full(2, -1e300), np.full(2, 1e300), attack=False)
        model = _tiny(0).double()
        with torch.no_grad():
            model[2].weight.mul_(1e200), model[4].weight.mul_(1e200)  # so large that a unit box's bounds overflow
        with pytest.raises(ValueError, match="overflow float64"):
            verify_point(model, torch.zeros(2), 0, -np.ones(2), np.ones(2), attack=False)
