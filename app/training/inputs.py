"""What a phase reads from images: decoded and augmented here (or on the tf.data service), and
how batches are spread over replicas. Backbone features and activations computed once are the
frozen backbone's (app/training/frozen).

Every dataset is built per replica by `distribute_datasets_from_function`, so the same code
serves one device, several GPUs and several workers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import tensorflow as tf

from app.data.pipeline import make_eval_dataset, make_train_dataset
from app.data.preprocess import as_written, color_jitter
from app.data.service import job_name as service_job_name
from app.training.context import Context
from app.training.phase import PhaseInputs


def distribute(ctx: Context, make) -> object:
    """make(input_context) → per-replica dataset; sharded per worker by TensorFlow's input contexts."""
    return ctx.strategy.distribute_datasets_from_function(make)


def shuffled_batches(ctx: Context, rows) -> Iterator:
    """Endless training batches of cached rows (features or activations, in memory or on disk;
    `rows`: a structure of arrays, row for row): reshuffled every pass, full batches only."""
    return iter(distribute(ctx, lambda ic: shuffled_rows(rows, ctx.cfg.seed, ctx.batch_size)))


def shuffled_rows(rows, seed: int, batch_size: int) -> tf.data.Dataset:
    """The batches `from_tensor_slices(rows).shuffle(len(rows), seed).repeat().batch(batch_size,
    drop_remainder=True)` gives, without its copies: that holds the rows twice more (a tensor of
    them all, then the shuffle buffer), where this shuffles their indices and reads each batch's
    rows from the arrays as it goes."""
    count = _count(rows)
    indices = tf.data.Dataset.range(count).shuffle(count, seed=seed).repeat()
    return indices.batch(batch_size, drop_remainder=True).map(_rows_at(rows))


def row_batches(rows, batch_size: int) -> tf.data.Dataset:
    """The rows in order, `batch_size` at a time, read from the arrays as they go (no copy)."""
    return tf.data.Dataset.range(_count(rows)).batch(batch_size).map(_rows_at(rows))


def _count(rows) -> int:
    return len(tf.nest.flatten(rows)[0])


def _rows_at(rows) -> Callable:
    """indices → the rows at them, in `rows`' structure."""
    arrays = tf.nest.flatten(rows)
    dtypes = [tf.as_dtype(a.dtype) for a in arrays]

    @as_written  # tf.data would write AutoGraph's rewrite of it to $TMPDIR, left there by a killed run
    def at(indices: tf.Tensor):
        found = tf.numpy_function(lambda i: [a[i] for a in arrays], [indices], dtypes, stateful=False)
        for tensor, array in zip(found, arrays):  # the batch's size as static as the indices' (full batches: known)
            tensor.set_shape([indices.shape[0], *array.shape[1:]])
        return tf.nest.pack_sequence_as(rows, found)

    return at


def eval_dataset(ctx: Context, split: str) -> object:
    """Unaugmented batches of `split`, always decoded on this machine (small next to train)."""
    return distribute(
        ctx,
        lambda ic: make_eval_dataset(
            ctx.cfg.data, split=split, image_size=ctx.image_size, batch_size=ctx.batch_size, input_context=ic
        ),
    )


def image_inputs(ctx: Context, phase: int) -> PhaseInputs:
    """Training input decoded here, or on the tf.data service with `data_service`."""
    return PhaseInputs(train_iterator=lambda: train_batches(ctx, phase), val_dataset=lambda: eval_dataset(ctx, "val"))


def train_batches(
    ctx: Context, phase: int, then: Callable[[tf.data.Dataset], tf.data.Dataset] = lambda images: images
) -> Iterator:
    """Endless training batches over the replicas: each replica's augmented images, passed
    through `then` (phase 2's layers below its cut, where they run on the host: app/training/frozen)."""
    return iter(distribute(ctx, lambda ic: then(_train_images(ctx, phase, ic))))


def _train_images(ctx: Context, phase: int, input_context: tf.distribute.InputContext | None) -> tf.data.Dataset:
    """Endless augmented training batches (uint8; the colour jitter is the train step's) for one
    replica, decoded here or on the tf.data service with `data_service`."""
    cfg = ctx.cfg
    job = service_job_name(str(Path(cfg.out).resolve()), phase) if cfg.data_service else None
    return make_train_dataset(
        cfg.data,
        image_size=ctx.image_size,
        batch_size=ctx.batch_size,
        augment=ctx.augmentation,
        seed=cfg.seed,
        repeat=True,
        input_context=input_context,
        data_service=cfg.data_service or None,
        service_job=job,
    )


SAMPLE_IMAGES = 8  # training images shown in TensorBoard


def augmented_sample(ctx: Context, count: int = SAMPLE_IMAGES) -> np.ndarray:
    """A few training images as the model gets them: the pipeline's crop and flip, then the
    train step's colour jitter (float32 0..255, for TensorBoard)."""
    ds = make_train_dataset(
        ctx.cfg.data,
        image_size=ctx.image_size,
        batch_size=count,
        augment=ctx.augmentation,
        seed=ctx.cfg.seed,
        shuffle_buffer=count,
    )
    inputs, _ = next(iter(ds))
    images = inputs["image"] if isinstance(inputs, dict) else inputs
    return color_jitter(images, tf.constant([ctx.cfg.seed, 1]), ctx.augmentation.color_jitter).numpy()
