"""The TFRecord format, defined once: feature keys, Example encoding, parsing, shard names.

Keys follow the usual TF image-classification convention (the one the TF-Slim and TPU
reference pipelines use), so other tools can read our shards.
"""

from __future__ import annotations

import re

import tensorflow as tf

SCHEMA_VERSION = 1
METADATA_FILE = "dataset.json"

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
        FILENAME: _bytes(filename.encode()),
    }
    if side is not None:
        feature[SIDE_VALUES] = tf.train.Feature(float_list=tf.train.FloatList(value=side))
    return tf.train.Example(features=tf.train.Features(feature=feature))


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
