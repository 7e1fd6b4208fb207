"""benchmarks/ood.py: each method's figures on held-out photos, and their mean ± spread over runs."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.ood import FIGURES, format_summary, method_figures, summarise


def test_a_method_s_figures_come_from_its_scores_and_the_val_threshold():
    score = {
        "val": np.arange(20, dtype=float),  # 95% accepted at 18
        "test": np.array([0.0, 5.0, 18.0, 19.0]),
        "near": np.array([10.0, 30.0]),
        "far": np.array([40.0, 50.0, 60.0]),
    }
    test = {
        "probabilities": np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.6, 0.4]]),
        "labels": np.array([0, 1, 1, 0]),
    }
    figures = method_figures(score, test)
    assert figures["test_accepted"] == 0.75 and figures["far_unknown"] == 1.0 and figures["near_unknown"] == 0.5
    assert figures["auroc_far"] == 1.0 and figures["auroc_near"] == 0.75  # 10 beats 0 and 5, 30 beats all four
    assert figures["accuracy_accepted"] == pytest.approx(2 / 3)  # the three accepted: right, right, wrong
    assert figures["accuracy_all"] == 0.75


def test_runs_are_summarised_as_mean_and_spread_per_method():
    runs = [{"msp": {k: 0.8 for k in FIGURES}}, {"msp": {k: 0.9 for k in FIGURES}}]
    summary = summarise(runs)
    assert summary["msp"]["auroc_near"] == [0.85, 0.1]
    assert "0.850 ± 0.050" in format_summary(summary, 2).splitlines()[-1]
