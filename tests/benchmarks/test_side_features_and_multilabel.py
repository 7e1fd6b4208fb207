"""The side-features and multi-label benchmarks: their summaries' arithmetic, and one tiny real run each."""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

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
def test_both_benchmarks_run_end_to_end_on_tiny_settings(monkeypatch, tmp_path: Path):
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
    photos = _photo_set(tmp_path / "photos", {"train": 6, "val": 3, "test": 3})
    real = run_side_benchmark(weights="none", seeds=(0,), per_class=4, photos=photos, log=lambda m: None,
                              image_size=32, batch_size=8, epochs_head=1, epochs_finetune=0)  # fmt: skip
    assert [r["model"] for r in real] == ["image only", "side features only", "fused"]  # no shapes: no ceiling
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


def _photo_set(root: Path, per_split: dict[str, int]) -> Path:
    """train/, val/, test/ of two class folders of small JPEGs, each class its own colour."""
    for split, count in per_split.items():
        for name, colour in (("red", (200, 30, 30)), ("blue", (30, 30, 200))):
            (root / split / name).mkdir(parents=True)
            for i in range(count):
                Image.new("RGB", (40, 40), colour).save(root / split / name / f"{i:02d}.jpg")
    return root


def test_the_real_photo_task_keeps_each_split_and_gives_every_photo_columns_drawn_apart_from_its_class(tmp_path):
    from benchmarks.side_features import noise_manifest

    photos = _photo_set(tmp_path / "photos", {"train": 5, "val": 2, "test": 3})
    rows = list(csv.reader(noise_manifest(photos, tmp_path / "m.csv", train_per_class=3).open()))
    assert rows[0] == ["path", "label", "split", "n1", "n2", "site"]
    counts = Counter((r[2], r[1]) for r in rows[1:])
    assert counts == {(s, c): n for s, n in (("train", 3), ("val", 2), ("test", 3)) for c in ("red", "blue")}
    assert [Path(r[0]).name for r in rows[1:] if r[1:3] == ["red", "train"]] == ["00.jpg", "01.jpg", "02.jpg"]
    n1 = [float(r[3]) for r in rows[1:]]
    assert len(set(n1)) == len(n1)  # drawn per photo, not per class
    again = list(csv.reader(noise_manifest(photos, tmp_path / "again.csv", train_per_class=3).open()))
    assert again == rows  # the same columns for every run and variant compared
