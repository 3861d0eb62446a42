"""The paired comparison across seeds behind the report's verdicts (evaluation/statistics.py)."""

import numpy as np
import pytest

from evaluation import statistics


def test_paired_comparison_against_a_hand_computation():
    rows = {"c_mix": {"100": {"dev_accuracy_per_seed": {"0": 0.70, "1": 0.72, "2": 0.74}}},
            "a_layer0": {"100": {"dev_accuracy_per_seed": {"0": 0.60, "1": 0.63, "2": 0.66, "3": 0.9}}}}
    p = statistics.paired(rows, "c_mix", "a_layer0", "100")
    d = np.array([0.10, 0.09, 0.08])  # seed 3 has no partner and is left out
    half = 4.302652729911275 * d.std(ddof=1) / np.sqrt(3)  # t(0.975, 2 degrees of freedom)
    assert p["seeds"] == ["0", "1", "2"]
    assert p["diff_mean"] == pytest.approx(0.09) and p["diff_std"] == pytest.approx(0.01)
    assert p["ci95"] == pytest.approx([0.09 - half, 0.09 + half]) and p["verdict"] == "c_mix better"
    rows["a_layer0"]["100"]["dev_accuracy_per_seed"] = {"0": 0.80, "1": 0.62, "2": 0.70}
    assert statistics.paired(rows, "c_mix", "a_layer0", "100")["verdict"] == "no difference"  # diffs -0.10, +0.10, +0.04
