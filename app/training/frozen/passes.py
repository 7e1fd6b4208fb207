"""What a frozen backbone is shown, and running a model over it: the unaugmented splits, one
stream of several parts, and the pooled features of a split.

Phase 1's feature cache, phase 2's activations below its cut, the "none of these" fit and the
backbone probe all pass images through frozen layers; they share these. (The training split's
augmented views are seeded by each photo's content: `app.data.keyed.make_keyed_dataset`.)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

import numpy as np
import tensorflow as tf
from tqdm import tqdm

from app.data.pipeline import load_dataset_info, make_eval_dataset, map_image
from app.data.preprocess import as_written
from app.inference.host_forward import HostForward, Outputs
from app.training.context import Context


def eval_images(ctx: Context, split: str) -> tf.data.Dataset:
    ds = make_eval_dataset(ctx.cfg.data, split=split, image_size=ctx.image_size, batch_size=ctx.batch_size)
    return _float_images(ds)


def _float_images(ds: tf.data.Dataset) -> tf.data.Dataset:
    """uint8 batches as float32 0..255: what the backbone takes (side features pass through)."""
    return ds.map(as_written(lambda inputs, labels: (map_image(inputs, lambda x: tf.cast(x, tf.float32)), labels)))


def split_features(
    features_model, data: str, split: str, image_size: int, batch_size: int = 32, runtime: str = "auto"
) -> tuple[np.ndarray, np.ndarray]:
    """(pooled features, labels) of every photo of `split`, decoded as evaluation decodes them:
    the one place a split's photos run through a whole frozen backbone outside the feature store.
    `runtime`: app.inference.host_forward's choice, in float32 (they fit and judge what ships)."""
    return splits_features(features_model, data, [split], image_size, batch_size, runtime)[split]


def splits_features(
    features_model, data: str, splits: list[str], image_size: int, batch_size: int = 32, runtime: str = "auto"
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """`split_features` of several splits through one traced pass (and one runtime choice, made
    for all their rows): a pass per split traced the backbone again for each."""
    info = load_dataset_info(data)
    rows = sum(info.num_examples(split) for split in splits)
    forward = HostForward(lambda x: features_model(x, training=False), (image_size, image_size, 3), runtime, rows)
    return {
        split: forward_outputs(
            forward,
            _float_images(make_eval_dataset(data, split=split, image_size=image_size, batch_size=batch_size)),
            exact=lambda labels: True,
        )
        for split in splits
    }


def forward_outputs(
    forward: HostForward, dataset: tf.data.Dataset, exact: Callable[[object], bool] | None = None
) -> tuple[object, object]:
    """(outputs, labels) as `model_outputs` gives them, of a frozen pass on the host's runtime
    (`forward`) over the images of every batch (side features do not enter a backbone);
    `exact(labels)` says which batches run in float32 (HostForward's `exact`)."""
    outputs, labels = [], []
    for out, y in forward_batches(forward, dataset, exact=exact):
        outputs.append(out)
        labels.append(y)
    return tuple(tf.nest.map_structure(lambda *batches: np.concatenate(batches), *parts) for parts in (outputs, labels))


def forward_batches(
    forward: HostForward,
    dataset: tf.data.Dataset,
    bar: tqdm | None = None,
    on_first_batch: Callable[[np.ndarray], None] | None = None,
    exact: Callable[[object], bool] | None = None,
) -> Iterator[tuple[Outputs, object]]:
    """`forward_outputs` batch by batch, for a caller that puts each batch's rows where they
    belong as they come instead of holding every batch and a concatenation of them at once."""
    for index, (inputs, y) in enumerate(dataset):
        images = (inputs["image"] if isinstance(inputs, dict) else inputs).numpy()
        if on_first_batch is not None and index == 0:
            on_first_batch(images)
        y = tf.nest.map_structure(_integers, y)
        yield forward(images, exact=exact is not None and exact(y)), y
        if bar is not None:
            bar.update(len(tf.nest.flatten(y)[0]))


def model_outputs(
    call: Callable,
    dataset: tf.data.Dataset,
    bar: tqdm | None = None,
    on_first_batch: Callable[[np.ndarray], None] | None = None,
) -> tuple[object, object]:
    """(outputs float32, labels int32) of `call(inputs, labels)` over every batch of `dataset`;
    outputs and labels keep their structure (a `one_stream`'s labels: (labels, part)).
    `on_first_batch` gets the first batch's images.

    `call` is traced once, for any batch size: traced per shape, a split's last, smaller batch
    would trace the backbone a second time, for no faster batches."""
    call = tf.function(call, input_signature=list(dataset.element_spec), autograph=False)
    outputs, labels = [], []
    for inputs, y in dataset:
        if on_first_batch is not None and not outputs:
            on_first_batch((inputs["image"] if isinstance(inputs, dict) else inputs).numpy())
        outputs.append(tf.nest.map_structure(lambda t: t.numpy().astype(np.float32), call(inputs, y)))
        labels.append(tf.nest.map_structure(_integers, y))
        if bar is not None:
            bar.update(len(tf.nest.flatten(y)[0]))
    return tuple(tf.nest.map_structure(lambda *batches: np.concatenate(batches), *parts) for parts in (outputs, labels))


def _integers(t: tf.Tensor) -> np.ndarray:
    """Labels as int32; int64 (content keys) kept whole."""
    return t.numpy() if t.dtype == tf.int64 else t.numpy().astype(np.int32)


def one_stream(parts: list[tf.data.Dataset]) -> tf.data.Dataset:
    """The parts' batches one after another, each as (inputs, (labels, index of its part)). One
    stream keeps the input busy across the parts' boundaries, where a pass per part left the
    backbone waiting while each new pipeline started."""

    def tagged(index: int, part: tf.data.Dataset) -> tf.data.Dataset:
        return part.map(as_written(lambda inputs, labels: (inputs, (labels, tf.fill(tf.shape(labels)[:1], index)))))

    return functools.reduce(tf.data.Dataset.concatenate, [tagged(i, part) for i, part in enumerate(parts)]).prefetch(2)
