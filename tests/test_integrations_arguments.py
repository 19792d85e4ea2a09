"""Both trainer callbacks check their arguments when they are built, with HardeningSchedule's own
checks, not once the trainer has started."""
import importlib

import pytest
import torch


@pytest.mark.parametrize("integration, framework", [("lightning", "lightning.pytorch"),
                                                    ("transformers", "transformers")])
@pytest.mark.parametrize("kwargs, message", [
    (dict(switch_at="auto"), "switch_at='auto' needs probe="),
    (dict(switch_at=0.25, probe=torch.zeros(2, 8)), "probe= is only used with switch_at='auto'"),
    (dict(switch_at=1.5), r"switch_at is a fraction of training in \[0, 1\) or 'auto', got 1.5"),
    (dict(epsilon=0.9), "epsilon must be in"),
])
def test_bad_arguments_fail_when_the_callback_is_built(integration, framework, kwargs, message):
    pytest.importorskip(framework)
    callback = importlib.import_module(f"lambda_gelu.integrations.{integration}").HardeningCallback
    with pytest.raises(ValueError, match=message):
        callback(**kwargs)
