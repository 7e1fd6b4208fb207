"""The dataset by photo content: each photo's content key, a split's table of keys and labels,
and batches of chosen photos, their augmented views seeded by their content.

A photo has one key under any name, in any shard or dataset, so what a frozen backbone computed
from it (app/training/frozen) is found again by key; its augmented views are the same wherever
it is, so a view's output can be kept too. Reads the shards as app.data.pipeline does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tensorflow as tf

from app.data.pipeline import AUTOTUNE, load_dataset_info, read_records, train_decoder
from app.data.preprocess import Augment, as_written, color_jitter, eval_decoder
from app.data.shard_check import verify_shards


def content_keys(encoded: tf.Tensor) -> tf.Tensor:
    """int64 [N] keys of N encoded photos: FarmHash64 of their bytes, so a photo has one key under
    any name, in any shard or dataset (64 bits: a collision among a million photos has odds of
    about 3 in 100 million)."""
    return tf.bitcast(tf.fingerprint(encoded), tf.int64)


def record_table(data_dir: str | Path, split: str) -> dict[str, object]:
    """Every photo of `split` in stored order, not decoded: {"key": int64 [N], "label": [N, ...],
    "side": float32 [N, F] or None}. The rows of `make_keyed_dataset` are matched to these by key;
    photos the training pipeline would skip (not a complete JPEG) are skipped here too."""
    info = load_dataset_info(data_dir)
    files = info.shard_paths(split)
    verify_shards(files)
    ds = read_records(files, info)
    names = ["key", "label", *(["side"] if info.side_width else [])]
    ds = ds.batch(1024).map(as_written(lambda e: {**e, "key": content_keys(e["encoded"])}))
    columns: dict[str, list] = {name: [] for name in names}
    for batch in ds:
        for name in names:
            columns[name].append(batch[name].numpy())
    if not columns["key"]:
        return {"key": np.zeros([0], np.int64), "label": np.zeros([0], np.int32), "side": None}
    return {"side": None} | {name: np.concatenate(parts) for name, parts in columns.items()}


def make_keyed_dataset(
    data_dir: str | Path,
    *,
    split: str,
    image_size: int,
    batch_size: int,
    wanted: np.ndarray,
    view_seed: int | None = None,
    augment: Augment | None = None,
) -> tf.data.Dataset:
    """Batches of (float32 images 0..255, int64 content keys) of the photos of `split` whose keys
    are in `wanted`, in stored order; the others are read but not decoded.

    With `view_seed`, each photo gets the training augmentation (crop, flip, colour jitter)
    seeded by its content key and the view: the same photo gets the same view in any dataset,
    whatever its name or position, so a view computed once can be looked up by key. Without,
    the eval decode (`decode_for_eval`)."""
    info = load_dataset_info(data_dir)
    files = info.shard_paths(split)
    ds = read_records(files, info)
    ds = ds.map(as_written(lambda e: {**e, "key": content_keys(e["encoded"][None])[0]}))
    wanted_keys = np.sort(wanted)
    ds = ds.filter(as_written(lambda e: _is_in(e["key"], wanted_keys))) if len(wanted) else ds.take(0)
    decode = _keyed_decoder(image_size, view_seed, augment or Augment())
    ds = ds.map(as_written(lambda e: (decode(e["encoded"], e["key"]), e["key"])), num_parallel_calls=AUTOTUNE)
    return ds.batch(batch_size).prefetch(AUTOTUNE)


def _is_in(key: tf.Tensor, sorted_keys: np.ndarray) -> tf.Tensor:
    """Whether `key` is one of `sorted_keys`, by binary search (a lookup table would be a resource
    that a SavedModel export in the same process then complains about)."""
    keys = tf.constant(sorted_keys, tf.int64)
    at = tf.minimum(tf.searchsorted(keys, key[None])[0], len(sorted_keys) - 1)
    return tf.equal(keys[at], key)


def _keyed_decoder(image_size: int, view_seed: int | None, augment: Augment):
    """(encoded, key) → float32 image: the eval decode, or the training augmentation seeded by
    (view_seed, key): the pipeline's crop and flip, then the colour jitter the train step applies."""
    if view_seed is None:
        return lambda encoded, key: tf.cast(eval_decoder(image_size)(encoded), tf.float32)
    view = _traced_view(image_size, augment)
    return lambda encoded, key: view(encoded, key, tf.constant(view_seed, tf.int64))


@functools.cache
def _traced_view(image_size: int, augment: Augment) -> Callable:
    """A view of a photo, traced once per process and setting: each view's pipeline (K a run)
    calls the same graph with its own seed instead of building the augmentation's ops again."""
    decode = train_decoder(image_size, augment)

    def view(encoded: tf.Tensor, key: tf.Tensor, view_seed: tf.Tensor) -> tf.Tensor:
        crop_seed, jitter_seed = tf.unstack(tf.random.experimental.stateless_split(tf.stack([view_seed, key]), 2))
        image = decode(encoded, crop_seed)
        if augment.color_jitter <= 0:
            return tf.cast(image, tf.float32)
        return color_jitter(image, jitter_seed, augment.color_jitter)

    scalar = lambda dtype: tf.TensorSpec([], dtype)  # noqa: E731
    return tf.function(view, input_signature=[scalar(tf.string), scalar(tf.int64), scalar(tf.int64)], autograph=False)
