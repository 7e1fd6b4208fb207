"""Small serializable Keras 3 layers the classifier needs (no Lambda layers: they don't reload)."""

from __future__ import annotations

import keras
from keras import ops

from app.data.side_features import input_width


@keras.saving.register_keras_serializable(package="app")
class PixelNormalization(keras.layers.Layer):
    """0..255 RGB → what a backbone was trained on: `(x[, ::-1 if bgr] - mean) / std`."""

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...], bgr: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.mean, self.std, self.bgr = tuple(mean), tuple(std), bgr

    def call(self, images):
        images = ops.cast(images, self.compute_dtype)
        if self.bgr:
            images = ops.flip(images, axis=-1)
        mean = ops.convert_to_tensor(self.mean, dtype=self.compute_dtype)
        std = ops.convert_to_tensor(self.std, dtype=self.compute_dtype)
        return (images - mean) / std

    def get_config(self) -> dict:
        return {**super().get_config(), "mean": self.mean, "std": self.std, "bgr": self.bgr}


@keras.saving.register_keras_serializable(package="app")
class SideFeatureEncoding(keras.layers.Layer):
    """A dataset's stored side features (app/data/side_features.py) → what the model's side
    branch takes: numbers standardised with the training split's mean and std (a missing
    number, NaN, becomes 0: the training mean), categories one-hot (index 0: missing or not seen
    in training; any index out of range counts as that). Inside the model, so serving needs
    nothing but the raw values.

    Its `gate` (a non-trainable weight, 1) multiplies the encoding: a run whose side features do
    not pay closes it (app/training/side_check.py), and the weights files carry that decision to
    phase 2, a resume and the export without changing the model's inputs."""

    def __init__(self, columns: list[dict], **kwargs):
        super().__init__(**kwargs)
        self.columns = [dict(c) for c in columns]
        self.gate = self.add_weight(shape=(), initializer="ones", trainable=False, name="gate", dtype="float32")

    def load_own_variables(self, store) -> None:
        """Weights saved before the layer had its gate hold no variable for it: the gate stays open."""
        if len(store.keys()):
            super().load_own_variables(store)

    def call(self, values):
        values = ops.cast(values, "float32")
        parts = []
        for i, column in enumerate(self.columns):
            x = values[:, i]
            if column["kind"] == "numeric":
                z = (x - column["mean"]) / column["std"]
                parts.append(ops.expand_dims(ops.where(ops.isnan(x), ops.zeros_like(x), z), -1))
            else:
                depth = len(column["vocabulary"]) + 1
                index = ops.cast(ops.where(ops.isnan(x), ops.zeros_like(x), x), "int32")
                index = ops.where((index < 0) | (index >= depth), ops.zeros_like(index), index)
                parts.append(ops.one_hot(index, depth))
        return ops.cast(ops.concatenate(parts, axis=-1) * self.gate, self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_width(self.columns))

    def get_config(self) -> dict:
        return {**super().get_config(), "columns": self.columns}


class OutOfDistributionScore(keras.layers.Layer):
    """[probabilities, pooled features, logits] → the shipped out-of-distribution score per image
    (app.models.ood.ShippedScore, the same arithmetic): the head's standardised part (energy of
    the logits at the run's temperature; 1 - max probability for runs fitted before), the
    standardised class distance of the L2-normalised features (relative Mahalanobis: to the
    nearest class mean, less to the training features' overall mean), weighted, plus the
    gate past the val photos' distances and feature lengths. Its statistics are
    constants of the served model (never trained, never saved by Keras: the export freezes them
    into its graph)."""

    def __init__(self, score, **kwargs):
        super().__init__(dtype="float32", **kwargs)
        self.score = score

    def build(self, input_shape):
        distance = self.score.distance
        self._quadratic = self._constant("quadratic", distance.quadratic)  # [D, D]
        self._linear = self._constant("linear", distance.linear.T)  # [D, C]
        self._offsets = self._constant("offsets", distance.constant)  # [C]

    def _constant(self, name: str, value):
        value = value.astype("float64")
        return self.add_weight(
            name=name, shape=value.shape, initializer=keras.initializers.Constant(value), trainable=False
        )

    def call(self, inputs):
        probabilities, features, logits = (ops.cast(x, "float32") for x in inputs)
        z = features / ops.maximum(ops.norm(features, axis=-1, keepdims=True), 1e-12)
        quadratic = ops.sum(ops.matmul(z, self._quadratic) * z, axis=-1, keepdims=True)
        distance = ops.min(quadratic - 2.0 * ops.matmul(z, self._linear) + self._offsets[None, :], axis=-1)
        s = self.score
        if s.energy_head:  # app.models.ood.energy
            head = -s.temperature * ops.logsumexp(logits / s.temperature, axis=-1)
        else:
            head = 1.0 - ops.max(probabilities, axis=-1)
        z_head, z_distance = (head - s.head_mean) / s.head_std, (distance - s.distance_mean) / s.distance_std
        atypical = z_distance  # app.models.ood.atypicality, then app.models.ood.combined
        if s.norm_std:
            log_norm = ops.log(ops.maximum(ops.norm(features, axis=-1), 1e-12))
            atypical = ops.maximum(z_distance, ops.abs(log_norm - s.norm_mean) / s.norm_std)
        gate = s.gate_weight * ops.maximum(atypical - s.gate_at, 0.0)
        return s.head_weight * z_head + s.distance_weight * z_distance + gate
