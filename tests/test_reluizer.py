"""The step-wise Reluizer: the same steps as reluize() in a loop of your own, and under the Hugging Face Trainer —
in one process, or over two gloo ranks with DDP, equal to one process on the whole batch."""
import os

import pytest
import torch
import torch.nn as nn

import lambda_gelu as lg
from lambda_gelu.reluize import Reluizer

STEPS = 12


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 32), nn.SiLU(), nn.Linear(32, 4))


def _batches():
    g = torch.Generator().manual_seed(1)
    return [torch.randn(16, 8, generator=g) for _ in range(STEPS)]


@pytest.mark.parametrize("settings", [dict(schedule="swap"), dict(schedule="anneal", anneal=0.5, sparsity=0.01)])
def test_a_loop_of_your_own_over_the_reluizer_is_reluize(settings):
    """Same optimizer, same batches: the weights and the losses are reluize()'s, bit for bit."""
    reference = _mlp()
    result = lg.reluize(reference, _batches(), STEPS, lr=1e-3, weight_decay=0.01, lr_schedule="constant", **settings)

    model = _mlp()
    reluizer = Reluizer(model, STEPS, **settings)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    model.eval()
    losses, lams = [], []
    for batch in _batches():
        loss = reluizer.loss(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(reluizer.last["loss"].item())
        lams.append(reluizer.last["lam"])
        reluizer.step()
    reluizer.finish()
    assert losses == [e["loss"] for e in result.log] and lams == [e["lam"] for e in result.log]
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.state_dict().values()))
    assert [type(m).__name__ for m in model] == ["Linear", "ReLU", "Linear", "ReLU", "Linear"]
    assert not any(m._forward_hooks for m in model.modules())  # the sparsity penalty's hooks are gone


def test_a_resumed_reluizer_goes_on_at_its_step():
    model, teacher = _mlp(), _mlp()
    reluizer = Reluizer(model, STEPS, schedule="anneal", anneal=0.5, teacher=teacher)
    for _ in range(3):
        reluizer.step()
    lam = reluizer.lam
    again = Reluizer(_mlp(), STEPS, schedule="anneal", anneal=0.5, teacher=teacher)
    again.load_state_dict(reluizer.state_dict())
    assert again.lam == lam and 1 < lam < float("inf")
    again.load_state_dict({"step": 6})  # past the anneal: exact ReLU
    assert again.lam == float("inf") and sum(isinstance(m, nn.ReLU) for m in again.model.modules()) == 2


@pytest.mark.parametrize("settings, message", [(dict(refit=2), "refit=2: needs batches before the first step"),
                                               (dict(schedule="blockwise"), "schedule=blockwise: needs batches"),
                                               (dict(recalibrate=5), "recalibrate=5"),
                                               (dict(gate_zeros=0.8, gate_zeros_at_once=True),
                                                "^gate_zeros_at_once=True: needs batches before the first step")])
def test_what_needs_batches_before_the_first_step_is_left_to_reluize(settings, message):
    model = _mlp()
    with pytest.raises(ValueError, match=message):
        Reluizer(model, STEPS, **settings)
    assert isinstance(model[1], nn.GELU)  # refused before any change
    with pytest.raises(ValueError, match="no GELU module"):
        Reluizer(nn.Sequential(nn.Linear(2, 2)), STEPS)


class _HeadWithFunctionalGELU(nn.Module):  # as RoBERTa's LM head
    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(8, 8)

    def forward(self, x):
        return nn.functional.gelu(self.dense(x))


def test_a_gelu_applied_as_a_function_is_named_as_the_reluizer_converts_the_rest():
    model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), _HeadWithFunctionalGELU())
    with pytest.warns(UserWarning, match=r"_HeadWithFunctionalGELU.forward \(e.g. at '2'\) seems to apply gelu as a "
                      "function; such calls stay GELU"):
        Reluizer(model, STEPS)
    assert isinstance(model[1], nn.ReLU)


def test_bfloat16_multiplies_in_bfloat16_and_keeps_the_weights_the_gradients_and_the_loss_in_float32():
    """precision="bfloat16": the teacher's and the student's layers run under a bfloat16 autocast (the loss is the
    one computed from such forwards by hand, bit for bit), while the weights, their gradients and the loss stay
    float32; "float32" multiplies in float32."""
    from lambda_gelu.core.batches import run_batch
    from lambda_gelu.reluize.losses import distillation_loss
    seen = []
    for precision, dtype in (("bfloat16", torch.bfloat16), ("float32", torch.float32)):
        model, batch = _llama(), {"input_ids": torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))}
        reluizer = Reluizer(model, STEPS, precision=precision)
        hooks = [m.register_forward_hook(lambda m, a, out: seen.append(out.dtype))
                 for net in (model, reluizer.teacher) for m in net.modules() if isinstance(m, nn.Linear)]
        loss = reluizer.loss(batch)
        for h in hooks:
            h.remove()
        assert set(seen) == {dtype} and len(seen) == 2 * sum(isinstance(m, nn.Linear) for m in model.modules())
        seen.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            with torch.no_grad():
                target = run_batch(reluizer.teacher, batch, hidden_states=True)
            output = run_batch(model, batch, hidden_states=True)
        assert loss.dtype == torch.float32 and torch.equal(loss, distillation_loss(output, target, batch))
        loss.backward()
        assert all(p.dtype == p.grad.dtype == torch.float32 for p in model.parameters() if p.grad is not None)


