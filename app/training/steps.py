"""Compiled train and eval steps: `strategy.run` over distributed datasets, for every strategy.

Keras 3's `model.fit` fails under MultiWorkerMirroredStrategy (keras-team/keras#20585), so
training does not use it anywhere: the same custom step serves one CPU, several GPUs and
several workers. A multi-label dataset's labels are multi-hot float vectors: the loss is then
binary cross-entropy, "correct" means every label right at 0.5 (exact match), and the
confusion matrix is one 2x2 per label. Images arrive as uint8; the step casts them, and in
training applies the colour jitter, on the device (the model normalises them). Each replica
returns sums (loss, correct, count; evaluation adds the confusion matrix) that are reduced
across replicas, so metrics are exact whatever the replica count.
"""

from __future__ import annotations

from dataclasses import dataclass

import keras
import numpy as np
import tensorflow as tf

from app.data.pipeline import map_image
from app.data.preprocess import color_jitter
from app.evaluation.metrics import wilson_interval


@dataclass(frozen=True)
class Evaluation:
    loss: float
    accuracy: float
    count: int
    confusion_matrix: np.ndarray  # counts[true, predicted]; multi-label: [label, true, predicted], each 0/1
    logits: np.ndarray | None = None  # [count, C] float32: every example, gathered from all replicas batch by batch
    labels: np.ndarray | None = None  # [count] class ids, or [count, C] multi-hot

    def summary(self) -> dict:
        """What metrics.json records of a split: a single-label accuracy with its 95% interval."""
        found = {"loss": self.loss, "accuracy": self.accuracy, "count": self.count}
        if self.confusion_matrix.ndim == 2:
            found["accuracy_interval"] = list(wilson_interval(round(self.accuracy * self.count), self.count))
        return found


