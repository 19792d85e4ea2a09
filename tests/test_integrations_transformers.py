"""HardeningCallback under the real transformers.Trainer: a tiny GPT-2 reaches λ_target, and a run
resumed from a mid-anneal checkpoint ends with the same weights as an uninterrupted one."""
import pytest
import torch

import lambda_gelu as lg

transformers = pytest.importorskip("transformers")
from lambda_gelu.integrations.transformers import HardeningCallback  # noqa: E402

STEPS, BATCH = 20, 4


class _Tokens(torch.utils.data.Dataset):
    def __init__(self):
        self.ids = torch.randint(0, 64, (STEPS * BATCH, 16), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _model(seed):
    torch.manual_seed(seed)
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2, bos_token_id=0,
                                     eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config)
    assert lg.convert_to_lambda_gelu_(model) == ["transformer.h.0.mlp.act", "transformer.h.1.mlp.act"]
    return model


def _trainer(model, out, **args):
    optimizer = torch.optim.AdamW(lg.lambda_param_groups(model, lr=1e-3, weight_decay=0.01, no_decay_1d=True))
    args = transformers.TrainingArguments(output_dir=str(out), max_steps=STEPS, per_device_train_batch_size=BATCH,
                                          report_to=[], use_cpu=True, seed=0, data_seed=0, logging_steps=1000,
                                          disable_tqdm=True, **args)
    return transformers.Trainer(model=model, args=args, train_dataset=_Tokens(), optimizers=(optimizer, None),
                                callbacks=[HardeningCallback(switch_at=0.25)])


def _lambdas(model):
    return {name: m.lam.item() for name, m in lg.lambda_modules(model)}


@pytest.mark.slow
def test_trainer_reaches_lambda_target_and_resumes_exactly_mid_anneal(tmp_path):
    whole = _model(0)
    _trainer(whole, tmp_path / "whole", save_strategy="no").train()
    target = lg.lambda_target(0.005)
    assert all(lam == pytest.approx(target, rel=1e-6) for lam in _lambdas(whole).values())
    assert all(m.frozen for _, m in lg.lambda_modules(whole))

    interrupted = _model(0)  # saves at step 12: past the switch (5), mid-anneal
    _trainer(interrupted, tmp_path / "run", save_strategy="steps", save_steps=12).train()
    resumed = _model(1)  # other weights: everything must come from the checkpoint
    _trainer(resumed, tmp_path / "run").train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-12"))
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


@pytest.mark.slow
def test_trainer_switches_automatically_given_a_probe(tmp_path):
    """switch_at="auto" under the Trainer: the probe batch (dict of kwargs, as the model takes it) is
    checked as training goes, the switch lands within the AutoSwitch bounds, and λ still ends at target."""
    model = _model(0)
    probe = {"input_ids": _Tokens().ids[:8]}
    callback = HardeningCallback(switch_at="auto", probe=probe)
    trainer = _trainer(model, tmp_path, save_strategy="no")
    trainer.callback_handler.callbacks = [c for c in trainer.callback_handler.callbacks
                                          if not isinstance(c, HardeningCallback)] + [callback]
    trainer.train()
    auto = lg.AutoSwitch()
    assert auto.earliest * STEPS <= callback.schedule.switch_step <= auto.latest * STEPS
    target = lg.lambda_target(0.005)
    assert all(lam == pytest.approx(target, rel=1e-6) for lam in _lambdas(model).values())
