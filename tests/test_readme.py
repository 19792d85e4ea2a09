"""The README's quickstart runs as written and ends in an exact-ReLU model that kept its loss."""
import re
from pathlib import Path

import torch.nn as nn

import lambda_gelu as lg

README = Path(__file__).resolve().parents[1] / "README.md"


def test_quickstart_runs():
    text = README.read_text(encoding="utf-8")
    quickstart = text.split("## Quickstart", 1)[1]
    code = re.search(r"```python\n(.*?)```", quickstart, re.S).group(1)
    assert len(code.strip().splitlines()) <= 16
    scope: dict = {}
    exec(compile(code, str(README), "exec"), scope)
    model = scope["model"]
    assert not list(lg.lambda_modules(model)) and sum(isinstance(m, nn.ReLU) for m in model) == 2
    learned = [v.item() for v in scope["schedule"].learned.values()]
    assert all(v != 1.5 for v in learned)  # λ moved before the switch
    x, y = scope["x"], scope["y"]
    relu_loss = nn.functional.cross_entropy(model(x), y).item()
    assert abs(relu_loss - scope["loss"].item()) < 0.02 * scope["loss"].item()


def test_ci_runs_the_readme_test_command():
    text = README.read_text(encoding="utf-8")
    commands = [line for line in text.splitlines() if line.startswith("apt-get update")]
    assert len(commands) == 2 and commands[0].endswith("lambda-gelu") and commands[1].endswith("python -m pytest")
    ci = (README.parent / ".ci" / "run").read_text()
    assert commands[1] in ci.splitlines()
