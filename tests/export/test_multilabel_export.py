"""A multi-label model, trained, exported, served and evaluated: sigmoid probabilities, the
labels at or above per-label thresholds chosen on validation, per-label evaluation."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from aiohttp.test_utils import TestClient, TestServer
from conftest import TINY_BACKBONE

from app.data.multilabel_demo import generate_multilabel_dataset
from app.data.writer import write_tfrecords
from app.errors import UserError
from app.export.layout import read_metadata

# The module's run trains both phases and exports; one test trains through the CLIs: the slow tier,
# so the fast tier stays under 3 minutes (its tests of multi-label data and metrics: tests/data,
# tests/evaluation).
pytestmark = [pytest.mark.slow, pytest.mark.start_first]  # start_first: over a minute in all


@pytest.fixture(scope="module")
def multilabel_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A tiny run on generated scenes (several shapes each): the random-init tiny backbone at 32 px."""
    from app.config import TrainConfig
    from app.training.train import train

    tmp = tmp_path_factory.mktemp("multilabel")
    manifest = generate_multilabel_dataset(tmp / "photos", photos=40, image_size=48)
    write_tfrecords(manifest, tmp / "records", multi_label=True, val_fraction=0.25, test_fraction=0.25, num_shards=1)
    cfg = TrainConfig(
        data=str(tmp / "records"),
        out=str(tmp / "run"),
        backbone=TINY_BACKBONE,
        weights="none",
        image_size=32,
        batch_size=4,
        epochs_head=1,
        epochs_finetune=1,
        max_steps_per_epoch=2,
        class_weights=True,
    )
    return tmp, train(cfg)


def test_the_run_chooses_a_threshold_per_label_and_the_export_applies_them(multilabel_run):
    tmp, metrics = multilabel_run
    meta = read_metadata(Path(metrics["export"]))
    assert meta["task"] == "multi_label" and meta["thresholds"] == metrics["thresholds"]["thresholds"]
    assert len(meta["thresholds"]) == 4 and "calibration" not in metrics  # temperature scaling is a softmax's
    assert meta["litert"]["float32"]["passed"] and meta["litert"]["float32"]["max_abs_diff"] <= 1e-4
    for runtime in ("openvino", "onnx"):  # the other files beside the SavedModel, checked the same way
        assert meta[runtime]["float32"]["passed"] and meta[runtime]["float32"]["max_abs_diff"] <= 1e-4
    assert metrics["test"]["count"] == 10
    loaded = tf.saved_model.load(metrics["export"])
    images = [p.read_bytes() for p in sorted((tmp / "photos" / "images").glob("*.jpg"))[:6]]
    out = {k: v.numpy() for k, v in loaded.signatures["serving_default"](image_bytes=tf.constant(images)).items()}
    classes, thresholds = meta["classes"], np.array(meta["thresholds"])
    for probabilities, above in zip(out["probabilities"], out["labels_above_threshold"]):
        expected = [classes[i] for i in np.argsort(-probabilities, kind="stable") if probabilities[i] >= thresholds[i]]
        assert [a.decode() for a in above] == expected + [""] * (4 - len(expected))  # by score, "" after
    assert not np.allclose(out["probabilities"].sum(axis=1), 1.0)  # independent sigmoids, not a softmax
    card = (Path(metrics["export"]) / "MODEL_CARD.md").read_text().splitlines()
    said = ", ".join(f"{name} {value:.3f}" for name, value in zip(classes, thresholds))
    assert f"- decision thresholds (each label's best F1 on val): {said}" in card
    assert f"- test exact match (every label right): {metrics['test']['accuracy']:.4f} on 10 photos" in card


def test_the_server_answers_with_the_labels_above_threshold_through_litert_as_the_savedmodel_does(multilabel_run):
    from app.serving.batcher import Batcher
    from app.serving.rest import make_app
    from app.serving.store import ModelStore

    tmp, metrics = multilabel_run
    image = sorted((tmp / "photos" / "images").glob("*.jpg"))[0].read_bytes()
    expected = tf.saved_model.load(metrics["export"]).signatures["serving_default"](image_bytes=tf.constant([image]))
    expected_labels = [c.decode() for c in expected["labels_above_threshold"].numpy()[0] if c]
    store = ModelStore(Path(metrics["export"]).parent, runtime="litert")  # the checked LiteRT file

    async def main() -> dict:
        async with TestClient(TestServer(make_app(store, Batcher(max_batch=8, max_wait_ms=0, max_queue=64)))) as client:
            response = await client.post(
                f"/v1/models/{store.name}:classify", data=image, headers={"Content-Type": "image/jpeg"}
            )
            assert response.status == 200
            return await response.json()

    answer = asyncio.run(main())
    assert answer["labels_above_threshold"] == expected_labels and store.current.runtime.name == "litert"


