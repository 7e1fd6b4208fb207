"""The device benchmark times what fine_tune.py's phases train, per precision and XLA mode, with Keras alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.errors import UserError
from benchmarks.device import (
    DeviceSetup,
    Feed,
    Variant,
    _batches,
    _classifier,
    _compiled_step,
    _pipeline_stream,
    format_table,
    run_device_benchmark,
)

TINY = DeviceSetup(image_size=32, batch_size=4, num_classes=3)


def _snapshot(model) -> dict[str, list[np.ndarray]]:
    return {layer.name: [w.numpy().copy() for w in layer.weights] for layer in model.layers if layer.weights}


def _changed(before: dict, model) -> set[str]:
    after = _snapshot(model)
    return {
        name for name, weights in before.items() if any(not np.array_equal(a, b) for a, b in zip(weights, after[name]))
    }


@pytest.mark.slow  # builds MobileNetV2 several times
@pytest.mark.parametrize("workload, trained", [("features", set()), ("phase1", {"logits"})])
def test_features_train_nothing_and_phase1_only_the_head(workload: str, trained: set[str]):
    clf = _classifier(TINY, "float32")
    images, labels = _batches(TINY, 32, steps=2)
    head, backbone = _snapshot(clf.logits_model), _snapshot(clf.backbone)
    _compiled_step(clf, Variant(workload, "float32", False), Feed(2, TINY.batch_size, images, labels))()
    assert _changed(head, clf.logits_model) == trained and _changed(backbone, clf.backbone) == set()


@pytest.mark.slow
def test_phase2_trains_the_top_blocks_but_not_batchnorm_or_the_rest():
    """fine_tune.py's default unfreeze (blocks:4): MobileNetV2's blocks 13-16 and Conv_1 above them."""
    clf = _classifier(TINY, "float32")
    images, labels = _batches(TINY, 32, steps=2)
    backbone = _snapshot(clf.backbone)
    _compiled_step(clf, Variant("phase2", "float32", False), Feed(2, TINY.batch_size, images, labels))()
    changed = _changed(backbone, clf.backbone)
    top = ("block_13", "block_14", "block_15", "block_16", "Conv_1")
    assert any(name.startswith("block_13") for name in changed)  # four blocks deep, not two
    assert all(name.startswith(top) for name in changed)
    assert not any("_BN" in name or name.endswith("bn") for name in changed)


@pytest.mark.slow
def test_every_variant_is_timed_every_round_and_reported_with_its_range():
    variants = [Variant("phase1", "float32", False), Variant("phase2", "mixed_float16", True)]
    lines: list[str] = []
    report = run_device_benchmark(TINY, variants, steps=2, rounds=2, log=lines.append)
    assert (report["backend"], report["device"], report["image_size"], report["batch_size"]) == (
        "tensorflow",
        "cpu",
        32,
        4,
    )
    assert [(r["workload"], r["precision"], r["xla"]) for r in report["results"]] == [
        ("phase1", "float32", False),
        ("phase2", "mixed_float16", True),
    ]
    for r in report["results"]:
        assert 0 < r["range"][0] <= r["images_per_s"] <= r["range"][1]
    assert len(lines) == 2 + 2  # one line per variant built, one per round


def test_the_pipeline_feed_is_the_training_input_endless_with_one_hot_labels(demo_records: Path):
    from app.data.pipeline import load_dataset_info

    info = load_dataset_info(demo_records)
    stream, classes = _pipeline_stream(str(demo_records), 32, 4)
    batches = [next(stream) for _ in range(info.num_examples("train") // 4 + 3)]  # more than one pass over the split
    assert classes == len(info.classes)
    for images, labels in batches:
        assert images.dtype == np.uint8 and images.shape == (4, 32, 32, 3)
        assert labels.shape == (4, classes) and np.array_equal(labels.sum(axis=1), np.ones(4))
    seen = np.concatenate([labels for _, labels in batches]).argmax(axis=1)
    assert set(seen) == set(range(classes))
    assert len({images.tobytes() for images, _ in batches}) == len(batches)  # augmented, not one batch repeated


def test_the_pipeline_feed_refuses_multi_label_records_saying_why(tmp_path: Path):
    from app.data.multilabel_demo import generate_multilabel_dataset
    from app.data.writer import write_tfrecords

    manifest = generate_multilabel_dataset(tmp_path / "photos", photos=12, image_size=32)
    write_tfrecords(manifest, tmp_path / "records", multi_label=True, num_shards=1, workers=1)
    with pytest.raises(UserError, match="multi-label records; the device benchmark trains single-label heads"):
        _pipeline_stream(str(tmp_path / "records"), 32, 4)


@pytest.mark.slow
def test_with_data_each_variant_is_also_timed_fed_by_the_pipeline_and_shown_as_a_share(demo_records: Path):
    setup = DeviceSetup(image_size=32, batch_size=4, data=str(demo_records))
    variants = [Variant("phase1", "float32", False, feed) for feed in ("memory", "pipeline")]
    report = run_device_benchmark(setup, variants, steps=2, rounds=2, log=lambda line: None)
    assert [r["feed"] for r in report["results"]] == ["memory", "pipeline"] and report["data"] == str(demo_records)
    memory, pipeline = (r["images_per_s"] for r in report["results"])
    assert memory > 0 and pipeline > 0
    row = format_table(report).splitlines()[-1]
    assert row.startswith("| phase1 | float32 | off | pipeline |") and row.endswith(f"| {pipeline / memory:.0%} |")