def test_auto_precision_is_bfloat16_where_the_cpu_multiplies_it_natively():
    from lambda_gelu.reluize.precision import autocast_dtype, native_bfloat16
    cpu = torch.device("cpu")
    assert Reluizer(_mlp(), STEPS, precision="auto").autocast == autocast_dtype("auto", cpu) == (
        torch.bfloat16 if native_bfloat16(cpu) else None)
    assert Reluizer(_mlp(), STEPS).autocast is None  # the library's default: float32
    with pytest.raises(ValueError, match="precision must be one of float32, bfloat16, auto, got 'half'"):
        Reluizer(_mlp(), STEPS, precision="half")
    with pytest.raises(ValueError, match="precision='auto': used by schedule='swap' or 'anneal' only"):
        lg.ReluizeConfig(schedule="blockwise", precision="auto")
    try:  # what the CPU says it has, where the system says it (Linux)
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    except (OSError, StopIteration):
        pytest.skip("no /proc/cpuinfo flags to compare native_bfloat16 with (the rest of this test ran)")
    assert native_bfloat16(cpu) == bool({"amx_tile", "avx512_bf16"} & set(flags))


# --- under the Hugging Face Trainer -------------------------------------------------------------------------------

BATCH, WORLD = 4, 2


def _llama():
    import transformers
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    return transformers.LlamaForCausalLM(config)


class _Tokens(torch.utils.data.Dataset):
    """Equal-length sequences: every rank's mean over its tokens weighs as the whole batch's."""

    def __init__(self):
        self.ids = torch.randint(0, 64, (STEPS * BATCH, 16), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": self.ids[i]}


def _logits_kl(student, teacher, batch):
    """A mean over tokens, as one process over the whole batch computes it; the default loss's hidden-state term
    (a ratio of sums over the batch) is normalised per rank under DDP."""
    log_s, log_t = student.logits.log_softmax(-1), teacher.logits.log_softmax(-1)
    return (log_t.exp() * (log_t - log_s)).sum(-1).mean()


def _train(out, per_device, optim="adamw_torch", loss=None, **reluize):
    import transformers

    from lambda_gelu.integrations.transformers import ReluizeTrainer
    model = _llama()
    args = transformers.TrainingArguments(output_dir=str(out), max_steps=STEPS, per_device_train_batch_size=per_device,
                                          learning_rate=1e-3 if optim != "sgd" else 1.0, optim=optim,
                                          lr_scheduler_type="constant", weight_decay=0.0,
                                          report_to=[], use_cpu=True, seed=0, data_seed=0, logging_steps=1000,
                                          disable_tqdm=True, save_strategy="no", train_sampling_strategy="sequential",
                                          **({"ddp_backend": "gloo"} if "WORLD_SIZE" in os.environ else {}))
    trainer = ReluizeTrainer(model=model, args=args, train_dataset=_Tokens(), reluize=lg.ReluizeConfig(**reluize),
                             loss=loss)
    trainer.train()
    return model, trainer


def test_the_trainer_reluizes_a_gated_llm_and_its_config_names_relu(tmp_path):
    pytest.importorskip("transformers")
    model, trainer = _train(tmp_path, BATCH, schedule="anneal", anneal=0.5)
    assert [type(layer.mlp.act_fn) for layer in model.model.layers] == [nn.ReLU, nn.ReLU]
    assert model.config.hidden_act == "relu" and trainer.reluizer.step_count == STEPS
    assert trainer.state.global_step == STEPS


def _rank(rank, port, out):
    """One of two ranks, joined as torchrun would (the environment); the Trainer sets up DDP over gloo itself."""
    import socket
    loopback = next((name for _, name in socket.if_nameindex() if name in ("lo", "lo0")), None)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(WORLD), LOCAL_WORLD_SIZE=str(WORLD))
    if loopback and not os.environ.get("GLOO_SOCKET_IFNAME"):
        os.environ["GLOO_SOCKET_IFNAME"] = loopback
    torch.set_num_threads(1)
    model, _ = _train(os.path.join(out, f"run{rank}"), BATCH // WORLD, "sgd", _logits_kl, schedule="anneal",
                      anneal=0.5)
    if rank == 0:
        torch.save(model.state_dict(), os.path.join(out, "ddp.pt"))


