"""The library counts exact zeros one way (lambda_gelu.core.zeros.exact_zeros); the per-ReLU views of it agree."""
import math

import torch
import torch.nn as nn

from lambda_gelu.core.zeros import exact_zeros
from lambda_gelu.inference.sparse import activation_sparsity


class Masked(nn.Module):
    """A model fed a mapping, as a Hugging Face one: its ReLU's input is given, so the count is known."""

    def __init__(self):
        super().__init__()
        self.act = nn.ReLU()

    def forward(self, values, attention_mask):
        return self.act(values)


def test_padding_is_left_out_and_minus_zero_is_zero_and_nan_is_not():
    values = torch.tensor([[[0.0, 1.0], [-0.0, float("nan")], [5.0, 5.0]]])  # (1, 3 tokens, 2 units)
    mask = torch.tensor([[1, 1, 0]])  # the third token is padding: its 5s are not counted
    counted = exact_zeros(Masked(), [{"values": values, "attention_mask": mask}])["act"]
    assert counted["outputs"] == 4 and counted["zero_fraction"] == 0.5  # 0 and -0 of 0, 1, -0, NaN
    assert counted["dead_fraction"] == 0.5  # unit 0 held only zeros on real tokens; unit 1 held 1 and NaN
    only_zeros = exact_zeros(Masked(), [{"values": torch.zeros(1, 2, 2), "attention_mask": torch.ones(1, 2)}])
    assert only_zeros["act"]["dead_fraction"] == 1.0


def test_sites_that_share_a_key_are_counted_together_and_inputs_can_be_counted():
    first, second = nn.Linear(4, 4), nn.Linear(4, 4)
    model = nn.Sequential(first, nn.ReLU(), second)
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    counted = exact_zeros(model, [x], [("both", first, "input"), ("both", second, "input")])
    relu = model[1](first(x))
    assert counted["both"]["outputs"] == 64
    assert counted["both"]["zero_fraction"] == int((x == 0).sum() + (relu == 0).sum()) / 64


def test_activation_sparsity_is_the_same_count():
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 3)).train()
    x = torch.randn(50, 6, generator=torch.Generator().manual_seed(1))
    stats = activation_sparsity(model, x.split(10))["1"]
    out = model[1](model[0](x))
    assert stats["zero_fraction"] == int((out == 0).sum()) / out.numel() and stats["outputs"] == out.numel()
    assert math.isclose(stats["dead_fraction"], float((out == 0).all(0).float().mean()))
    assert model.training  # measured in eval mode, given back as it was
