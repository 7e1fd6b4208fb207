"""A model with side features, trained, exported and served: the signatures take one input per
manifest column, encode them in the graph as the dataset was encoded, and the server accepts
them as `instances` objects and as :classify query parameters."""

from __future__ import annotations

import asyncio
import base64
import csv
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from aiohttp.test_utils import TestClient, TestServer
from conftest import TINY_BACKBONE

from app.data.side_demo import FEATURE_COLUMNS, generate_side_feature_dataset
from app.data.writer import write_tfrecords
from app.errors import UserError
from app.export.layout import read_metadata
from app.export.run_export import export_run
from app.inference.batch_predict import predict_files
from app.inference.host_runtimes import host_decoder

# Its run with side features trains both phases and exports: the slow tier, so the fast tier stays
# under 3 minutes (the fast tier's tests of side features: tests/data, and phase 2's validation in
# tests/training/frozen).
pytestmark = [pytest.mark.slow, pytest.mark.start_first]  # start_first: over a minute in all


@pytest.fixture(scope="module")
def side_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A tiny run on the generated side-features data: the random-init tiny backbone at 32 px, phase 1
    on cached features, phase 2 on images, one short epoch each."""
    from app.config import TrainConfig
    from app.training.train import train

    tmp = tmp_path_factory.mktemp("side")
    manifest = generate_side_feature_dataset(tmp / "photos", per_class=6, image_size=48)
    write_tfrecords(
        manifest, tmp / "records", feature_columns=FEATURE_COLUMNS, val_fraction=0.25, test_fraction=0.25, num_shards=1
    )
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
        feature_views="2",
        phase2_mode="images",
        side_path="on",  # these tests follow the side features through the model: kept whatever the probe says
    )
    return tmp, train(cfg)


def jpeg(value: int = 90) -> bytes:
    return tf.io.encode_jpeg(tf.fill([40, 40, 3], tf.constant(value, tf.uint8))).numpy()


def test_the_run_trains_both_phases_and_records_its_columns(side_run):
    tmp, metrics = side_run
    assert (
        metrics["phase1_mode"] == "features" and metrics["phase1"]["epochs"] == 1 and metrics["phase2"]["epochs"] == 1
    )
    assert metrics["test"]["count"] == 8  # 2 of each class's 6 photos (test_fraction 0.25, rounded)
    meta = read_metadata(Path(metrics["export"]))
    assert [c["name"] for c in meta["side_features"]] == ["reading", "site"]
    assert meta["litert"]["float32"]["passed"] and meta["litert"]["float32"]["max_abs_diff"] <= 1e-4
    for runtime in ("openvino", "onnx"):  # the other files beside the SavedModel, checked the same way
        assert meta[runtime]["float32"]["passed"] and meta[runtime]["float32"]["max_abs_diff"] <= 1e-4


def test_signatures_take_each_column_by_name_and_encode_it_as_the_dataset_did(side_run):
    _, metrics = side_run
    loaded = tf.saved_model.load(metrics["export"])
    default, images_fn = loaded.signatures["serving_default"], loaded.signatures["predict_images"]
    assert sorted(default.structured_input_signature[1]) == ["image_bytes", "reading", "site"]
    assert sorted(images_fn.structured_input_signature[1]) == ["images", "side"]
    meta = read_metadata(Path(metrics["export"]))
    mean, vocabulary = meta["side_features"][0]["mean"], meta["side_features"][1]["vocabulary"]

    def by_bytes(reading: float, site: str) -> np.ndarray:
        return default(image_bytes=tf.constant([jpeg()]), reading=tf.constant([reading]), site=tf.constant([site]))[
            "probabilities"
        ].numpy()

    pixels = host_decoder(Path(metrics["export"]))(np.array([jpeg()], dtype=object)).astype(np.float32)
    site_index = vocabulary.index("north") + 1
    by_vector = images_fn(images=tf.constant(pixels), side=tf.constant([[0.5, site_index]]))["probabilities"].numpy()
    np.testing.assert_allclose(by_bytes(0.5, "north"), by_vector, atol=1e-5)
    np.testing.assert_allclose(by_bytes(float("nan"), "north"), by_bytes(mean, "north"), atol=1e-6)  # missing = mean
    np.testing.assert_allclose(by_bytes(0.5, "mars"), by_bytes(0.5, ""), atol=1e-6)  # unseen = missing
    assert not np.allclose(by_bytes(-3.0, "north"), by_bytes(3.0, "north"), atol=1e-6)  # the side branch is used
    keyed = loaded.signatures["serving_keyed"](
        image_bytes=tf.constant([jpeg()]),
        reading=tf.constant([0.5]),
        site=tf.constant(["north"]),
        key=tf.constant(["row-7"]),
    )
    assert keyed["key"].numpy().tolist() == [b"row-7"]


@pytest.mark.slow  # a second export with its LiteRT check: the fast tier stays under 3 minutes
def test_a_re_export_from_the_run_dir_rebuilds_the_side_branch(side_run):
    tmp, metrics = side_run
    again = export_run(tmp / "run")
    inputs = {
        "image_bytes": tf.constant([jpeg(), jpeg(30)]),
        "reading": tf.constant([1.0, -1.0]),
        "site": tf.constant(["north", "east"]),
    }
    first = tf.saved_model.load(metrics["export"]).signatures["serving_default"](**inputs)["probabilities"]
    second = tf.saved_model.load(again["saved_model"]).signatures["serving_default"](**inputs)["probabilities"]
    np.testing.assert_allclose(first.numpy(), second.numpy(), atol=1e-6)


@pytest.mark.parametrize("runtime", ["tf", "litert", "onnx"])
def test_the_server_takes_side_features_as_instance_fields_and_query_parameters(side_run, runtime: str):
    from app.serving.batcher import Batcher
    from app.serving.rest import make_app
    from app.serving.store import ModelStore

    _, metrics = side_run
    store = ModelStore(Path(metrics["export"]).parent, runtime=runtime)
    expected = tf.saved_model.load(metrics["export"]).signatures["serving_default"](
        image_bytes=tf.constant([jpeg()]), reading=tf.constant([0.5]), site=tf.constant(["north"])
    )["probabilities"]
    name = store.name

    async def scenario(client: TestClient) -> None:
        instance = {"image_bytes": {"b64": base64.b64encode(jpeg()).decode()}, "reading": 0.5, "site": "north"}
        response = await client.post(
            f"/v1/models/{name}:predict", json={"instances": [instance, {**instance, "reading": None}]}
        )
        body = await response.json()
        assert response.status == 200, body
        np.testing.assert_allclose(body["predictions"][0]["probabilities"], expected.numpy()[0], atol=1e-4)
        missing = await client.post(
            f"/v1/models/{name}:predict", json={"instances": [{"image_bytes": instance["image_bytes"]}]}
        )
        assert missing.status == 400 and "reading" in (await missing.json())["error"]
        classify = await client.post(
            f"/v1/models/{name}:classify?reading=0.5&site=north", data=jpeg(), headers={"Content-Type": "image/jpeg"}
        )
        top = (await classify.json())["predictions"][0]
        assert classify.status == 200 and top["score"] == pytest.approx(float(expected.numpy().max()), abs=1e-4)
        bad = await client.post(
            f"/v1/models/{name}:classify?reading=tall", data=jpeg(), headers={"Content-Type": "image/jpeg"}
        )
        assert (
            bad.status == 400
            and (await bad.json())["error"] == "query parameter reading: expected a number, got 'tall'"
        )

    async def main() -> None:
        async with TestClient(TestServer(make_app(store, Batcher(max_batch=8, max_wait_ms=0, max_queue=64)))) as client:
            await scenario(client)

    asyncio.run(main())


def test_auto_times_every_runtime_s_model_pass_with_the_side_vector(side_run, monkeypatch: pytest.MonkeyPatch):
    """auto times predict_images on decoded pixels: a model with side features gets a side vector
    of its width, in every runtime."""
    from app.inference import runtime as runtime_module

    tmp, metrics = side_run
    monkeypatch.setenv("PHOTOCLF_CACHE_DIR", str(tmp / "cache"))
    width = len(read_metadata(Path(metrics["export"]))["side_features"])
    for name in ("tf", "litert", "onnx"):
        loaded = runtime_module.load_runtime(Path(metrics["export"]), name)
        inputs = runtime_module._timing_inputs(loaded, 3)
        assert inputs["images"].shape == (3, 32, 32, 3) and inputs["side"].shape == (3, width)
        assert 0 < runtime_module._ms_per_photo(loaded, inputs) < 10_000
    assert runtime_module.load_runtime(Path(metrics["export"]), "auto", batch=3).name in (
        "tf",
        "litert",
        "onnx",
        "openvino",
    )


def test_evaluation_feeds_each_record_s_side_features_and_matches_training(side_run):
    from app.evaluation.evaluate import evaluate
    from app.inference.batch_predict import predict_files

    tmp, metrics = side_run
    result = evaluate(metrics["export"], tmp / "records", split="test", report_dir=tmp / "report", runtime="tf")
    assert result.metrics["accuracy"] == pytest.approx(
        metrics["test"]["accuracy"]
    )  # bytes + raw values = training's view
    assert len(result.predictions.labels) == metrics["test"]["count"]
    folder = tmp / "folder" / "circle_low"
    folder.mkdir(parents=True)
    (folder / "a.jpg").write_bytes(jpeg())
    with pytest.raises(UserError, match="takes side features"):
        evaluate(metrics["export"], folder.parent, report_dir=tmp / "report2")  # class folders carry no side features
    with pytest.raises(UserError, match=r"also takes side features \(reading, site\)"):
        predict_files(metrics["export"], str(folder), tmp / "predictions.csv")


@pytest.mark.slow  # real transfer learning through the three CLIs, then served over HTTP
def test_the_commands_train_a_fused_model_that_serves_what_neither_input_alone_knows(
    tmp_path: Path, pretrained_weights: Path
):
    """The label is a shape and a level only the side features carry, so the photo alone or the
    side features alone can be right at most about half the time on the held-out test split."""
    import subprocess
    import sys

    from app.evaluation.predictions import tfrecord_examples
    from app.serving.batcher import Batcher
    from app.serving.rest import make_app
    from app.serving.store import ModelStore

    root = Path(__file__).resolve().parents[2]
    manifest = generate_side_feature_dataset(tmp_path / "photos", per_class=100, image_size=96)
    made = subprocess.run(
        [
            sys.executable,
            str(root / "scripts/make_tfrecords.py"),
            str(manifest),
            str(tmp_path / "records"),
            "--feature-columns",
            FEATURE_COLUMNS,
            "--val-fraction",
            "0.2",
            "--test-fraction",
            "0.2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr[-2000:]
    assert "side feature site: categorical, 3 values in train" in made.stdout
    trained = subprocess.run(
        [
            sys.executable,
            str(root / "scripts/fine_tune.py"),
            "--data",
            str(tmp_path / "records"),
            "--out",
            str(tmp_path / "pets"),
            "--weights",
            str(pretrained_weights),
            "--image-size",
            "96",
            "--epochs-head",
            "15",
            "--epochs-finetune",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert trained.returncode == 0, trained.stderr[-2000:]
    store = ModelStore(tmp_path / "pets" / "export" / "pets", runtime="tf")
    classes, total, examples = tfrecord_examples(tmp_path / "records", "test")
    examples = list(examples)

    async def scenario(client: TestClient) -> float:
        instances = [{"image_bytes": {"b64": base64.b64encode(data).decode()}, **side} for data, _, _, side in examples]
        for instance in instances:  # JSON has no NaN: a missing number goes as null
            instance["reading"] = None if np.isnan(instance["reading"]) else instance["reading"]
        predicted = []
        for start in range(0, len(instances), 40):  # the server takes at most 64 instances a request
            response = await client.post("/v1/models/pets:predict", json={"instances": instances[start : start + 40]})
            assert response.status == 200
            predicted += [p["classes"][0] for p in (await response.json())["predictions"]]
        return float(np.mean([p == classes[label] for p, (_, label, _, _) in zip(predicted, examples)]))

    async def main() -> float:
        async with TestClient(
            TestServer(make_app(store, Batcher(max_batch=8, max_wait_ms=0, max_queue=256)))
        ) as client:
            return await scenario(client)

    assert total == len(examples) == 80
    assert asyncio.run(main()) >= 0.75


@pytest.mark.slow  # a second run: the fast tier stays under 3 minutes
def test_a_resume_refuses_data_whose_side_features_changed(tmp_path: Path):
    """The side branch is built from the columns: an interrupted run (here: no metrics.json
    yet) resumed on data with other columns must stop, not load weights of another shape."""
    from app.config import TrainConfig
    from app.training.train import train

    manifest = generate_side_feature_dataset(tmp_path / "photos", per_class=4, image_size=40)
    records = tmp_path / "records"
    write_tfrecords(
        manifest, records, feature_columns=FEATURE_COLUMNS, val_fraction=0.25, test_fraction=0.25, num_shards=1
    )
    cfg = TrainConfig(
        data=str(records),
        out=str(tmp_path / "run"),
        backbone=TINY_BACKBONE,
        weights="none",
        image_size=32,
        batch_size=4,
        epochs_head=1,
        epochs_finetune=0,
        max_steps_per_epoch=1,
        calibrate=False,
    )
    train(cfg)
    (tmp_path / "run" / "metrics.json").unlink()  # as if it had been interrupted before the end
    write_tfrecords(
        manifest,
        records,
        feature_columns="reading",
        val_fraction=0.25,
        test_fraction=0.25,
        num_shards=1,
        overwrite=True,
    )
    with pytest.raises(UserError, match="checkpoint was trained with side_features="):
        train(cfg)


def _noise_columns(manifest: Path) -> Path:
    """The same photos labelled by their shape alone, their columns drawn apart from it."""
    rng = np.random.default_rng(0)
    rows = list(csv.reader(manifest.open()))
    rows[1:] = [[path, label.split("_")[0], f"{rng.normal():.4f}", str(rng.choice(["north", "east"]))]
                for path, label, _, _ in rows[1:]]  # fmt: skip
    with manifest.open("w", newline="") as fh:
        csv.writer(fh).writerows(rows)
    return manifest


@pytest.mark.slow  # a run and its export
def test_side_features_that_carry_nothing_are_left_out_and_the_export_ignores_them(tmp_path: Path):
    """Columns drawn apart from the class do not lower the probe's val log loss: the gate closes
    before phase 1, and the export (every runtime file, checked) still takes them and ignores them."""
    from app.config import TrainConfig
    from app.evaluation.evaluate import evaluate
    from app.training.train import train

    manifest = _noise_columns(generate_side_feature_dataset(tmp_path / "photos", per_class=12, image_size=48))
    write_tfrecords(manifest, tmp_path / "records", feature_columns=FEATURE_COLUMNS, val_fraction=0.25,
                    test_fraction=0.0, num_shards=1)  # fmt: skip
    cfg = TrainConfig(data=str(tmp_path / "records"), out=str(tmp_path / "run"), backbone=TINY_BACKBONE,
                      weights="none", image_size=32, batch_size=4, epochs_head=2, epochs_finetune=1,
                      max_steps_per_epoch=2, feature_views="2")  # fmt: skip
    metrics = train(cfg)
    path = metrics["side_path"]
    assert not path["open"] and path["with_side"]["val_log_loss"] > 0.98 * path["image_only"]["val_log_loss"]
    assert metrics["side_features_warning"].startswith("the side features were left out of the model")
    meta = read_metadata(Path(metrics["export"]))
    assert meta["training_metrics"]["side_features_warning"] == metrics["side_features_warning"]
    for runtime in ("litert", "openvino", "onnx"):  # the closed gate converts like the rest
        assert meta[runtime]["float32"]["passed"]
    serve = tf.saved_model.load(metrics["export"]).signatures["serving_default"]

    def answer(reading: float, site: str) -> np.ndarray:
        inputs = {"image_bytes": tf.constant([jpeg()]), "reading": tf.constant([reading]), "site": tf.constant([site])}
        return serve(**inputs)["probabilities"].numpy()

    np.testing.assert_array_equal(answer(-3.0, "north"), answer(3.0, "east"))
    assert meta["side_features_used"] is False  # so predict and evaluate take photos alone, the columns missing
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "a.jpg").write_bytes(jpeg())
    summary = predict_files(metrics["export"], str(tmp_path / "new"), tmp_path / "answers.csv")  # runtime auto
    row = next(csv.DictReader((tmp_path / "answers.csv").open()))
    assert summary.predicted == 1 and not row["error"]
    top = int(answer(0.0, "north")[0].argmax())
    assert row["label_1"] == meta["classes"][top] and float(row["score_1"]) == pytest.approx(
        float(answer(0.0, "north")[0, top]), abs=1e-5
    )
    for label in meta["classes"]:  # and evaluate takes a folder of class folders, photos alone
        (tmp_path / "folders" / label).mkdir(parents=True)
        (tmp_path / "folders" / label / "a.jpg").write_bytes(jpeg())
    result = evaluate(metrics["export"], tmp_path / "folders", report_dir=tmp_path / "report", runtime="tf")
    assert result.metrics["num_examples"] == len(meta["classes"])
    assert result.metrics["accuracy"] == pytest.approx(1 / len(meta["classes"]))  # one photo, answered `top` in each
