"""Several labels per photo: the manifest's 'car|person' cells, their storage as id lists,
dataset.json's task and per-label counts, multi-hot pipelines, and the one-line errors."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import tensorflow as tf
from PIL import Image

from app.data import schema
from app.data.pipeline import load_dataset_info, make_eval_dataset
from app.data.writer import write_tfrecords
from app.errors import UserError

ROWS = [
    ("p0.jpg", "car|person", "train"),
    ("p1.jpg", "person", "train"),
    ("p2.jpg", "bicycle| car", "train"),
    ("p3.jpg", "", "train"),
    ("p4.jpg", "person|car", "val"),
    ("p5.jpg", "bicycle", "val"),
]


def manifest(folder: Path, rows=ROWS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i, row in enumerate(rows):
        Image.new("RGB", (24, 24), (40 * i, 20, 200)).save(folder / row[0])
    with (folder / "manifest.csv").open("w", newline="") as f:
        csv.writer(f).writerows([("path", "label", "split"), *rows])
    return folder / "manifest.csv"


def test_label_lists_are_stored_as_ids_and_counted_per_label(tmp_path: Path):
    out = tmp_path / "records"
    meta = write_tfrecords(manifest(tmp_path / "src"), out, multi_label=True, num_shards=1)
    assert meta["task"] == "multi_label" and meta["classes"] == ["bicycle", "car", "person"]
    assert meta["counts"]["train"] == {"bicycle": 1, "car": 2, "person": 2} and meta["examples"] == {
        "train": 4,
        "val": 2,
    }
    assert load_dataset_info(out).num_examples("train") == 4  # photos, not label positives
    stored = {}
    for raw in tf.data.TFRecordDataset(str(out / meta["shards"]["train"][0])):
        ex = tf.io.parse_single_example(raw, schema.feature_spec(multi_label=True))
        stored[ex[schema.FILENAME].numpy().decode()] = (
            sorted(ex[schema.LABEL].values.numpy().tolist()),
            ex[schema.TEXT].numpy().decode(),
        )
    assert stored == {
        "p0.jpg": ([1, 2], "car|person"),
        "p1.jpg": ([2], "person"),
        "p2.jpg": ([0, 1], "bicycle|car"),
        "p3.jpg": ([], ""),
    }  # a photo may have no label at all


def test_the_pipeline_yields_multi_hot_labels(tmp_path: Path):
    out = tmp_path / "records"
    write_tfrecords(manifest(tmp_path / "src"), out, multi_label=True, num_shards=1)
    _, labels = next(iter(make_eval_dataset(out, split="val", image_size=16, batch_size=8)))
    assert labels.dtype == tf.float32 and sorted(labels.numpy().tolist()) == [[0, 1, 1], [1, 0, 0]]


@pytest.mark.parametrize(
    "rows, multi, words",
    [
        (
            [("p0.jpg", "car;person", "train"), *ROWS[1:]],
            True,
            "label 'car;person' looks like a list; separate a photo's labels with '|'",
        ),
        (ROWS, False, "label 'car|person' lists several labels; pass --multi-label"),
        (
            [*ROWS[:4], ("p4.jpg", "truck", "val"), ROWS[5]],
            True,
            r"label\(s\) \['truck'\] have no photo in the training split",
        ),
    ],
)
def test_bad_label_lists_fail_in_one_line_before_writing(tmp_path: Path, rows, multi, words):
    out = tmp_path / "records"
    with pytest.raises(UserError, match=words):
        write_tfrecords(manifest(tmp_path / "src", rows), out, multi_label=multi)
    assert not out.exists() or not any(out.iterdir())


def test_multi_label_needs_a_manifest_not_class_folders(demo_images: Path, tmp_path: Path):
    with pytest.raises(UserError, match="is a folder of class folders, one label per photo"):
        write_tfrecords(demo_images, tmp_path / "records", multi_label=True)


def test_the_audit_refuses_multi_label_records_saying_why(tmp_path: Path):
    from app.audit.items import load_audit_input

    out = tmp_path / "records"
    write_tfrecords(manifest(tmp_path / "src"), out, multi_label=True, num_shards=1)
    with pytest.raises(UserError, match="a multi-label dataset; the audit reads single-label data only"):
        load_audit_input(out)
