"""Small serializable Keras 3 layers the classifier needs (no Lambda layers: they don't reload)."""

from __future__ import annotations

import keras
from keras import ops


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
