"""Phase 2's input from where its trained layers begin: activations computed once below the cut.

Phase 2 trains only the top of the backbone. Below its first trained layer nothing trains and
BatchNorm runs on its pretrained statistics, so a given input image has the same activation
there in every epoch: the layers below the cut are a fixed function, as the whole backbone is
in phase 1. So:

- Validation: each val image's activation at the cut is computed once, and each epoch runs only
  the layers above it (`classifier.cut_at_trained`): the same logits, up to float rounding.
- Test: phase 1's cache build runs the test photos' eval decode through the frozen layers in the
  same pass (stored by content like the rest), and the test split is read once, by the kept
  weights, through the layers above: the same logits, without a pass over its photos after
  training, and none at all for photos the store holds.
- Training (`phase2_mode` views, when phase 1 trains on cached features): phase 2 trains on the
  activations of the same K augmented views of each training image that phase 1's cache holds,
  instead of decoding, augmenting and running every photo through the frozen layers again in
  every epoch. Phase 1's cache build runs each view through the backbone anyway; it keeps the
  activation at the cut as it passes, so the views cost phase 2 nothing. The trade is phase 1's:
  K fixed views instead of a fresh crop per epoch, which app/training/plan.py decides against
  for a cold start (`train_on_images`: phase 2 on fresh crops, the views kept for the
  out-of-distribution fit).

MobileNetV2 at 224 with the default blocks:4 cuts at block_12_add (14x14x96, 74 KB per image):
the layers above take about a seventh of the whole backbone's time (0.7 ms against 4.9 ms per
photo in batches of 32 on 2 cores). The activations are held in
memory, float32, and in the feature store (feature_store.py) by photo content: a resumed run
that did not build the cache reads them back from there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from app.data.pipeline import map_image
from app.models.classifier import FrozenCut, cut_at_trained, unfreeze_start
from app.training.context import FEATURE_CACHE_LIMIT, Context
from app.training.feature_cache import ActivationRows, FeatureCache, gather, keep_features
from app.training.passes import distribute, eval_images, model_outputs, shuffled_batches, views
from app.training.phase import PhaseInputs
from app.training.strategy import num_workers

log = logging.getLogger(__name__)


class FrozenActivations:
    """Phase 2's input from its cut, when `cut` is not None: validation always, training too
    when `trains`. Phase 1's feature cache runs every image through the backbone anyway; as it
    is built, it hands the activations over (`keep`), and phase 2 then computes nothing.
    Otherwise (phase 1 on images, or its cache read back from the run dir) phase 2 computes them
    as it starts."""

    def __init__(
        self, ctx: Context, cut: FrozenCut | None, trains: bool = False, no_views: str = "", tests: bool = False
    ) -> None:
        self.ctx, self.cut, self.trains = ctx, cut, trains and cut is not None
        self.tests = tests and cut is not None  # phase 1's cache build also gathers the test photos' activations
        self._no_views = no_views or "no single activation separates phase 2's frozen layers from its trained ones"
        self._val: ActivationRows | None = None
        self._train: ActivationRows | None = None
        self.test: ActivationRows | None = None  # the test photos' activations at the cut, once gathered
        self._phase1: FeatureCache | None = None  # phase 1's pooled features, when this object built them

    @property
    def no_views(self) -> str | None:
        """None when phase 2 can train on phase 1's views, else why it cannot."""
        return self._no_views if not self.trains else None

    def pooled_features(self, split: str, upper_unchanged: bool = False) -> tuple[np.ndarray, np.ndarray] | None:
        """(pooled features, labels) of the current weights for `split`, from the activations at
        the cut that phase 2 used ("train": its views of the training images; "val"); None where
        they are not in memory. `upper_unchanged`: the layers above the cut hold the weights phase
        1's cache was built with (phase 2 did not run, or kept none of its epochs), so that cache
        holds these rows' features and no layer runs (1.3 s of a 29 s warm-started flowers17 run);
        otherwise the layers above the cut run, and what they give goes to the feature store
        (`keep_features`: a run started from these weights reads it)."""
        rows = self._train if split == "train" else self._val
        if self.cut is None or rows is None:
            return None
        if upper_unchanged and self._phase1 is not None:  # the same rows' features, computed as the cache was built
            cache = self._phase1
            return (
                (cache.train_features, cache.train_labels)
                if split == "train"
                else (cache.val_features, cache.val_labels)
            )
        batches = tf.data.Dataset.from_tensor_slices((rows.activations, rows.labels)).batch(self.ctx.cfg.batch_size)
        upper = self.cut.upper
        pooled = model_outputs(lambda activations, labels: upper(activations, training=False), batches)
        if rows.keys is not None:  # a cut means one worker, the chief
            keep_features(self.ctx, self.cut, split, rows.keys, pooled[0])
        return pooled

    def train_on_images(self) -> None:
        """Phase 2's plan chose images: it trains on fresh crops. The views' activations stay for
        the out-of-distribution fit after it (`pooled_features`): the layers below the cut do not
        train, so they still hold, where a pass over every training photo took 8 s of a 60 s
        flowers17 run. They were within the memory phase 1's cache may take."""
        self.trains = False

    def phase1_features(self, on_first_batch: Callable[[np.ndarray], None] | None = None) -> FeatureCache:
        """Phase 1's feature cache, gathered in one pass with the activations at the cut that
        phase 2 takes (kept here): the val photos', and the views' too when phase 2 trains on them."""
        got = gather(self.ctx, on_first_batch, self.cut, self.trains, self.tests)
        self._phase1 = got.cache
        if self.cut is not None:
            self.keep(got.val_activations, got.train_activations)
            self.test = got.test_activations
        return got.cache

    def keep(self, val: ActivationRows, train: ActivationRows | None) -> None:
        """The activations from phase 1's cache build: `train` is None unless `trains`."""
        self._val, self._train = val, train
        _log_val(self.cut, val, "as phase 1's feature cache was built")

    def inputs(self, inputs: PhaseInputs) -> PhaseInputs:
        """`inputs` with validation (and, when `trains`, training) on the activations at the cut,
        computed when the phase first needs its input: a finished phase, seen again on resume,
        never computes them."""
        if self.cut is None:
            return inputs

        def val_dataset():
            self._compute_missing()
            return self._distributed(self._val)

        def train_iterator():
            self._compute_missing()  # before the first epoch starts, so its log line comes before the epoch's
            if not self.trains:
                return inputs.train_iterator()
            _log_views(self.cut, self._train)
            return shuffled_batches(self.ctx, self._train.dataset, len(self._train.labels))

        return PhaseInputs(train_iterator=train_iterator, val_dataset=val_dataset)

    def test_dataset(self) -> object | None:
        """The test photos' activations at the cut, batched and distributed as validation's are;
        None where phase 1's cache build did not gather them."""
        return None if self.test is None else self._distributed(self.test)

    def _distributed(self, rows: ActivationRows) -> object:
        batch = self.ctx.cfg.batch_size
        return distribute(self.ctx, lambda ic: rows.dataset().batch(batch))

    def _compute_missing(self) -> None:
        if self._val is not None and (self._train is not None or not self.trains):
            return
        if self.trains:  # phase 1's views: from the feature store (or computed again, the same)
            self.phase1_features()
            return
        start = time.perf_counter()
        self._val = _activations(self.cut, eval_images(self.ctx, "val"))
        _log_val(self.cut, self._val, f"as phase 2 started ({time.perf_counter() - start:.1f}s)")


