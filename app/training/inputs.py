"""What each phase reads: decoded, augmented images, or backbone features computed once.

Every dataset is built per replica by `distribute_datasets_from_function`, so the same code
serves one device, several GPUs and several workers.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

from app.data.pipeline import make_eval_dataset, make_train_dataset
from app.data.preprocess import Augment
from app.data.service import job_name as service_job_name
from app.training.context import Context
from app.training.phase import PhaseInputs

log = logging.getLogger(__name__)


def distribute(ctx: Context, make) -> object:
    """make(input_context) → per-replica dataset; sharded per worker by TensorFlow's input contexts."""
    return ctx.strategy.distribute_datasets_from_function(make)


def augmentation(ctx: Context) -> Augment:
    return Augment(color_jitter=ctx.cfg.color_jitter) if ctx.cfg.augment else Augment.off()


def eval_dataset(ctx: Context, split: str) -> object:
    """Unaugmented batches of `split`, always decoded on this machine (small next to train)."""
    return distribute(ctx, lambda ic: make_eval_dataset(
        ctx.cfg.data, split=split, image_size=ctx.image_size, batch_size=ctx.cfg.batch_size, input_context=ic))


def image_inputs(ctx: Context, phase: int) -> PhaseInputs:
    """Training input decoded here, or on the tf.data service with `data_service`."""
    cfg = ctx.cfg
    job = service_job_name(str(Path(cfg.out).resolve()), phase) if cfg.data_service else None

    def train_iterator():
        return iter(distribute(ctx, lambda ic: make_train_dataset(
            cfg.data, image_size=ctx.image_size, batch_size=cfg.batch_size, augment=augmentation(ctx), seed=cfg.seed,
            repeat=True, input_context=ic, data_service=cfg.data_service or None, service_job=job,
        )))

    return PhaseInputs(train_iterator=train_iterator, val_dataset=lambda: eval_dataset(ctx, "val"))


def augmented_sample(ctx: Context, count: int = 8) -> np.ndarray:
    """A few training images exactly as the pipeline hands them to the model (for TensorBoard)."""
    ds = make_train_dataset(ctx.cfg.data, image_size=ctx.image_size, batch_size=count, augment=augmentation(ctx),
                            seed=ctx.cfg.seed, shuffle_buffer=count)
    images, _ = next(iter(ds))
    return images.numpy()


def feature_inputs(ctx: Context) -> PhaseInputs:
    """Cached-features mode: backbone features computed once per split, then only the head trains."""
    cfg, cache = ctx.cfg, {}
    extract = tf.function(lambda images: ctx.clf.features_model(images, training=False), reduce_retracing=True)

    def features(split: str) -> tuple[np.ndarray, np.ndarray]:
        if split not in cache:
            start = time.perf_counter()
            feats, labels = [], []
            for images, y in make_eval_dataset(cfg.data, split=split, image_size=ctx.image_size, batch_size=cfg.batch_size):
                feats.append(extract(images).numpy())
                labels.append(y.numpy())
            cache[split] = (np.concatenate(feats), np.concatenate(labels))
            log.info("cached %s features %s in %.1fs", split, cache[split][0].shape, time.perf_counter() - start)
        return cache[split]

    def train_iterator():
        x, y = features("train")
        return iter(distribute(ctx, lambda ic: tf.data.Dataset.from_tensor_slices((x, y))
                               .shuffle(len(x), seed=cfg.seed).repeat().batch(cfg.batch_size, drop_remainder=True)))

    def val_dataset():
        x, y = features("val")
        return distribute(ctx, lambda ic: tf.data.Dataset.from_tensor_slices((x, y)).batch(cfg.batch_size))

    return PhaseInputs(train_iterator=train_iterator, val_dataset=val_dataset)
