"""The TFRecord format, defined once: feature keys, Example encoding, parsing, shard names.

Keys follow the usual TF image-classification convention (the one the TF-Slim and TPU
reference pipelines use), so other tools can read our shards.
"""

from __future__ import annotations

import re
from pathlib import Path

import tensorflow as tf

from app import storage
from app.data.folder_names import METADATA_FILE as METADATA_FILE  # named beside the format's other names
from app.errors import UserError

SCHEMA_VERSION = 1

ENCODED = "image/encoded"
FORMAT = "image/format"
LABEL = "image/class/label"
TEXT = "image/class/text"
HEIGHT = "image/height"
WIDTH = "image/width"
FILENAME = "image/filename"
SIDE_VALUES = "side/values"  # float [F]: a dataset's side features, in dataset.json's order (side_features.py)

FEATURE_SPEC = {
    ENCODED: tf.io.FixedLenFeature([], tf.string),
    FORMAT: tf.io.FixedLenFeature([], tf.string, default_value="jpeg"),
    LABEL: tf.io.FixedLenFeature([], tf.int64),
    TEXT: tf.io.FixedLenFeature([], tf.string, default_value=""),
    HEIGHT: tf.io.FixedLenFeature([], tf.int64, default_value=0),
    WIDTH: tf.io.FixedLenFeature([], tf.int64, default_value=0),
    FILENAME: tf.io.FixedLenFeature([], tf.string, default_value=""),
}

SHARD_PATTERN = re.compile(r"^(?P<split>[A-Za-z0-9_]+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.tfrecord$")


def shard_name(split: str, index: int, count: int) -> str:
    """`train-00003-of-00016.tfrecord`: sortable, and a missing shard is obvious from the name."""
    return f"{split}-{index:05d}-of-{count:05d}.tfrecord"


def make_example(
    jpeg: bytes,
    label: int | list[int],
    class_name: str,
    height: int,
    width: int,
    filename: str,
    side: list[float] | None = None,
) -> tf.train.Example:
    """One image as a `tf.train.Example`; `jpeg` must already be a valid RGB JPEG. A multi-label
    photo's `label` is the list of its label ids (any length, also none), `class_name` its labels
    joined by '|'. `side` (the encoded side features) is stored only when the dataset has them."""

    def _bytes(value: bytes) -> tf.train.Feature:
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    def _int(value: int | list[int]) -> tf.train.Feature:
        return tf.train.Feature(int64_list=tf.train.Int64List(value=value if isinstance(value, list) else [value]))

    feature = {
        ENCODED: _bytes(jpeg),
        FORMAT: _bytes(b"jpeg"),
        LABEL: _int(label),
        TEXT: _bytes(class_name.encode()),
        HEIGHT: _int(height),
        WIDTH: _int(width),
        FILENAME: _bytes(filename.encode("utf-8", "surrogateescape")),  # a name that is not UTF-8: its bytes
    }
    if side is not None:
        feature[SIDE_VALUES] = tf.train.Feature(float_list=tf.train.FloatList(value=side))
    return tf.train.Example(features=tf.train.Features(feature=feature))


def stored_filename(raw: bytes) -> str:
    """`image/filename` as `make_example` was given it, a name that is not UTF-8 included."""
    return raw.decode("utf-8", "surrogateescape")


def feature_spec(side_width: int = 0, multi_label: bool = False) -> dict:
    """What a record holds: FEATURE_SPEC, plus the side-feature vector when the dataset has one;
    a multi-label dataset's label is a variable-length list of ids (parsed as a SparseTensor)."""
    spec = dict(FEATURE_SPEC)
    if side_width:
        spec[SIDE_VALUES] = tf.io.FixedLenFeature([side_width], tf.float32)
    if multi_label:
        spec[LABEL] = tf.io.VarLenFeature(tf.int64)
    return spec


def parse_batch(serialized: tf.Tensor, side_width: int = 0, multi_label: bool = False) -> dict[str, tf.Tensor]:
    """Parse a batch (vector) of serialized Examples in one op: much cheaper than per record."""
    return tf.io.parse_example(serialized, feature_spec(side_width, multi_label))


_TEXTS, _NUMBERS = (list, str), (dict, str, int)
DATASET_FIELDS = {  # dataset.json's keys as app.data.pipeline reads them: (required, shape)
    "classes": (True, _TEXTS),
    "counts": (True, (dict, str, _NUMBERS)),
    "shards": (True, (dict, str, _TEXTS)),
    "shard_records": (False, _NUMBERS),
    "side_features": (False, (list, dict)),
    "examples": (False, _NUMBERS),
}


def _conforms(value, shape) -> bool:
    """`shape`: a type, or (list, item shape), or (dict, key type, value shape)."""
    if not isinstance(shape, tuple):
        return isinstance(value, shape) and not (shape is int and isinstance(value, bool))
    if shape[0] is list:
        return isinstance(value, list) and all(_conforms(v, shape[1]) for v in value)
    return isinstance(value, dict) and all(isinstance(k, shape[1]) and _conforms(v, shape[2]) for k, v in value.items())


def check_dataset_json(meta: dict, meta_path: str) -> None:
    """A dataset.json edited by hand or cut short: one line naming the key, not a KeyError later."""
    for key, (required, shape) in DATASET_FIELDS.items():
        if key not in meta:
            if required:
                raise UserError(f"{meta_path}: no '{key}'; write the dataset again with photoclf convert")
        elif not _conforms(meta[key], shape):
            raise UserError(f"{meta_path}: '{key}' is not what photoclf convert writes")
    if meta.get("task", "single_label") not in ("single_label", "multi_label"):
        raise UserError(f"{meta_path}: 'task' must be single_label or multi_label, got {meta['task']!r}")


def not_a_tfrecord_folder(root: str) -> str:
    """What to say of a folder without dataset.json: most often the photos themselves, given where
    their TFRecords were meant, so the command that makes those, with this folder in it."""
    said = f"{root}: no {METADATA_FILE}, so not a TFRecord folder"
    local = None if storage.is_url(root) else Path(root)
    if local and local.is_file() and local.suffix.lower() == ".csv":
        return f"{root}: a CSV manifest is converted first: photoclf convert {root} DATA_DIR, then --data DATA_DIR"
    if local and local.is_file() and (local.parent / METADATA_FILE).is_file():  # a shard, or dataset.json itself
        return f"{root}: one file of a TFRecord folder; give the folder: {local.parent}"
    if local and local.is_dir() and any(local.iterdir()):
        return f"{said}; a folder of photos is converted first: photoclf convert {root} DATA_DIR, then --data DATA_DIR"
    return f"{said}; create it with photoclf convert"
