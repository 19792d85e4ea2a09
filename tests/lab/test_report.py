"""The report and the CSV export, end to end from a real (small) sweep."""
import csv
import json
import os

import pytest

from lambda_gelu_lab.cli import main


@pytest.mark.slow
def test_report_and_export(tmp_path):
    out = str(tmp_path / "rep")
    assert main(["run", "wine-mlp", "--seeds", "3", "--epochs", "2", "--out", out, "--quiet", "--no-report"]) == 0
    doc = tmp_path / "docs" / "results.md"
    assert main(["report", "--out", out, "--output", str(doc)]) == 0
    text = doc.read_text()
    for needle in ("## wine-mlp", "| GELU (→ direct swap to ReLU) | 3 |", "| ReLU from scratch | 3 |",
                   "annealed→ReLU − direct swap | 3 |", "p (TOST)",
                   "- **wine-mlp** (`",  # the summary names each experiment, not its last arm
                   "Layerwise hardness profile", "lambda-gelu lab run wine-mlp",
                   "](results_img/lambda_wine-mlp_"):
        assert needle in text, needle
    pngs = sorted((tmp_path / "docs" / "results_img").glob("*.png"))  # λ over training; Δλ against accuracy
    assert [p.name.split("_")[0] for p in pngs] == ["drift", "lambda"], pngs
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in pngs)
    assert "## Does hardness drift predict deployment quality?" in text
    assert "No variant has 5 runs yet" in text  # 3 seeds of 2 λ arms: no correlation to show, said so
    assert main(["export", "--csv", "--out", out]) == 0
    with open(os.path.join(out, "runs.csv")) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 12 and json.loads(rows[0]["config"])["task"] == "wine-mlp"


def test_a_stored_task_name_cannot_lead_an_image_out_of_the_report(tmp_path):
    """Image names are built from stored task names; a crafted store once wrote a PNG outside the report."""
    from lambda_gelu_lab.report.plots import _pyplot, _save
    plt = _pyplot()
    img_dir = tmp_path / "report_img"
    img_dir.mkdir()
    fig = plt.figure()
    path = _save(plt, fig, img_dir, "lambda_../../../escaped_0123.png")
    assert path.parent == img_dir and path.is_file() and not list(tmp_path.glob("escaped*"))
