"""Phase 2's validation input: each val image's activation where the trained layers begin,
computed once instead of every epoch (by phase 1's feature cache, where it runs).

Phase 2 trains only the top of the backbone. Below its first trained layer nothing trains,
BatchNorm runs on its pretrained statistics and evaluation has no dropout or augmentation, so
every epoch's validation pass recomputed the same activations there. They are computed once,
and each epoch runs only the layers above the cut (`classifier.split_at_trained`): the same
logits, up to float rounding. Phase 1's feature cache, when this process builds it, computes
them as it runs the val photos through the backbone (the pass it makes anyway, so they cost
nothing); otherwise phase 2 makes one pass as it starts. MobileNetV2 at 224 with
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

from app.data.pipeline import map_image
from app.models.classifier import FrozenSplit, split_at_trained, unfreeze_start
from app.training.context import FEATURE_CACHE_LIMIT, Context
from app.training.feature_cache import eval_images, model_outputs
from app.training.inputs import distribute
from app.training.phase import PhaseInputs
from app.training.strategy import num_workers

log = logging.getLogger(__name__)


class FrozenValidation:
    """Phase 2's validation from its cut, when `split` is not None: the split, and the val
    split's activations at the cut, computed once. Phase 1's feature cache runs every val photo
    through the backbone anyway; as it is built, it hands the activations over (`keep`), and
    phase 2 then computes nothing. Otherwise (phase 1 on images, its cache read back from the
    run dir) phase 2 computes them as it starts."""

    def __init__(self, ctx: Context, split: FrozenSplit | None) -> None:
        self.ctx, self.split = ctx, split
        self._data: tf.data.Dataset | None = None

    def keep(self, activations: np.ndarray, side: np.ndarray | None, labels: np.ndarray) -> None:
        self._data = _dataset(activations, side, labels)
        _log_done(self.split, activations, "as phase 1's feature cache was built")

    def inputs(self, inputs: PhaseInputs) -> PhaseInputs:
        """`inputs` with validation on the activations (for `split.tail`), computed when the
        phase first needs its input: a finished phase, seen again on resume, never computes them."""
        if self.split is None:
            return inputs

        def val_dataset():
            if self._data is None:
                self._data = _activations(self.ctx, self.split)
            return distribute(self.ctx, lambda ic: self._data.batch(self.ctx.cfg.batch_size))

        def train_iterator():
            val_dataset()  # before the first epoch starts, so its log line comes before the epoch's
            return inputs.train_iterator()

        return PhaseInputs(train_iterator=train_iterator, val_dataset=val_dataset)


def frozen_validation(ctx: Context) -> FrozenValidation:
    """Phase 2's cut where validating from it is possible and worth it (else `split` is None):
    one worker (several would each hold every activation), a single tensor at the cut, and the
    activations within the memory `cache_features = auto` allows phase 1's cache."""
    if num_workers(ctx.strategy) > 1 or not ctx.info.num_examples("val") or not ctx.cfg.epochs_finetune:
        return FrozenValidation(ctx, None)
    start = unfreeze_start(ctx.clf, ctx.cfg.unfreeze)
    split = split_at_trained(ctx.clf, start)
    if split is None:
        why = ("it trains the whole backbone" if start <= 1 else
               "no single activation separates its frozen layers from the trained ones")
        log.info("phase 2 validates on images: %s", why)
        return FrozenValidation(ctx, None)
    size = activation_bytes(ctx, split)
    if size > FEATURE_CACHE_LIMIT:
        log.info("phase 2 validates on images: the val activations at %s would take %.1f GiB", split.cut, size / 2**30)
        return FrozenValidation(ctx, None)
    return FrozenValidation(ctx, split)


def activation_bytes(ctx: Context, split: FrozenSplit) -> int:
    return ctx.info.num_examples("val") * int(np.prod(split.lower.output.shape[1:])) * 4


def _activations(ctx: Context, split: FrozenSplit) -> tf.data.Dataset:
    """(activations, or {"activations", "side"}; labels) of every val image, in file order."""
    start = time.perf_counter()
    outputs, labels = model_outputs(lambda inputs, labels: map_image(inputs, lambda images: split.lower(images, training=False)),
                                    eval_images(ctx, "val"))
    x, side = (outputs["image"], outputs["side"]) if isinstance(outputs, dict) else (outputs, None)
    _log_done(split, x, f"as phase 2 started ({time.perf_counter() - start:.1f}s)")
    return _dataset(x, side, labels)


def _dataset(activations: np.ndarray, side: np.ndarray | None, labels: np.ndarray) -> tf.data.Dataset:
    features = {"activations": activations, "side": side} if side is not None else activations
    return tf.data.Dataset.from_tensor_slices((features, labels))


def _log_done(split: FrozenSplit, activations: np.ndarray, when: str) -> None:
    log.info("phase 2 validates from %s: the layers below it are frozen, so the %d val images' activations there"
             " (%.1f MB) were computed once, %s; each epoch runs only the layers above", split.cut,
             len(activations), activations.nbytes / 1e6, when)
