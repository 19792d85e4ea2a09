"""The refit's two ways of reaching each activation: every batch paused where it was (PausedForwards, the default)
against every batch run again from the start (RestartedForwards, the reference)."""
import copy
import threading

import pytest
import torch
import torch.nn as nn

from lambda_gelu.reluize.capture import PausedForwards, RestartedForwards
from lambda_gelu.reluize.refit import refit_consumers, swap_and_refit
from test_reluize import _batches


def _transformers_models():
    transformers = pytest.importorskip("transformers")
    small = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=64, vocab_size=100)
    return {
        "bert": lambda: transformers.BertModel(transformers.BertConfig(**small)),
        "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=3, n_embd=32, n_head=2,
                                                                             vocab_size=100, n_positions=32)),
        "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**small, num_key_value_heads=1)),
        "gemma3": lambda: transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
            **small, num_key_value_heads=1, head_dim=16, sliding_window=8)),
    }


def _models_and_batches():
    from lambda_gelu_lab.models import ResNet
    g = torch.Generator().manual_seed(0)
    yield "mlp", lambda: nn.Sequential(nn.Linear(12, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 5)), \
        [torch.randn(16, 12, generator=g) for _ in range(3)]
    yield "resnet", lambda: ResNet(1, 5, nn.GELU, widths=(4, 8, 8)), [torch.randn(4, 1, 8, 8, generator=g)
                                                                      for _ in range(3)]
    for name, make in _transformers_models().items():
        yield name, make, _batches(3)


@pytest.mark.parametrize("name", ["mlp", "resnet", "bert", "gpt2", "llama", "gemma3"])
def test_the_paused_forwards_refit_every_layer_as_the_restarted_ones_and_run_each_batch_once(name):
    make, batches = next((m, b) for n, m, b in _models_and_batches() if n == name)
    torch.manual_seed(0)
    paused = make().eval()
    restarted = copy.deepcopy(paused)
    consumers = refit_consumers(paused, batches[0])
    assert len(consumers) >= 2
    runs, threads = {}, set(threading.enumerate())  # other tests may have left threads of their own
    for model, forwards in ((paused, PausedForwards), (restarted, RestartedForwards)):
        first = next(m for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d, nn.Embedding)))
        calls = []
        handle = first.register_forward_pre_hook(lambda mod, args: calls.append(1))
        try:
            swap_and_refit(model, batches, 1e-3, consumers, forwards=forwards)
        finally:
            handle.remove()
        runs[forwards] = len(calls)
    assert runs[PausedForwards] == len(batches) < runs[RestartedForwards]
    for (key, a), b in zip(paused.state_dict().items(), restarted.state_dict().values()):
        assert torch.equal(a, b), key  # the same operations in the same order: equal bit for bit
    assert set(threading.enumerate()) <= threads  # the paused forwards' threads have ended


class _Breaks(nn.Module):
    def forward(self, x):
        raise ValueError("this layer cannot run")


def test_an_error_inside_a_paused_forward_reaches_the_caller_and_no_thread_is_left():
    model = nn.Sequential(nn.Linear(4, 4), nn.GELU(), nn.Linear(4, 4), _Breaks(), nn.GELU(), nn.Linear(4, 4))
    before = set(threading.enumerate())
    with pytest.raises(ValueError, match="this layer cannot run"):
        with PausedForwards(model, [torch.randn(2, 4), torch.randn(2, 4)]) as walk:
            assert all(s is not None for s in walk.reach(model[1]))
            walk.reach(model[4])
    assert set(threading.enumerate()) <= before


def test_a_module_the_forward_never_calls_is_not_reached():
    model = nn.Sequential(nn.Linear(4, 4), nn.GELU(), nn.Linear(4, 4))
    with PausedForwards(model, [torch.randn(2, 4)]) as walk:
        assert walk.reach(nn.GELU()) == [None]
        assert walk.reach(model[2]) == [None]  # the forward has ended: nothing after it is reached either
    with RestartedForwards(model, [torch.randn(2, 4)]) as walk:
        assert walk.reach(nn.GELU()) == [None] and walk.reach(model[2])[0] is not None