def frozen_activations(ctx: Context) -> FrozenActivations:
    """Phase 2's cut where working from it is possible and worth it (else `cut` is None): one
    worker (several would each hold every activation), a single tensor at the cut, and the
    activations within the memory `cache_features = auto` allows phase 1's cache. Training from
    it too (`trains`) when phase 1 trains on cached views and `phase2_mode` is not images."""
    if num_workers(ctx.strategy) > 1 or not ctx.info.num_examples("val") or not ctx.cfg.epochs_finetune:
        return FrozenActivations(ctx, None, no_views="several workers" if ctx.info.num_examples("val") else "no val")
    start = unfreeze_start(ctx.clf, ctx.cfg.unfreeze)
    cut = cut_at_trained(ctx.clf, start)
    if cut is None:
        why = (
            "it trains the whole backbone"
            if start <= 1
            else "no single activation separates its frozen layers from the trained ones"
        )
        log.info("phase 2 validates on images: %s", why)
        return FrozenActivations(ctx, None, no_views=why)
    val_bytes, train_bytes = _bytes(ctx, cut, "val"), _bytes(ctx, cut, "train") * views(ctx)
    if val_bytes > FEATURE_CACHE_LIMIT:
        why = f"the val activations at {cut.layer} would take {val_bytes / 2**30:.1f} GiB"
        log.info("phase 2 validates on images: %s", why)
        return FrozenActivations(ctx, None, no_views=why)
    trains, why = _trains(ctx, val_bytes + train_bytes)
    test_bytes = _bytes(ctx, cut, "test")
    tests = 0 < test_bytes <= FEATURE_CACHE_LIMIT - val_bytes - (train_bytes if trains else 0)
    return FrozenActivations(ctx, cut, trains, no_views=why, tests=tests)


def _trains(ctx: Context, total_bytes: int) -> tuple[bool, str]:
    if not ctx.cached_phase1:
        return False, "phase 1 trained on images, so there are no cached views (cache_features)"
    if ctx.cfg.phase2_mode == "images":
        return False, "phase2_mode = images"
    if total_bytes > FEATURE_CACHE_LIMIT:
        return False, (
            f"the views' activations would take {total_bytes / 2**30:.1f} GiB"
            f" (more than {FEATURE_CACHE_LIMIT / 2**30:.0f} GiB)"
        )
    return True, ""


def _bytes(ctx: Context, cut: FrozenCut, part: str) -> int:
    return ctx.info.num_examples(part) * int(np.prod(cut.lower.output.shape[1:])) * 4


def _activations(cut: FrozenCut, images: tf.data.Dataset) -> ActivationRows:
    """Every image's activation at the cut (with its side features and label), in dataset order."""
    outputs, labels = model_outputs(
        lambda inputs, labels: map_image(inputs, lambda x: cut.lower(x, training=False)), images
    )
    x, side = (outputs["image"], outputs["side"]) if isinstance(outputs, dict) else (outputs, None)
    return ActivationRows(x, side, labels)


def _log_val(cut: FrozenCut, val: ActivationRows, when: str) -> None:
    log.info(
        "phase 2 validates from %s: the layers below it are frozen, so the %d val images' activations there"
        " (%.1f MB) were computed once, %s; each epoch runs only the layers above",
        cut.layer,
        len(val.labels),
        val.activations.nbytes / 1e6,
        when,
    )


def _log_views(cut: FrozenCut, train: ActivationRows) -> None:
    """Said as phase 2 starts on the views, not when the cache kept them: the plan may pick images."""
    log.info(
        "phase 2 trains from %s too, on phase 1's cached views: %d activations (%.1f MB), one per view of"
        " each training image",
        cut.layer,
        len(train.labels),
        train.activations.nbytes / 1e6,
    )
