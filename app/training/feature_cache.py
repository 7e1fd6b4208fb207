"""Backbone features for phase 1, computed once and kept in the run dir.

Phase 1 trains only the head on a frozen backbone, so the backbone's output for a given input
image never changes. Computing it once for each of K augmented views of every training image
(random-resized crop, flip, colour jitter: the training pipeline's own augmentation) costs K
forward passes per image in all, where training on images costs one per image per epoch. The
validation split is computed once, unaugmented.

The cache (RUN_DIR/feature_cache.npz, float32) is keyed by everything that decides the features:
the dataset (dataset.json's hash), backbone, weights, image size, augmentation, K and seed. A
resumed run reuses it; a run whose key differs rebuilds it. On disk and in memory it takes
K x N x D x 4 bytes (MobileNetV2: D = 1280; 10,000 images x 4 views ≈ 200 MB); float16 would
halve that but flushes the tiny activations of a randomly initialised backbone to 0.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf
from tqdm import tqdm

from app import storage
from app.data.pipeline import dataset_fingerprint
from app.data.preprocess import EVAL_DECODE
from app.training.context import Context
from app.training.frozen_activations import ActivationRows, FrozenActivations
from app.training.passes import eval_images, model_outputs, one_stream, training_views, views

if TYPE_CHECKING:
    from app.models.classifier import FrozenCut

log = logging.getLogger(__name__)
CACHE_VERSION = 2  # bump when what is stored changes


@dataclass(frozen=True)
class FeatureCache:
    train_features: np.ndarray  # [K * N, D] float32: K views of each training image
    train_labels: np.ndarray  # [K * N] int32
    val_features: np.ndarray  # [M, D] float32
    val_labels: np.ndarray  # [M] int32
    train_side: np.ndarray | None = None  # [K * N, F] the side features of each row, when the dataset has them
    val_side: np.ndarray | None = None  # [M, F]

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: value for name, value in self.__dict__.items() if value is not None}


def weights_fingerprint(model) -> str:
    """sha256 of the backbone's weight values: the same file replaced in place is a change too."""
    digest = hashlib.sha256()
    for weight in model.weights:
        digest.update(np.ascontiguousarray(weight.numpy()).tobytes())
    return digest.hexdigest()


def cache_key(ctx: Context) -> dict:
    cfg = ctx.cfg
    return {
        "version": CACHE_VERSION,
        "decode": EVAL_DECODE,
        "dataset": dataset_fingerprint(cfg.data),
        "backbone": ctx.clf.spec.name,
        "weights": weights_fingerprint(ctx.clf.backbone),
        "image_size": ctx.image_size,
        "augment": repr(ctx.augmentation),
        "views": views(ctx),
        "seed": cfg.seed,
    }


def load_or_compute(
    path: Path, key: dict, compute: Callable[[], dict[str, np.ndarray]], what: str
) -> dict[str, np.ndarray]:
    """Arrays stored in `path` (npz) with the `key` they were computed for: reused when the key
    matches, recomputed (and stored atomically) when it does not. Phase 1 and the audit use it."""
    if path.exists():
        with np.load(path) as stored:
            if json.loads(str(stored["key"])) == key:
                log.info("%s: reusing %s", what, path)
                return {name: stored[name] for name in stored.files if name != "key"}
        log.info("%s: %s was made for other data or settings; recomputing it", what, path)
    arrays = compute()
    with storage.atomic_path(path) as tmp:
        np.savez(tmp, key=json.dumps(key), **arrays)
    return arrays


def load_or_build(
    ctx: Context, on_first_batch: Callable[[np.ndarray], None] | None = None, frozen: FrozenActivations | None = None
) -> FeatureCache:
    """`on_first_batch` sees the first training batch's images (float32 0..255) as the backbone
    gets them, when the cache is built rather than loaded: a sample at no extra cost. So does
    `frozen` (phase 2's input) the activations at its cut: the val photos', and the training
    views' too when phase 2 trains on them."""
    arrays = load_or_compute(
        ctx.run.feature_cache,
        cache_key(ctx),
        lambda: _build(ctx, on_first_batch, frozen).arrays(),
        "phase 1 feature cache",
    )
    return FeatureCache(**arrays)