@pytest.mark.slow
def test_the_trainer_over_two_ddp_ranks_is_one_process_on_the_whole_batch(tmp_path):
    """Each rank takes half of every batch (a sequential sampler, sequences of one length): DDP's averaged gradient
    is the whole batch's, so the weights after the anneal and the ReLU steps are one process's, up to the rounding
    of summing halves (SGD: Adam would blow up rounding in the coordinates whose gradient is nearly zero)."""
    pytest.importorskip("transformers")
    from test_distributed import _spawn
    start = _llama().state_dict()
    single, _ = _train(tmp_path / "single", BATCH, "sgd", _logits_kl, schedule="anneal", anneal=0.5)
    _spawn(_rank, str(tmp_path))
    ddp = torch.load(tmp_path / "ddp.pt")
    for name, weight in single.state_dict().items():
        moved = (weight - start[name]).abs().max().item()
        assert (weight - ddp[name]).abs().max().item() <= 1e-3 * moved + 1e-7, name
    assert max((w - start[k]).abs().max().item() for k, w in single.state_dict().items()) > 1e-4  # it trained


def _loop(model, reluizer, rank=0, world=1):
    """SGD over the Reluizer's steps, each rank on its share of every batch (as DDP and FSDP split a batch)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    data = _Tokens()
    for step in range(STEPS):
        ids = torch.stack([data[i]["input_ids"] for i in range(step * BATCH, (step + 1) * BATCH)])[rank::world]
        loss = reluizer.loss({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, model)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        reluizer.step()
    reluizer.finish()


def _fsdp_rank(rank, port, out):
    from test_distributed import _init
    from torch.distributed import destroy_process_group
    from torch.distributed.fsdp import fully_shard
    _init(rank, port)
    try:
        model = _llama()
        reluizer = Reluizer(model, STEPS, schedule="anneal", anneal=0.5, loss=_logits_kl)  # converted, then sharded
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        _loop(model, reluizer, rank, WORLD)
        state = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in model.state_dict().items()}
        torch.save({"state": state, "sharded": hasattr(model.lm_head.weight, "full_tensor"),
                    "acts": [type(layer.mlp.act_fn).__name__ for layer in model.model.layers]},
                   os.path.join(out, f"rank{rank}.pt"))
    finally:
        destroy_process_group()
    os._exit(0)  # as test_distributed's FSDP ranks: the results are written, skip the interpreter's teardown


@pytest.mark.slow
def test_the_reluizer_under_fsdp_is_one_process_on_the_whole_batch(tmp_path):
    """FSDP2 shards the tiny Llama over two gloo ranks after the Reluizer converted it; the anneal and the ReLU
    steps end with one process's weights on the whole batch."""
    pytest.importorskip("transformers")
    pytest.importorskip("torch.distributed.fsdp", reason="this torch has no FSDP")
    from test_distributed import _spawn
    start = _llama().state_dict()
    single = _llama()
    _loop(single, Reluizer(single, STEPS, schedule="anneal", anneal=0.5, loss=_logits_kl))
    _spawn(_fsdp_rank, str(tmp_path))
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    assert ranks[0]["sharded"] and ranks[0]["acts"] == ["ReLU", "ReLU"]
    for name, weight in single.state_dict().items():
        moved = (weight - start[name]).abs().max().item()
        assert (weight - ranks[0]["state"][name]).abs().max().item() <= 1e-3 * moved + 1e-7, name


def _threshold_rank(rank, port, out, wrap):
    from test_distributed import _init
    from torch.distributed import destroy_process_group
    _init(rank, port)
    try:
        model = _llama()
        reluizer = Reluizer(model, STEPS, gate_zeros=0.8, loss=_logits_kl)  # the biases exist before the wrapping
        runner = model
        if wrap == "fsdp":
            from torch.distributed.fsdp import fully_shard
            for layer in model.model.layers:
                fully_shard(layer)
            fully_shard(model)
        else:
            runner = torch.nn.parallel.DistributedDataParallel(model)
        _loop(runner, reluizer, rank, WORLD)
        biases = [layer.mlp.gate_proj.bias.detach() for layer in model.model.layers]
        torch.save([b.full_tensor() if hasattr(b, "full_tensor") else b for b in biases],
                   os.path.join(out, f"rank{rank}.pt"))
    finally:
        destroy_process_group()
    os._exit(0)


@pytest.mark.slow
@pytest.mark.parametrize("wrap", ["ddp", "fsdp"])
def test_the_gate_threshold_moves_every_rank_by_the_same_shift(tmp_path, wrap):
    """Each rank measures its share of the batch; the shift applied is their mean, so the replicas (DDP) stay one
    model and a sharded bias (FSDP) moves as a whole."""
    pytest.importorskip("transformers")
    if wrap == "fsdp":
        pytest.importorskip("torch.distributed.fsdp", reason="this torch has no FSDP")
    from test_distributed import _spawn
    _spawn(_threshold_rank, str(tmp_path), wrap)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    for a, b in zip(*ranks):
        assert torch.equal(a, b) and a.max() < 0
