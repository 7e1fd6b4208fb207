"""The side-features and multi-label benchmarks: their summaries' arithmetic, and one tiny real run each."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.multilabel import format_summary as multilabel_summary
from benchmarks.side_features import format_summary as side_format
from benchmarks.side_features import summarise

pytestmark = pytest.mark.start_first  # its tests take over a minute in all


def test_the_side_benchmark_summarises_each_model_over_seeds():
    rows = [
        {"model": m, "seed": s, "val_accuracy": v, "test_accuracy": v + 0.1}
        for m, v0 in (("image only", 0.4), ("side features only", 0.5), ("fused", 0.8))
        for s, v in ((0, v0), (1, v0 + 0.1))
    ]
    summary = summarise(rows)
    assert [s["model"] for s in summary] == ["image only", "side features only", "fused"]
    assert summary[2]["val_accuracy"] == "0.850 ± 0.071" and summary[2]["test_accuracy"] == "0.950 ± 0.071"
    assert "0.950 ± 0.071" in side_format(summary)


def test_the_multilabel_benchmark_table_averages_labels_over_seeds_and_skips_undefined_values():
    label = {
        "label": "star",
        "support": 4,
        "threshold": 0.3,
        "precision": 0.5,
        "recall": 1.0,
        "f1": 0.6,
        "average_precision": 0.7,
    }
    rows = [
        {
            "seed": s,
            "count": 20,
            "macro_map": m,
            "micro_map": m,
            "macro_f1": m,
            "exact_match": m,
            "labels": [{**label, "precision": p}],
        }
        for s, m, p in ((0, 0.8, 0.5), (1, 0.9, None))
    ]
    text = multilabel_summary(rows)
    assert "0.850 ± 0.071" in text and "star" in text and "0.500" in text  # precision: the one defined value


@pytest.mark.slow
def test_both_benchmarks_run_end_to_end_on_tiny_settings(monkeypatch):
    from benchmarks.multilabel import run_multilabel_benchmark
    from benchmarks.side_features import run_side_benchmark

    monkeypatch.delenv("PHOTOCLF_WEIGHTS", raising=False)
    side = run_side_benchmark(
        weights="none",
        seeds=(0,),
        per_class=10,
        log=lambda m: None,
        image_size=32,
        batch_size=8,
        epochs_head=1,
        epochs_finetune=0,
    )
    assert [r["model"] for r in side] == ["ceiling (image only, shape)", "image only", "side features only", "fused"]
    assert all(0 <= r["test_accuracy"] <= 1 for r in side)
    multi = run_multilabel_benchmark(
        weights="none",
        seeds=(0,),
        photos=30,
        photo_size=48,
        log=lambda m: None,
        image_size=32,
        batch_size=8,
        epochs_head=1,
        epochs_finetune=0,
    )
    assert multi[0]["count"] == 6 and len(multi[0]["labels"]) == 4  # 20% of 30 photos for test


def test_the_ceiling_counts_a_prediction_with_the_right_shape_whatever_its_level():
    from benchmarks.side_features import shape_accuracy

    classes = ["circle_high", "circle_low", "square_high", "square_low"]
    confusion = np.array([[5, 5, 0, 0], [2, 7, 1, 0], [0, 0, 9, 1], [0, 0, 0, 10]])  # rows: true class
    assert shape_accuracy(confusion, classes) == pytest.approx(39 / 40)  # one circle called a square
