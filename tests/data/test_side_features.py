"""Side features from a CSV manifest: the stored schema, dataset.json's statistics, missing
values, the dict pipelines, and the one-line errors that come before anything is written."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from app.data import schema
from app.data.pipeline import make_eval_dataset, make_train_dataset
from app.data.side_features import parse_columns
from app.data.writer import write_tfrecords
from app.errors import UserError

# path, label, split, age, site: train ages 10, 20, 30, (missing) → mean 20, std sqrt(200/3)
ROWS = [
    ("a0.jpg", "cat", "train", "10", "arm"),
    ("a1.jpg", "cat", "train", "20", "leg"),
    ("b0.jpg", "dog", "train", "30", "arm"),
    ("b1.jpg", "dog", "train", "NA", ""),
    ("a2.jpg", "cat", "val", "", "head"),
    ("b2.jpg", "dog", "val", "25", "leg"),
]


def manifest(folder: Path, rows=ROWS, header=("path", "label", "split", "age", "site")) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for row in rows:
        Image.new("RGB", (24, 24), (200, 30, 30) if row[1] == "cat" else (30, 30, 200)).save(folder / row[0])
    with (folder / "manifest.csv").open("w", newline="") as f:
        csv.writer(f).writerows([header, *rows])
    return folder / "manifest.csv"


def records_by_file(out: Path, split: str, side_width: int) -> dict[str, dict]:
    info = json.loads((out / schema.METADATA_FILE).read_text())
    found = {}
    for shard in info["shards"][split]:
        for raw in tf.data.TFRecordDataset(str(out / shard)):
            parsed = tf.io.parse_single_example(raw, schema.feature_spec(side_width))
            found[parsed[schema.FILENAME].numpy().decode()] = {k: v.numpy() for k, v in parsed.items()}
    return found


def test_columns_are_numeric_unless_marked_and_bad_specs_are_named():
    assert [(c.name, c.kind) for c in parse_columns("age, site:categorical")] == [
        ("age", "numeric"),
        ("site", "categorical"),
    ]
    for spec, words in (
        ("age:number", "':numeric' or ':categorical'"),
        ("age,age", "named twice"),
        ("label", "reserved"),
        ("2nd", "not usable as an input name"),
    ):
        with pytest.raises(UserError, match=words):
            parse_columns(spec)


def test_values_statistics_and_missing_cells_round_trip(tmp_path: Path):
    out = tmp_path / "records"
    meta = write_tfrecords(manifest(tmp_path / "src"), out, feature_columns="age,site:categorical", num_shards=1)
    stored = json.loads((out / schema.METADATA_FILE).read_text())
    assert (
        stored["side_features"]
        == meta["side_features"]
        == [
            {"name": "age", "kind": "numeric", "mean": 20.0, "std": pytest.approx(math.sqrt(200 / 3))},
            {"name": "site", "kind": "categorical", "vocabulary": ["arm", "leg"]},  # from train only: not "head"
        ]
    )
    assert stored["side_feature_missing"] == {"train": {"age": 1, "site": 1}, "val": {"age": 1, "site": 1}}
    train, val = records_by_file(out, "train", 2), records_by_file(out, "val", 2)
    assert train["a1.jpg"][schema.SIDE_VALUES].tolist() == [20.0, 2.0]  # "leg" is index 2; 0 is missing
    assert math.isnan(train["b1.jpg"][schema.SIDE_VALUES][0]) and train["b1.jpg"][schema.SIDE_VALUES][1] == 0
    assert val["a2.jpg"][schema.SIDE_VALUES][1] == 0  # a category training never saw counts as missing


def test_pipelines_yield_image_and_side_dicts_with_the_labels(tmp_path: Path):
    out = tmp_path / "records"
    write_tfrecords(manifest(tmp_path / "src"), out, feature_columns="age,site:categorical", num_shards=1)
    inputs, labels = next(iter(make_eval_dataset(out, split="val", image_size=16, batch_size=8)))
    assert sorted(inputs) == ["image", "side"] and inputs["image"].dtype == tf.uint8
    by_label = dict(zip(labels.numpy().tolist(), inputs["side"].numpy().tolist()))
    assert by_label[1] == [25.0, 2.0] and math.isnan(by_label[0][0])
    inputs, labels = next(iter(make_train_dataset(out, image_size=16, batch_size=4, seed=0, deterministic=True)))
    assert inputs["side"].shape == (4, 2) and sorted(labels.numpy().tolist()) == [0, 0, 1, 1]


def test_a_dataset_without_side_features_is_written_as_before(tmp_path: Path):
    out = tmp_path / "records"
    meta = write_tfrecords(manifest(tmp_path / "src"), out, num_shards=1)
    assert not {"side_features", "side_feature_missing", "feature_columns"} & set(meta)
    record = next(iter(records_by_file(out, "train", 0).values()))
    assert schema.SIDE_VALUES not in record
    images, _ = next(iter(make_eval_dataset(out, split="val", image_size=16)))
    assert isinstance(images, tf.Tensor) and images.shape[1:] == (16, 16, 3)


@pytest.mark.parametrize(
    "columns, rows, words",
    [
        ("age,weight", ROWS, "no column 'weight' for --feature-columns"),
        (
            "age",
            [*ROWS[:2], ("b0.jpg", "dog", "train", "old", "arm"), *ROWS[3:]],
            r"manifest.csv:4: column 'age' is numeric but holds 'old'",
        ),
    ],
)
def test_bad_columns_fail_in_one_line_before_anything_is_written(tmp_path: Path, columns, rows, words):
    out = tmp_path / "records"
    with pytest.raises(UserError, match=words):
        write_tfrecords(manifest(tmp_path / "src", rows), out, feature_columns=columns)
    assert not out.exists() or not any(out.iterdir())


def test_side_features_need_a_manifest_not_class_folders(demo_images: Path, tmp_path: Path):
    with pytest.raises(UserError, match="is a folder; side features come from a CSV manifest"):
        write_tfrecords(demo_images, tmp_path / "records", feature_columns="age")


def test_the_encoding_layer_standardises_numbers_and_one_hots_categories():
    from app.models.layers import SideFeatureEncoding

    layer = SideFeatureEncoding(
        [
            {"name": "age", "kind": "numeric", "mean": 20.0, "std": 10.0},
            {"name": "site", "kind": "categorical", "vocabulary": ["arm", "leg"]},
        ]
    )
    encoded = np.asarray(layer(np.array([[30.0, 2.0], [np.nan, 0.0], [0.0, 7.0]], np.float32)))
    np.testing.assert_allclose(
        encoded, [[1.0, 0, 0, 1], [0.0, 1, 0, 0], [-2.0, 1, 0, 0]]
    )  # NaN → the mean; 7 → missing


def test_the_threshold_task_labels_each_row_by_the_sign_of_its_reading(tmp_path: Path):
    from app.data.side_demo import generate_side_feature_dataset

    out = generate_side_feature_dataset(tmp_path / "photos", per_class=20, image_size=16, task="threshold")
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 80 and all(row["reading"] for row in rows)  # never missing: the ceiling is reachable
    assert all((float(row["reading"]) > 0) == row["label"].endswith("_high") for row in rows)
    sites = {level: {row["site"] for row in rows if row["label"].endswith(level)} for level in ("_low", "_high")}
    assert sites["_low"] == sites["_high"]  # site says nothing about the level
    with pytest.raises(ValueError, match="task must be one of"):
        generate_side_feature_dataset(tmp_path / "other", per_class=1, task="sums")


def test_the_model_sees_the_encoded_side_features_directly_scaled_by_the_image_features_count():
    """Wide and deep: the head's input is [pooled image features, the side MLP's output, D x encoding]."""
    from conftest import TINY_BACKBONE

    from app.models.backbones import get_backbone
    from app.models.classifier import SIDE_UNITS, build_classifier

    spec = get_backbone(TINY_BACKBONE)
    columns = [
        {"name": "age", "kind": "numeric", "mean": 20.0, "std": 10.0},
        {"name": "site", "kind": "categorical", "vocabulary": ["arm", "leg"]},
    ]
    clf = build_classifier(spec, spec.build((32, 32, 3), None), 3, 32, 0.0, side_features=columns)
    assert clf.head_model.get_layer("logits").kernel.shape == (
        24 + SIDE_UNITS + 4,
        3,
    )  # 24 image features, 1 + 3 encoded
    encode, wide = clf.head_model.get_layer("side_encoding"), clf.head_model.get_layer("side_wide")
    row = wide(encode(np.array([[30.0, 2.0]], np.float32)))
    np.testing.assert_allclose(np.asarray(row), [[24.0, 0.0, 0.0, 24.0]])  # (30 - 20) / 10 = 1 and "leg", x 24
    kernel = np.asarray(clf.head_model.get_layer("logits").kernel)
    assert not kernel[-4:].any()  # the wide columns' weights start at zero: D x a random weight swamped every logit
    assert np.abs(kernel[:-4]).min(axis=1).all()  # every other input starts random, as Keras starts it


def test_a_closed_gate_zeroes_the_encoding_and_the_weights_file_carries_it(tmp_path: Path):
    """The run's decision that its side features do not pay lives in a weight: phase 2, a resume
    and the export read it from the weights files, and the model's inputs stay the same."""
    import keras

    from app.models.layers import SideFeatureEncoding

    columns = [{"name": "age", "kind": "numeric", "mean": 20.0, "std": 10.0}]

    def model() -> keras.Model:
        side = keras.Input((1,), name="side")
        return keras.Model(side, SideFeatureEncoding(columns, name="side_encoding")(side))

    closed = model()
    closed.get_layer("side_encoding").gate.assign(0.0)
    assert not np.asarray(closed(np.array([[30.0]], np.float32))).any()
    closed.save_weights(tmp_path / "closed.weights.h5")
    reloaded = model()
    np.testing.assert_allclose(np.asarray(reloaded(np.array([[30.0]], np.float32))), [[1.0]])  # a new layer: open
    reloaded.load_weights(tmp_path / "closed.weights.h5")
    assert float(reloaded.get_layer("side_encoding").gate) == 0.0


def test_weights_saved_before_the_gate_existed_load_with_the_gate_open(tmp_path: Path):
    import h5py
    import keras

    from app.models.layers import SideFeatureEncoding

    side = keras.Input((1,), name="side")
    build = lambda: keras.Model(side, SideFeatureEncoding([{"name": "age", "kind": "numeric", "mean": 0.0, "std": 1.0}],  # noqa: E731
                                                          name="side_encoding")(side))  # fmt: skip
    build().save_weights(tmp_path / "old.weights.h5")
    with h5py.File(tmp_path / "old.weights.h5", "r+") as weights:  # the layout of a file saved before: no variable
        gate_vars = [name for name in _h5_names(weights) if "encoding" in name and name.endswith("vars/0")]
        assert gate_vars, "the test must find the gate's variable to remove it"
        del weights[gate_vars[0]]
    loaded = build()
    loaded.get_layer("side_encoding").gate.assign(0.5)
    loaded.load_weights(tmp_path / "old.weights.h5")
    assert float(loaded.get_layer("side_encoding").gate) == 0.5  # untouched: nothing in the file to load


def _h5_names(group) -> list[str]:
    names: list[str] = []
    group.visit(names.append)
    return names
