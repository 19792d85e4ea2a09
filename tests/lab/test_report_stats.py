"""The report's statistics as data: paired comparisons, TOST, and the findings' verdicts."""
import math

import numpy as np
import pytest
from scipy import stats

from lambda_gelu_lab.report.stats import MARGIN, experiment_labels, findings, paired, tost_p


def test_tost_by_hand():
    d = np.array([0.001, -0.002, 0.003, 0.0, 0.001])
    n, m, se = len(d), d.mean(), d.std(ddof=1) / math.sqrt(len(d))
    # the two one-sided tests of H0: mean ≤ −0.005 and H0: mean ≥ +0.005
    expected = max(1 - stats.t.cdf((m + MARGIN) / se, n - 1), stats.t.cdf((m - MARGIN) / se, n - 1))
    assert tost_p(d) == pytest.approx(expected)
    assert tost_p(d) < 0.05
    assert tost_p(np.array([0.004, 0.006, 0.005])) > 0.05   # centred on the margin: not equivalent
    assert tost_p(np.zeros(4)) == 0.0 and tost_p(np.full(4, 0.01)) == 1.0


def test_a_ci_containing_zero_is_not_equivalence():
    """Noisy seeds: no difference detected, and no equivalence either — inconclusive, not "matches"."""
    a, b = [0.90, 0.95, 0.88, 0.97], [0.93, 0.90, 0.94, 0.91]
    c = paired(a, b)
    assert c.lo < 0 < c.hi and c.difference == "not detected"
    assert c.equivalent is False
    tight = paired([0.900, 0.901, 0.902, 0.903], [0.901, 0.900, 0.903, 0.902])
    assert tight.difference == "not detected" and tight.equivalent is True


def test_one_seed_is_not_a_verdict():
    c = paired([0.9], [0.95])
    assert c.n == 1 and c.difference == "n/a" and c.equivalent is None


def _run(arm, seed, test, sub, variant=None, t=0.1, c=9.0, lam_end=None, task="toy"):
    return {"task": task, "arm": arm, "variant": variant or arm, "seed": seed, "test_acc": test, "sub_test_acc": sub,
            "config": {"temperature": t, "multiplier": c, "init_lambda": 1.5},
            "metrics": {"lambda_end": lam_end} if lam_end else {}}


def _verdicts(runs, task="toy"):
    return {f.claim: f.holds for f in findings({(task, "h"): runs})}


def test_findings_by_hand():
    runs = []
    for s in range(4):
        noise = 0.0002 * s
        runs += [_run("gelu", s, 0.90 + noise, 0.80 + noise),            # the swap loses 10 points
                 _run("lambda-harden", s, 0.90 + noise, 0.90 - noise),   # annealing loses nothing
                 _run("lambda", s, 0.9, 0.5, lam_end={"a.0": 1.6 + s, "a.1": 3.0 + s, "a.2": 9.0 + s})]
    for t in (0.03, 0.3, 1.0):  # Δλ = c / t: grows with c, falls with t
        for c in (1.0, 3.0, 27.0):
            runs.append(_run("lambda", 0, 0.9, 0.5, f"lambda[t={t},c={c}]", t, c,
                             lam_end={"a.0": 1.5 + c / t, "a.1": 1.5 + c / t, "a.2": 1.5 + c / t}))
    v = _verdicts(runs)
    assert v["annealed→ReLU keeps more accuracy than a direct GELU→ReLU swap"] == "yes"
    assert v["the annealed ReLU network matches the GELU original"] == "yes (equivalent)"
    assert v["layerwise hardness profiles are stable across seeds"] == "yes"
    assert v["hardness drift Δλ grows with the effective step c·σ(s/t)²/t² (with c, and as t falls)"] == "yes"


def test_matching_needs_equivalence_and_one_seed_is_na():
    noisy = []
    for s, (orig, annealed) in enumerate([(0.90, 0.93), (0.95, 0.89), (0.88, 0.94), (0.97, 0.91)]):
        noisy += [_run("gelu", s, orig, orig - 0.1), _run("lambda-harden", s, annealed, annealed)]
    assert _verdicts(noisy)["the annealed ReLU network matches the GELU original"] == "inconclusive"
    one = [_run("gelu", 0, 0.90, 0.80), _run("lambda-harden", 0, 0.85, 0.85)]
    v = _verdicts(one)
    assert set(v.values()) == {"n/a (one seed)"}
    gpt = [r | {"task": "stdlib-gpt"} for r in one]
    assert _verdicts(gpt, "stdlib-gpt")["GPT-2: annealing to ReLU deteriorates the model severely"] == "n/a (one seed)"


def _sparse_runs(arm, sparsity, accs, zeros, losses=None):
    losses = losses or [1.0] * len(accs)
    variant = arm if sparsity is None else f"{arm}[sparsity={sparsity:g}]"
    return variant, [{"arm": arm, "variant": variant, "seed": s, "sub_test_acc": a, "sub_test_loss": l,
                      "config": {"switch_at": 0.25, "sparsity": sparsity}, "metrics": {"sub_zero_fraction": z}}
                     for s, (a, z, l) in enumerate(zip(accs, zeros, losses))]