def test_evaluation_reports_per_label_figures_at_the_export_thresholds(multilabel_run, demo_records: Path):
    from app.evaluation.evaluate import evaluate
    from app.evaluation.multilabel import compute_multilabel_metrics

    tmp, metrics = multilabel_run
    result = evaluate(metrics["export"], tmp / "records", split="test", report_dir=tmp / "report", runtime="tf")
    m = result.metrics
    assert (
        m["task"] == "multi_label"
        and m["count"] == 10
        and [r["label"] for r in m["labels"]] == result.predictions.classes
    )
    assert result.predictions.labels.shape == (10, 4)
    recomputed = compute_multilabel_metrics(
        result.predictions.labels,
        result.predictions.probabilities,
        read_metadata(Path(metrics["export"]))["thresholds"],
        result.predictions.classes,
    )
    assert m["exact_match"] == recomputed["exact_match"] and m["labels"] == recomputed["labels"]
    assert (tmp / "report" / "label_confusion.png").stat().st_size > 0 and "Per label" in result.html.read_text()
    with pytest.raises(UserError, match="single-label data for a multi-label model"):
        evaluate(metrics["export"], demo_records, split="test", report_dir=tmp / "report2")


def test_the_commands_train_a_multi_label_model_that_finds_the_shapes_in_a_scene(
    tmp_path: Path, pretrained_weights: Path
):
    import json
    import subprocess
    import sys

    from app.serving.batcher import Batcher
    from app.serving.rest import make_app
    from app.serving.store import ModelStore

    root = Path(__file__).resolve().parents[2]
    manifest = generate_multilabel_dataset(tmp_path / "photos", photos=400, image_size=96)
    made = subprocess.run(
        [
            sys.executable,
            str(root / "scripts/make_tfrecords.py"),
            str(manifest),
            str(tmp_path / "records"),
            "--multi-label",
            "--val-fraction",
            "0.25",
            "--test-fraction",
            "0.25",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0 and "label (photos with it)" in made.stdout, made.stderr[-2000:]
    trained = subprocess.run(
        [
            sys.executable,
            str(root / "scripts/fine_tune.py"),
            "--data",
            str(tmp_path / "records"),
            "--out",
            str(tmp_path / "scenes"),
            "--weights",
            str(pretrained_weights),
            "--image-size",
            "96",
            "--epochs-finetune",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert trained.returncode == 0, trained.stderr[-2000:]
    evaluated = subprocess.run(
        [
            sys.executable,
            str(root / "scripts/evaluate.py"),
            str(tmp_path / "scenes"),
            "--data",
            str(tmp_path / "records"),
            "--split",
            "test",
            "--report",
            str(tmp_path / "report"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    report = json.loads((tmp_path / "report" / "metrics.json").read_text())
    assert report["macro_map"] >= 0.7 and report["exact_match"] > 0.3  # chance: mAP ~0.35, exact match ~0.1
    scene = next(p for p in sorted((tmp_path / "photos" / "images").glob("*.jpg")))
    store = ModelStore(tmp_path / "scenes" / "export" / "scenes", runtime="tf")

    async def main() -> dict:
        async with TestClient(TestServer(make_app(store, Batcher(max_batch=8, max_wait_ms=0, max_queue=64)))) as client:
            response = await client.post(
                "/v1/models/scenes:classify", data=scene.read_bytes(), headers={"Content-Type": "image/jpeg"}
            )
            return await response.json()

    answer = asyncio.run(main())
    direct = store.current.runtime.run("serving_default", {"image_bytes": np.array([scene.read_bytes()], dtype=object)})
    assert answer["labels_above_threshold"] == [c.decode() for c in direct["labels_above_threshold"][0] if c]


def test_batch_prediction_answers_with_the_labels_above_their_thresholds(multilabel_run):
    import csv

    from app.inference.batch_predict import predict_files

    tmp, metrics = multilabel_run
    photos = sorted((tmp / "photos" / "images").glob("*.jpg"))[:3]
    folder = tmp / "to_predict"
    folder.mkdir(exist_ok=True)
    for photo in photos:
        (folder / photo.name).write_bytes(photo.read_bytes())
    summary = predict_files(metrics["export"], str(folder), tmp / "predictions.csv", runtime="tf")
    rows = list(csv.DictReader((tmp / "predictions.csv").open()))
    served = (
        tf.saved_model.load(metrics["export"])
        .signatures["serving_default"](image_bytes=tf.constant([p.read_bytes() for p in photos]))[
            "labels_above_threshold"
        ]
        .numpy()
    )
    expected = ["|".join(c.decode() for c in row if c) for row in served]
    assert [r["labels_above_threshold"] for r in rows] == expected
    assert [r["answer"] for r in rows] == expected  # its labels, not the top one alone ("": none of them)
    assert summary.no_label == expected.count("") and summary.predicted == 3  # the count the command prints