class CompiledSteps:
    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        model: keras.Model,  # inputs → logits
        optimizer: keras.optimizers.Optimizer | None,  # None: evaluation only
        *,
        num_classes: int,
        global_batch_size: int,  # the loss is averaged over the global batch, whatever the replica count
        label_smoothing: float = 0.0,
        class_weights: list[float] | None = None,
        color_jitter: float = 0.0,  # strength of the colour jitter applied to training images; 0 = off
        seed: int = 0,  # with the replica and the optimizer's step count, seeds the jitter: resumable, no state
        jit_compile: bool = False,  # XLA-compile each replica's train step
        multi_label: bool = False,  # sigmoid outputs, multi-hot labels; class_weights then weigh each label's positives
    ) -> None:
        self.strategy, self.model, self.optimizer = strategy, model, optimizer
        self.multi_label = multi_label
        self.num_classes, self.global_batch_size = num_classes, global_batch_size
        self.label_smoothing = label_smoothing
        self.class_weights = None if class_weights is None else tf.constant(class_weights, tf.float32)
        self.color_jitter, self.seed = color_jitter, seed
        self._replica_step = tf.function(self._replica_train, jit_compile=True) if jit_compile else self._replica_train
        self._train = tf.function(self._train_steps, autograph=False)
        self._eval_step = None  # traced on the first evaluation, for its dataset's element spec

    def evaluating(self, model: keras.Model) -> CompiledSteps:
        """Evaluation of `model` with these steps' loss (label smoothing included), so that its
        val_loss compares with theirs: phase 2 validates its tail on cached activations."""
        weights = None if self.class_weights is None else self.class_weights.numpy().tolist()
        return CompiledSteps(
            self.strategy,
            model,
            None,
            num_classes=self.num_classes,
            global_batch_size=self.global_batch_size,
            label_smoothing=self.label_smoothing,
            class_weights=weights,
            multi_label=self.multi_label,
        )

    def _per_example_loss(self, labels: tf.Tensor, logits: tf.Tensor, weighted: bool = False) -> tf.Tensor:
        logits = tf.cast(logits, tf.float32)
        if self.multi_label:  # per label: smoothed towards 0.5; positives weighed by class_weights (training)
            targets = tf.cast(labels, tf.float32) * (1 - self.label_smoothing) + 0.5 * self.label_smoothing
            pos_weight = self.class_weights if weighted and self.class_weights is not None else 1.0
            return tf.reduce_mean(tf.nn.weighted_cross_entropy_with_logits(targets, logits, pos_weight), axis=-1)
        one_hot = tf.one_hot(labels, self.num_classes)
        per_example = keras.losses.categorical_crossentropy(
            one_hot, logits, from_logits=True, label_smoothing=self.label_smoothing
        )
        return (
            per_example * tf.gather(self.class_weights, labels)
            if weighted and self.class_weights is not None
            else per_example
        )

    def _correct(self, labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
        """Per example: the top class is right, or (multi-label) every label is right at 0.5."""
        if self.multi_label:
            return tf.reduce_all(tf.equal(logits > 0, tf.cast(labels, tf.float32) > 0.5), axis=-1)
        return tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels)

    def _sums(self, labels: tf.Tensor, logits: tf.Tensor, per_example: tf.Tensor) -> tf.Tensor:
        correct = tf.reduce_sum(tf.cast(self._correct(labels, logits), tf.float32))
        return tf.stack([tf.reduce_sum(per_example), correct, tf.cast(tf.shape(labels)[0], tf.float32)])

    def _confusion(self, labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
        """Flattened counts[true, predicted] (C x C), or per label counts[label, true, predicted] (C x 2 x 2)."""
        if not self.multi_label:
            predicted = tf.argmax(logits, -1, output_type=tf.int32)
            return tf.reshape(tf.math.confusion_matrix(labels, predicted, self.num_classes, dtype=tf.float32), [-1])
        true, predicted = tf.cast(tf.cast(labels, tf.float32) > 0.5, tf.float32), tf.cast(logits > 0, tf.float32)
        cells = [tf.reduce_sum(t * p, axis=0) for t in (1 - true, true) for p in (1 - predicted, predicted)]
        return tf.reshape(tf.stack(cells, axis=-1), [-1])  # per label: [t0p0, t0p1, t1p0, t1p1]

    @property
    def confusion_shape(self) -> tuple[int, ...]:
        return (self.num_classes, 2, 2) if self.multi_label else (self.num_classes, self.num_classes)

    def _jitter_seed(self) -> tf.Tensor:
        """A different stateless seed for every replica and step, the same again on resume."""
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        step = tf.cast(tf.convert_to_tensor(self.optimizer.iterations), tf.int32)
        base = tf.random.experimental.stateless_fold_in(tf.constant([self.seed, 0]), replica)
        return tf.random.experimental.stateless_fold_in(base, step)

    def _train_inputs(self, inputs):
        """uint8 images → float32, colour-jittered; cached and side features pass through."""
        return map_image(inputs, self._train_images)

    def _train_images(self, images: tf.Tensor) -> tf.Tensor:
        if not images.dtype.is_integer:
            return images
        if self.color_jitter > 0:
            return color_jitter(images, self._jitter_seed(), self.color_jitter)
        return tf.cast(images, tf.float32)

    def _replica_train(self, inputs, labels: tf.Tensor) -> tf.Tensor:
        variables = self.model.trainable_variables
        inputs = self._train_inputs(inputs)
        with tf.GradientTape() as tape:
            logits = self.model(inputs, training=True)
            per_example = self._per_example_loss(labels, logits)
            weighted = (
                self._per_example_loss(labels, logits, weighted=True) if self.class_weights is not None else per_example
            )
            loss = tf.nn.compute_average_loss(weighted, global_batch_size=self.global_batch_size)
            if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
                loss = self.optimizer.scale_loss(loss)
        gradients = tape.gradient(loss, variables)
        self.optimizer.apply_gradients(zip(gradients, variables))
        return self._sums(labels, logits, per_example)

    def _train_steps(self, iterator, num_steps: tf.Tensor) -> tf.Tensor:
        """`num_steps` steps in one call (steps_per_execution): fewer Python round trips. The
        loop is TF's own, so the step is traced without AutoGraph (whose rewrite of this and
        every function the step calls buys nothing here)."""

        def step(done: tf.Tensor, totals: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            inputs, labels = next(iterator)
            per_replica = self.strategy.run(self._replica_step, args=(inputs, labels))
            return done + 1, totals + self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

        _, totals = tf.while_loop(lambda done, _: done < num_steps, step, (tf.constant(0), tf.zeros([3])))
        return totals

    def _replica_eval(self, inputs, labels: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        def outputs() -> tuple[tf.Tensor, tf.Tensor]:
            logits = self.model(map_image(inputs, lambda images: tf.cast(images, tf.float32)), training=False)
            sums = tf.concat(
                [self._sums(labels, logits, self._per_example_loss(labels, logits)), self._confusion(labels, logits)],
                axis=0,
            )
            return sums, tf.cast(logits, tf.float32)

        # A replica whose data ran out gets an empty batch; the model is not run on it (some
        # CPU kernels mis-shape empty batches), it just contributes zeros to the sums.
        sums, logits = tf.cond(
            tf.shape(labels)[0] > 0, outputs, lambda: (tf.zeros([self._eval_size]), tf.zeros([0, self.num_classes]))
        )
        return sums, logits, labels

    @property
    def _eval_size(self) -> int:
        return 3 + int(np.prod(self.confusion_shape))

    def _eval_batch(self, inputs: tf.Tensor, labels: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """(summed metrics, logits, labels) of one global batch, gathered from every replica."""
        sums, logits, labels = self.strategy.run(self._replica_eval, args=(inputs, labels))
        return (
            self.strategy.reduce(tf.distribute.ReduceOp.SUM, sums, axis=None),
            self.strategy.gather(logits, axis=0),
            self.strategy.gather(labels, axis=0),
        )

    def _eval_all(self, dataset) -> tuple[tf.Tensor, list[tf.Tensor], list[tf.Tensor]]:
        """One compiled call per batch, from a Python loop: the same pass as a `for` loop inside
        a tf.function was slower on a CPU (the model inside a graph while-loop). Traced
        once, for the dataset's element spec (a smaller last batch does not retrace). Workers
        whose shard runs out first get empty batches from the distributed iterator until every
        worker is done, so the per-step all-reduce never waits for a worker that has stopped
        (uneven shards under multi-worker training)."""
        if self._eval_step is None:
            self._eval_step = tf.function(
                self._eval_batch, input_signature=list(dataset.element_spec), autograph=False
            )  # tf.cond as written; AutoGraph's rewrite buys nothing
        totals, logits, labels = tf.zeros([self._eval_size]), [], []
        for inputs, y in dataset:
            sums, batch_logits, batch_labels = self._eval_step(inputs, y)
            totals += sums
            logits.append(batch_logits)
            labels.append(batch_labels)
        return totals, logits, labels

    def train(self, iterator, num_steps: int) -> tf.Tensor:
        return self._train(iterator, tf.constant(num_steps))

    def evaluate(self, dataset) -> Evaluation:
        """Mean loss, accuracy and the confusion matrix over a finite distributed dataset, with
        every example's logits and label (from all replicas and workers)."""
        totals, logits, labels = self._eval_all(dataset)
        totals = totals.numpy()
        loss_sum, correct, count = (float(v) for v in totals[:3])
        confusion = totals[3:].reshape(self.confusion_shape).round().astype(np.int64)
        logits = tf.concat(logits, 0).numpy() if logits else np.zeros((0, self.num_classes), np.float32)
        labels = tf.concat(labels, 0).numpy() if labels else np.zeros((0,), np.int32)
        if count == 0:
            return Evaluation(float("nan"), float("nan"), 0, confusion, logits, labels)
        return Evaluation(loss_sum / count, correct / count, int(count), confusion, logits, labels)