def test_sparsity_goal_needs_the_zeros_and_a_ci_above_half_a_point_below(tmp_path):
    from lambda_gelu_lab.report.sections import _sparsity_curve
    base = [0.90, 0.91, 0.92, 0.90, 0.91]
    variants = dict([
        _sparse_runs("lambda-harden", None, base, [0.6] * 5),
        _sparse_runs("lambda-harden-sparse", 3, [a - 0.001 for a in base], [0.86, 0.87, 0.88, 0.86, 0.87]),
        _sparse_runs("lambda-harden-sparse", 10, [a - 0.010 for a in base], [0.95] * 5),  # too much accuracy lost
        _sparse_runs("lambda-harden-sparse", 1, base, [0.80] * 5),                       # too few zeros
    ])
    lines = _sparsity_curve("wine-mlp", "b", variants, list(variants), tmp_path, tmp_path)
    rows = {line.split("|")[2].strip(): line for line in lines if line.startswith("| `lambda-harden")}
    assert rows["3"].endswith("| **met** |") and rows["10"].endswith("| not met |") and rows["1"].endswith("| not met |")
    assert "| 86.80 ± 0.84 |" in rows["3"] and "-0.10 (5)" in rows["3"]
    assert (tmp_path / "sparsity_wine-mlp_b.png").exists()
    lm = dict([_sparse_runs("lambda-harden", None, base, [0.6] * 5, [2.0] * 5),  # a language model: perplexity
               _sparse_runs("lambda-harden-sparse", 3, base, [0.9] * 5, [2.03, 2.04, 2.03, 2.05, 2.04])])
    lines = _sparsity_curve("stdlib-gpt", "b", lm, list(lm), tmp_path, tmp_path)
    assert lines[[i for i, x in enumerate(lines) if x.startswith("| `lambda-harden-sparse")][0]].endswith("| not met |")


def test_drift_section_correlates_what_lambda_learned_with_the_relu_networks_quality(tmp_path):
    from lambda_gelu_lab.report.predict import drift_section

    def run(seed, lam, variant="lambda-harden", arm="lambda-harden"):
        return {"task": "t", "arm": arm, "variant": variant, "seed": seed, "base_hash": "b", "test_acc": 0.9,
                "sub_test_acc": 0.8 + 0.01 * lam, "config": {"init_lambda": 1.5},
                "metrics": {"lambda_switch": {"1": lam, "3": 2 * lam}}}

    runs = [run(s, 2.0 + s) for s in range(6)] + [run(s, 3.0, "x[switch_at=0.1]") for s in range(5)]
    runs += [run(s, 1.0 + s, "x[switch_at=0.5]") for s in range(4)]
    deploy = [("t", "b", s, "annealed→ReLU", "int8", {"int8_acc": 0.9 - 0.01 * s}) for s in range(6)]
    deploy += [("t", "b", s, "direct swap", "int8", {"int8_acc": 0.5}) for s in range(6)]  # not the annealed model
    lines = drift_section(runs, deploy, tmp_path, tmp_path)
    rows = [line for line in lines if line.startswith("| t |")]
    by = {tuple(c.strip() for c in row.split("|")[2:5]): row for row in rows}
    assert "| 6 | +1.00 |" in by[("`lambda-harden`", "Δλ", "after ReLU")]
    assert "| 6 | -1.00 |" in by[("`lambda-harden`", "Δλ", "int8 acc")] and "**negative** (strong)" in by[
        ("`lambda-harden`", "Δλ", "int8 acc")]
    assert "| 6 | -1.00 |" in by[("`lambda-harden`", "Δλ", "substitution drop")]
    assert "undefined" in by[("`x[switch_at=0.1]`", "Δλ", "after ReLU")]  # every run learned the same λ
    assert not any("x[switch_at=0.5]" in row for row in rows)  # 4 runs: too few for a row
    assert not any("variant means" in row for row in rows)  # 3 variants: too few for a row across them
    assert (tmp_path / "drift_scatter_t.png").exists()

    # Across variants each setting is one point, however many seeds it ran: 5 variants of 3 seeds give n = 5, not
    # 15 runs whose shared seeds would make the evidence look three times as strong
    runs = [run(s, 2.0 + v + 0.1 * s, f"x[switch_at=0.{v}]") for v in range(1, 6) for s in range(3)]
    lines = drift_section(runs, [], tmp_path, tmp_path)
    by = {tuple(c.strip() for c in row.split("|")[2:5]): row for row in lines if row.startswith("| t |")}
    assert "| 5 | +1.00 |" in by[("variant means", "Δλ", "after ReLU")]
    assert ("variant means", "Δλ", "int8 acc") not in by  # no variant was deployed


def test_experiments_of_one_task_are_named_by_the_settings_they_differ_in():
    """Two training lengths of one task are two experiments: each finding and heading names its own,
    by the shared settings that differ (not the arm's own, nor the seed)."""
    def runs(epochs, arm_setting):
        lam = {"a.0": 1.6, "a.1": 3.0, "a.2": 9.0}
        return [{**_run("lambda", s, 0.9, 0.5, lam_end={k: v + s for k, v in lam.items()}),
                 "config": {"epochs": epochs, "lr": 0.002, "temperature": 0.1, "multiplier": arm_setting,
                            "init_lambda": 1.5, "seed": s}} for s in range(3)]
    experiments = {("toy", "a"): runs(2, 9.0), ("toy", "b"): runs(8, 3.0), ("other", "c"): runs(2, 9.0)}
    assert experiment_labels(experiments) == {("toy", "a"): "toy (epochs=2)", ("toy", "b"): "toy (epochs=8)",
                                              ("other", "c"): "other"}
    assert sorted(f.task for f in findings(experiments)) == ["other", "toy (epochs=2)", "toy (epochs=8)"]
