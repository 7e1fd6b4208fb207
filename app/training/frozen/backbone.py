"""The one door to what the frozen backbone produces in a run: phase 1's inputs, phase 2's
inputs, the test split's activations and the pooled features of a split.

Phase 2 trains only the top of the backbone. Below its first trained layer nothing trains and
BatchNorm runs on its pretrained statistics, so a given input image has the same activation
there in every epoch: the layers below the cut are a fixed function, as the whole backbone is
in phase 1. So:

- Validation: each val image's activation at the cut is computed once, and each epoch runs only
  the layers above it (`classifier.cut_at_trained`): the same logits, up to float rounding.
- Test: phase 1's gather runs the test photos' eval decode through the frozen layers in the same
  pass (stored by content like the rest), and the test split is read once, by the kept weights,
  through the layers above.
- Training on the views (a warm start, or `phase2_mode = views`): phase 2 trains on the
  activations of the same K augmented views of each training image that phase 1's features come
  from; the gather keeps them as it passes. A cold start trains phase 2 on fresh crops
  (app/training/plan.py), and the views' activations, when kept, serve the "none of these" fit:
  the layers below the cut do not train, so they still hold.
- Training on fresh crops: the layers below the cut are a forward pass that trains nothing, run
  on the host's runtime batch by batch where that may pay (below.py); the layers above train.

What is done is decided once (decide.py) when the door is made; nothing about it changes
during the run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tensorflow as tf

from app.data.pipeline import map_image
from app.inference.host_forward import Choice, HostForward
from app.models.classifier import FrozenCut
from app.training.context import Context
from app.training.frozen.below import below_forward, fresh_activations
from app.training.frozen.decide import Decision, decide
from app.training.frozen.gather import gather, keep_features
from app.training.frozen.passes import eval_images, split_features
from app.training.frozen.rows import ActivationRows, Phase1Features, RowSink
from app.training.inputs import distribute, row_batches, shuffled_batches, train_batches
from app.training.phase import PhaseInputs

log = logging.getLogger(__name__)


class FrozenBackbone:
    def __init__(self, ctx: Context, decision: Decision | None = None) -> None:
        self.ctx = ctx
        self.decision = decision or decide(ctx)
        self._phase1: Phase1Features | None = None  # phase 1's features, once gathered
        self._val: ActivationRows | None = None  # the val photos' activations at the cut
        self._train: ActivationRows | None = None  # the training views' (when kept)
        self._test: ActivationRows | None = None  # the test photos' (when kept)
        self.forward: Choice | None = None  # the runtime of the gather's pass, when it ran one
        self.below: HostForward | None = None  # phase 2's layers below the cut on fresh images, when they run

    @classmethod
    def phase1_only(cls, ctx: Context) -> FrozenBackbone:
        """A door for phase 1's inputs alone, no activations at a cut: a learning-rate sweep."""
        return cls(ctx, decide(ctx, phase2=False))

    @property
    def cut(self) -> FrozenCut | None:
        return self.decision.cut

    @property
    def gathered_phase1(self) -> Phase1Features | None:
        """Phase 1's features where this door gathered them; None otherwise (a resume past phase 1
        does not gather them again for a check)."""
        return self._phase1

    @property
    def phase2_on_activations(self) -> bool:
        """Phase 2 trains only the layers above the cut (`cut.tail`), on activations there."""
        return self.decision.phase2_on_activations

    def phase1_features(self, on_first_batch: Callable[[np.ndarray], None] | None = None) -> Phase1Features:
        """Phase 1's features, gathered (from the store where it has them) in one pass with the
        activations at the cut that the decision keeps; once per door."""
        if self._phase1 is None:
            d = self.decision
            got = gather(self.ctx, on_first_batch, d.cut, d.keeps_views, d.keeps_test, d.rows_on_disk)
            self._phase1, self.forward = got.features, got.forward
            if d.cut is not None:
                self._val, self._train, self._test = got.val_activations, got.train_activations, got.test_activations
                _log_val(d.cut, self._val, "as phase 1's features were gathered")
        return self._phase1

    def phase1_inputs(self, on_first_batch: Callable[[np.ndarray], None] | None = None) -> PhaseInputs:
        """The head's input on cached features: an epoch is as many rows as the training split
        has images, drawn from the K views of each. Gathered when the phase first needs them: a
        finished phase, seen again on resume, needs none."""

        def train_iterator():
            f = self.phase1_features(on_first_batch)
            return shuffled_batches(self.ctx, f.arrays("train"))

        def val_dataset():
            f = self.phase1_features(on_first_batch)
            return distribute(self.ctx, lambda ic: row_batches(f.arrays("val"), self.ctx.batch_size))

        return PhaseInputs(train_iterator=train_iterator, val_dataset=val_dataset)

    def phase2_inputs(self, on_images: PhaseInputs) -> PhaseInputs:
        """Phase 2's input: validation on the activations at the cut where there is one; training
        on the views' activations where the plan says so, on fresh images' activations computed on
        the host's runtime where the decision says so (below.py), else `on_images`."""
        if self.cut is None:
            return on_images
        d = self.decision

        def val_dataset():
            self._gather_for_phase2()
            return self._distributed(self._val)

        def train_iterator():
            self._gather_for_phase2()  # before the first epoch starts, so its log line comes before the epoch's
            if d.below_on_host:
                self.below = below_forward(self.ctx, self.cut, d.plan.epochs)
                log.info("phase 2 runs the layers below %s as a forward pass that trains nothing (%s), and trains"
                         " the layers above", self.cut.layer, self.ctx.cfg.forward_runtime)  # fmt: skip
                return train_batches(
                    self.ctx, 2, lambda images: fresh_activations(self.ctx, self.cut, self.below, images)
                )
            if not d.phase2_on_views:
                return on_images.train_iterator()
            _log_views(self.cut, self._train)
            return shuffled_batches(self.ctx, self._train.arrays())

        return PhaseInputs(train_iterator=train_iterator, val_dataset=val_dataset)

    def test_dataset(self) -> object | None:
        """The test photos' activations at the cut, batched as validation's are; None where the
        gather did not keep them (the test split then runs on images)."""
        return None if self._test is None else self._distributed(self._test)

    def pooled_features(self, split: str, upper_unchanged: bool = False) -> tuple[np.ndarray, np.ndarray, str]:
        """(pooled features, labels, what they are) of the current weights for `split`: from the
        activations at the cut in memory ("train": the views), only the layers above running, and
        kept in the store for a run started from these weights; phase 1's own features where
        `upper_unchanged` (the layers above the cut hold the weights they were gathered with);
        else one pass over the split's photos."""
        rows = self._train if split == "train" else self._val
        named = f"{split} views" if split == "train" else f"{split} photos"
        if self.cut is None or rows is None:
            ctx = self.ctx
            features, labels = split_features(ctx.clf.features_model, ctx.cfg.data, split, ctx.image_size,
                                              ctx.batch_size, ctx.cfg.forward_runtime)  # fmt: skip
            return features, labels, f"{split} photos"
        if upper_unchanged and self._phase1 is not None:  # [:]: read whole where the rows are on disk
            f = self._phase1
            return (f.train_features[:], f.train_labels, named) if split == "train" else (
                f.val_features[:], f.val_labels, named)  # fmt: skip
        features, labels = _upper_features(self.cut, rows, self.ctx.batch_size), rows.labels
        if rows.keys is not None:
            keep_features(self.ctx, self.cut, split, rows.keys, features)
        return features, labels, named

    def release(self) -> None:
        """Let go of every row held (phase 1's features, the activations at the cut): they grow
        with the photos, nothing after the "none of these" fit reads them, and the export that
        follows needs the memory. The decision stays."""
        self._phase1 = self._val = self._train = self._test = None

    def _distributed(self, rows: ActivationRows) -> object:
        batch = self.ctx.batch_size
        return distribute(self.ctx, lambda ic: row_batches(rows.arrays(), batch))

    def _gather_for_phase2(self) -> None:
        """What phase 2 reads, where phase 1 did not gather it in this process (a resumed run):
        the views from the store (or computed again, the same), else the val activations alone."""
        if self._val is not None and (self._train is not None or not self.decision.phase2_on_views):
            return
        if self.decision.phase2_on_views:
            self.phase1_features()
            return
        start = time.perf_counter()
        count, on_disk = self.ctx.info.num_examples("val"), self.decision.rows_on_disk
        self._val = _activations(self.cut, eval_images(self.ctx, "val"), count, on_disk)
        _log_val(self.cut, self._val, f"as phase 2 started ({time.perf_counter() - start:.1f}s)")


