"""Phase 2's validation input: each val image's activation where the trained layers begin,
computed once instead of every epoch.

Phase 2 trains only the top of the backbone. Below its first trained layer nothing trains,
BatchNorm runs on its pretrained statistics and evaluation has no dropout or augmentation, so
every epoch's validation pass recomputed the same activations there. They are computed once,
as phase 2 starts, and each epoch runs only the layers above the cut
(`classifier.split_at_trained`): the same logits, up to float rounding. MobileNetV2 at 224 with
the default blocks:2 cuts at block_14_add (7x7x160): the layers above take 0.5 ms per image
against 8.1 ms for the whole backbone on 2 CPU cores, and no image is decoded again.

The activations are held in memory only, float32 (200 val images: 6 MB); a resumed run
computes them again. Training still runs on images: its crops change every epoch.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import tensorflow as tf

from app.models.classifier import FrozenSplit, split_at_trained, unfreeze_start
from app.training.context import FEATURE_CACHE_LIMIT, Context
from app.training.feature_cache import eval_images
from app.training.inputs import distribute
from app.training.phase import PhaseInputs
from app.training.strategy import num_workers

log = logging.getLogger(__name__)


def frozen_split(ctx: Context) -> FrozenSplit | None:
    """Phase 2's cut, where validating from it is possible and worth it: one worker (several
    would each hold every activation), a single tensor at the cut, and the activations within
    the memory `cache_features = auto` allows phase 1's cache."""
    if num_workers(ctx.strategy) > 1 or not ctx.info.num_examples("val"):
        return None
    split = split_at_trained(ctx.clf, unfreeze_start(ctx.clf, ctx.cfg.unfreeze))
    if split is None:
        log.info("phase 2 validates on images: no single activation separates its frozen layers from the trained ones")
        return None
    size = activation_bytes(ctx, split)
    if size > FEATURE_CACHE_LIMIT:
        log.info("phase 2 validates on images: the val activations at %s would take %.1f GiB", split.cut, size / 2**30)
        return None
    return split


def activation_bytes(ctx: Context, split: FrozenSplit) -> int:
    return ctx.info.num_examples("val") * int(np.prod(split.lower.output.shape[1:])) * 4


def validating_on_activations(ctx: Context, inputs: PhaseInputs, split: FrozenSplit) -> PhaseInputs:
    """`inputs` with validation on the val split's activations at the cut (for `split.tail`),
    computed when the phase first needs its input: a finished phase, seen again on resume, never
    computes them."""
    held: list[tf.data.Dataset] = []

    def val_dataset():
        if not held:
            held.append(_activations(ctx, split))
        return distribute(ctx, lambda ic: held[0].batch(ctx.cfg.batch_size))

    def train_iterator():
        val_dataset()  # before the first epoch starts, so its log line comes before the epoch's
        return inputs.train_iterator()

    return PhaseInputs(train_iterator=train_iterator, val_dataset=val_dataset)


def _activations(ctx: Context, split: FrozenSplit) -> tf.data.Dataset:
    """(activations, or {"activations", "side"}; labels) of every val image, in file order."""
    start = time.perf_counter()
    lower = tf.function(lambda images: split.lower(images, training=False), reduce_retracing=True, autograph=False)
    activations, sides, labels = [], [], []
    for inputs, y in eval_images(ctx, "val"):
        images = inputs["image"] if isinstance(inputs, dict) else inputs
        activations.append(tf.cast(lower(images), tf.float32).numpy())
        if isinstance(inputs, dict):
            sides.append(inputs["side"].numpy())
        labels.append(y.numpy())
    x = np.concatenate(activations)
    log.info("phase 2 validates from %s: the layers below it are frozen, so the %d val images' activations there"
             " (%.1f MB) were computed once, in %.1fs; each epoch runs only the layers above",
             split.cut, len(x), x.nbytes / 1e6, time.perf_counter() - start)
    features = {"activations": x, "side": np.concatenate(sides)} if sides else x
    return tf.data.Dataset.from_tensor_slices((features, np.concatenate(labels)))