def _build(
    ctx: Context, on_first_batch: Callable[[np.ndarray], None] | None = None, frozen: FrozenActivations | None = None
) -> FeatureCache:
    k = views(ctx)
    total = k * ctx.info.num_examples("train") + ctx.info.num_examples("val")
    start = time.perf_counter()
    train = training_views(ctx)
    cut = frozen.cut if frozen is not None else None
    extract = _extractor(ctx, cut, val_part=len(train) if cut and not frozen.trains else None)
    with tqdm(total=total, unit="img", desc=f"Caching features ({k} view(s) of train, val)", dynamic_ncols=True) as bar:
        stream = one_stream([*train, eval_images(ctx, "val")])
        outputs, (labels, part) = model_outputs(extract, stream, bar, on_first_batch)
    features = outputs["features"] if cut else outputs
    is_val = part == len(train)
    log.info(
        "phase 1: cached %d train and %d val features in %.1fs",
        int((~is_val).sum()),
        int(is_val.sum()),
        time.perf_counter() - start,
    )
    cache = _split_side(ctx, features[~is_val], labels[~is_val], features[is_val], labels[is_val])
    if cut:
        _hand_over(frozen, outputs["activations"], cache, is_val)
    return cache


def _hand_over(frozen: FrozenActivations, activations: np.ndarray, cache: FeatureCache, is_val: np.ndarray) -> None:
    """Phase 2's activations at its cut, from the pass that made the cache: the val part's (all
    that `_extractor` kept, unless phase 2 trains on the views too: then every row's)."""
    val = activations[is_val] if frozen.trains else activations
    train = ActivationRows(activations[~is_val], cache.train_side, cache.train_labels) if frozen.trains else None
    frozen.keep(ActivationRows(val, cache.val_side, cache.val_labels), train)


def _extractor(ctx: Context, cut: FrozenCut | None, val_part: int | None) -> Callable:
    """One batch's pooled features (with side columns); with phase 2's `cut`, computed through
    its cut, and a dict that also holds the activations at the cut: of every batch, or with
    `val_part` of that part's batches only (none for the others). One pass gives both, and one
    model is traced, not two."""
    if cut is None:
        return lambda inputs, labels: _with_side(inputs, ctx.clf.features_model(_images(inputs), training=False))
    none = tf.zeros([0, *cut.lower.output.shape[1:]], cut.lower.output.dtype)

    def extract(inputs, labels_and_part) -> dict[str, tf.Tensor]:
        activations = cut.lower(_images(inputs), training=False)
        features = _with_side(inputs, cut.upper(activations, training=False))
        if val_part is not None:
            activations = tf.cond(labels_and_part[1][0] == val_part, lambda: activations, lambda: none)
        return {"features": features, "activations": activations}

    return extract


def _images(inputs) -> tf.Tensor:
    return inputs["image"] if isinstance(inputs, dict) else inputs


def _with_side(inputs, pooled: tf.Tensor) -> tf.Tensor:
    """Pooled features with the side features (if any) appended as further columns, so one pass
    over the data yields both."""
    pooled = tf.cast(pooled, tf.float32)
    return tf.concat([pooled, inputs["side"]], axis=-1) if isinstance(inputs, dict) else pooled


def _split_side(
    ctx: Context, train: np.ndarray, train_labels: np.ndarray, val: np.ndarray, val_labels: np.ndarray
) -> FeatureCache:
    if not ctx.info.side_width:
        return FeatureCache(train, train_labels, val, val_labels)
    d = train.shape[1] - ctx.info.side_width
    return FeatureCache(train[:, :d], train_labels, val[:, :d], val_labels, train[:, d:], val[:, d:])
