"""HardeningCallback under the real Lightning Trainer: λ learns, freezes at the switch, reaches
λ_target, and a run resumed from a mid-anneal checkpoint ends where an uninterrupted one does."""
import pytest
import torch
import torch.nn as nn

import lambda_gelu as lg

L = pytest.importorskip("lightning.pytorch")
from lambda_gelu.integrations.lightning import HardeningCallback  # noqa: E402

STEPS = 24


class _Regressor(L.LightningModule):
    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 1))
        lg.convert_to_lambda_gelu_(self.net)

    def forward(self, x):  # what the automatic switch's probe runs through
        return self.net(x)

    def training_step(self, batch, _):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(lg.lambda_param_groups(self, lr=0.05), momentum=0.9)


def _data():  # two epochs of 12 steps; the checkpoint at step 12 is mid-anneal
    g = torch.Generator().manual_seed(1)
    n = STEPS * 8 // 2
    data = torch.utils.data.TensorDataset(torch.randn(n, 8, generator=g), torch.randn(n, 1, generator=g))
    return torch.utils.data.DataLoader(data, batch_size=8)


def _trainer(root, callbacks=(), **kw):
    return L.Trainer(max_steps=STEPS, accelerator="cpu", logger=False, enable_progress_bar=False,
                     enable_model_summary=False, default_root_dir=str(root),
                     callbacks=[HardeningCallback(), *callbacks], **kw)


@pytest.mark.slow
def test_lightning_reaches_lambda_target_and_resumes_mid_anneal(tmp_path):
    whole = _Regressor()
    _trainer(tmp_path / "a", enable_checkpointing=False).fit(whole, _data())
    lam = whole.net[1]
    assert lam.frozen and lam.lam.item() == pytest.approx(lg.lambda_target(0.005), rel=1e-6)
    assert lam.lambda_start.item() != pytest.approx(1.5)  # it learned before the switch (step 6)

    at_step_12 = L.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=12, save_top_k=-1)
    _trainer(tmp_path / "b", callbacks=[at_step_12]).fit(_Regressor(), _data())
    mid = tmp_path / "ckpt" / "epoch=0-step=12.ckpt"  # mid-anneal: the switch was at step 6
    resumed = _Regressor(seed=1)  # other weights: everything must come from the checkpoint
    _trainer(tmp_path / "c", enable_checkpointing=False).fit(resumed, _data(), ckpt_path=str(mid))
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


@pytest.mark.slow
def test_lightning_auto_switch_and_learning_during_the_anneal(tmp_path):
    """switch_at="auto" with a probe batch, and freeze=False: λ keeps learning while it anneals and
    still ends at λ_target; the switch lands within the AutoSwitch bounds."""
    model = _Regressor()
    probe = torch.randn(32, 8, generator=torch.Generator().manual_seed(2))
    callback = HardeningCallback(switch_at="auto", probe=probe, freeze=False)
    L.Trainer(max_steps=STEPS, accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
              enable_checkpointing=False, default_root_dir=str(tmp_path), callbacks=[callback]).fit(model, _data())
    auto = lg.AutoSwitch()
    assert auto.earliest * STEPS <= callback.schedule.switch_step <= auto.latest * STEPS
    lam = model.net[1]
    assert not lam.frozen and lam.s.requires_grad  # still learning: the freeze ablation
    assert lam.lam.item() == pytest.approx(lg.lambda_target(0.005), rel=1e-6)
