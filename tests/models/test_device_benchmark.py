"""The device benchmark times what fine_tune.py's phases train, per precision and XLA mode, with Keras alone."""

from __future__ import annotations

import numpy as np
import pytest

from app.models.device_benchmark import DeviceSetup, Variant, _batches, _classifier, _compiled_step, run_device_benchmark

TINY = DeviceSetup(image_size=32, batch_size=4, num_classes=3)


def _snapshot(model) -> dict[str, list[np.ndarray]]:
    return {layer.name: [w.numpy().copy() for w in layer.weights] for layer in model.layers if layer.weights}


def _changed(before: dict, model) -> set[str]:
    after = _snapshot(model)
    return {name for name, weights in before.items() if any(not np.array_equal(a, b) for a, b in zip(weights, after[name]))}


@pytest.mark.slow  # builds MobileNetV2 several times
@pytest.mark.parametrize("workload, trained", [("features", set()), ("phase1", {"logits"})])
def test_features_train_nothing_and_phase1_only_the_head(workload: str, trained: set[str]):
    clf = _classifier(TINY, "float32")
    images, labels = _batches(TINY, 32, steps=2)
    head, backbone = _snapshot(clf.logits_model), _snapshot(clf.backbone)
    _compiled_step(clf, Variant(workload, "float32", False), images, labels, TINY.batch_size)()
    assert _changed(head, clf.logits_model) == trained and _changed(backbone, clf.backbone) == set()


@pytest.mark.slow
def test_phase2_trains_the_top_blocks_but_not_batchnorm_or_the_rest():
    clf = _classifier(TINY, "float32")
    images, labels = _batches(TINY, 32, steps=2)
    backbone = _snapshot(clf.backbone)
    _compiled_step(clf, Variant("phase2", "float32", False), images, labels, TINY.batch_size)()
    changed = _changed(backbone, clf.backbone)
    assert changed and all(name.startswith(("block_15", "block_16", "Conv_1")) for name in changed)
    assert not any("_BN" in name or name.endswith("bn") for name in changed)


@pytest.mark.slow
def test_every_variant_is_timed_every_round_and_reported_with_its_range():
    variants = [Variant("phase1", "float32", False), Variant("phase2", "mixed_float16", True)]
    lines: list[str] = []
    report = run_device_benchmark(TINY, variants, steps=2, rounds=2, log=lines.append)
    assert (report["backend"], report["device"], report["image_size"], report["batch_size"]) == ("tensorflow", "cpu", 32, 4)
    assert [(r["workload"], r["precision"], r["xla"]) for r in report["results"]] == [
        ("phase1", "float32", False), ("phase2", "mixed_float16", True)]
    for r in report["results"]:
        assert 0 < r["range"][0] <= r["images_per_s"] <= r["range"][1]
    assert len(lines) == 2 + 2  # one line per variant built, one per round