def _upper_features(cut: FrozenCut, rows: ActivationRows, batch_size: int) -> np.ndarray:
    """The pooled features the layers above the cut give the rows' activations, each batch put
    in place as it comes: never the batches and a concatenation of them at once."""
    spec = tf.TensorSpec([None, *rows.activations.shape[1:]], tf.float32)  # traced once: the last batch is smaller
    upper = tf.function(lambda x: tf.cast(cut.upper(x, training=False), tf.float32), input_signature=[spec],
                        autograph=False)  # fmt: skip
    sink = RowSink(len(rows.labels))
    for batch in row_batches(rows.activations, batch_size):
        sink.add(upper(batch).numpy())
    return sink.done(empty=np.zeros([0, cut.upper.output.shape[-1]], np.float32))


def _activations(cut: FrozenCut, images: tf.data.Dataset, count: int, on_disk: Path | None) -> ActivationRows:
    """Every image's activation at the cut (with its side features and label), in dataset order
    (at most `count`), each batch put in place as it comes: in a file in `on_disk` where given."""
    spec = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), images.element_spec[0])
    lower = tf.function(lambda inputs: map_image(inputs, lambda x: cut.lower(x, training=False)),
                        input_signature=[spec], autograph=False)  # fmt: skip
    sink, sides, labels = RowSink(count, on_disk), [], []
    for inputs, y in images:
        outputs = lower(inputs)
        sink.add((outputs["image"] if isinstance(outputs, dict) else outputs).numpy().astype(np.float32))
        sides += [inputs["side"].numpy()] if isinstance(inputs, dict) else []
        labels.append(y.numpy().astype(np.int32))
    side = np.concatenate(sides) if sides else None
    return ActivationRows(sink.done(), side, np.concatenate(labels) if labels else np.zeros([0], np.int32))


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
    """Said as phase 2 starts on the views, not when the gather kept them: the plan may pick images."""
    log.info(
        "phase 2 trains from %s too, on phase 1's cached views: %d activations (%.1f MB), one per view of"
        " each training image",
        cut.layer,
        len(train.labels),
        train.activations.nbytes / 1e6,
    )
