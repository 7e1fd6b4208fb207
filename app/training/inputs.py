"""What each phase reads: decoded, augmented images, or backbone features computed once.

Every dataset is built per replica by `distribute_datasets_from_function`, so the same code
serves one device, several GPUs and several workers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import tensorflow as tf

from app.data.pipeline import make_eval_dataset, make_train_dataset
from app.data.preprocess import color_jitter
from app.data.service import job_name as service_job_name
from app.training.context import Context
from app.training.feature_cache import FeatureCache, load_or_build
from app.training.frozen_activations import FrozenActivations
from app.training.passes import distribute, shuffled_batches
from app.training.phase import PhaseInputs


def eval_dataset(ctx: Context, split: str) -> object:
    """Unaugmented batches of `split`, always decoded on this machine (small next to train)."""
    return distribute(
        ctx,
        lambda ic: make_eval_dataset(
            ctx.cfg.data, split=split, image_size=ctx.image_size, batch_size=ctx.cfg.batch_size, input_context=ic
        ),
    )


def image_inputs(ctx: Context, phase: int) -> PhaseInputs:
    """Training input decoded here, or on the tf.data service with `data_service`."""
    cfg = ctx.cfg
    job = service_job_name(str(Path(cfg.out).resolve()), phase) if cfg.data_service else None

    def train_iterator():
        return iter(
            distribute(
                ctx,
                lambda ic: make_train_dataset(
                    cfg.data,
                    image_size=ctx.image_size,
                    batch_size=cfg.batch_size,
                    augment=ctx.augmentation,
                    seed=cfg.seed,
                    repeat=True,
                    input_context=ic,
                    data_service=cfg.data_service or None,
                    service_job=job,
                ),
            )
        )

    return PhaseInputs(train_iterator=train_iterator, val_dataset=lambda: eval_dataset(ctx, "val"))


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


def feature_inputs(
    ctx: Context, on_first_batch: Callable[[np.ndarray], None] | None = None, frozen: FrozenActivations | None = None
) -> PhaseInputs:
    """Cached-features mode: the head trains on backbone features computed once (feature_cache.py).
    An epoch is as many examples as the training split has images, drawn from the K views of each.
    A cache built here hands `frozen` (phase 2's input) the activations it needs."""
    cfg, loaded = ctx.cfg, []

    def cache() -> FeatureCache:
        if not loaded:  # lazily: a finished phase (seen again on resume) needs no features
            loaded.append(frozen.phase1_features(on_first_batch) if frozen else load_or_build(ctx, on_first_batch))
        return loaded[0]

    def dataset(x: np.ndarray, y: np.ndarray, side: np.ndarray | None) -> tf.data.Dataset:
        return tf.data.Dataset.from_tensor_slices(({"features": x, "side": side} if side is not None else x, y))

    def train_iterator():
        c = cache()
        return shuffled_batches(
            ctx, lambda: dataset(c.train_features, c.train_labels, c.train_side), len(c.train_labels)
        )

    def val_dataset():
        c = cache()
        return distribute(ctx, lambda ic: dataset(c.val_features, c.val_labels, c.val_side).batch(cfg.batch_size))

    return PhaseInputs(train_iterator=train_iterator, val_dataset=val_dataset)
