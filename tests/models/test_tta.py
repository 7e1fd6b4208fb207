"""Test-time augmentation: the mirror-averaged probabilities, in the graph and around a runtime."""

from __future__ import annotations

import json
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from app.export.saved_model import export_saved_model
from app.models.tta import with_tta


def _asymmetric_model() -> keras.Model:
    """Scores depend on where the bright pixels are, so a mirror changes the answer."""
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Flatten()(keras.layers.Rescaling(1 / 255)(inputs))
    dense = keras.layers.Dense(2, activation="softmax")
    model = keras.Model(inputs, dense(x))
    weights = np.random.default_rng(0).normal(0, 0.5, (8 * 8 * 3, 2)).astype(np.float32)
    dense.set_weights([weights, np.zeros(2, np.float32)])
    return model


def test_flip_averages_the_image_and_its_mirror_and_leaves_symmetric_images_alone():
    model = _asymmetric_model()
    rng = np.random.default_rng(1)
    images = rng.uniform(0, 255, (4, 8, 8, 3)).astype(np.float32)
    plain, mirrored = model(images).numpy(), model(images[:, :, ::-1].copy()).numpy()
    np.testing.assert_allclose(
        with_tta(lambda x: model(np.ascontiguousarray(x)).numpy(), images, "flip"), (plain + mirrored) / 2, atol=1e-6
    )
    assert np.abs(plain - mirrored).max() > 0.01  # the model does care about the mirror
    symmetric = (images + images[:, :, ::-1]) / 2
    np.testing.assert_allclose(
        with_tta(lambda x: model(np.ascontiguousarray(x)).numpy(), symmetric, "flip"),
        model(symmetric).numpy(),
        atol=1e-6,
    )
    with pytest.raises(ValueError, match="unknown TTA mode"):
        with_tta(model, images, "rotate")


def test_an_export_with_flip_tta_serves_the_average_from_every_signature(tmp_path: Path):
    model = _asymmetric_model()
    path = export_saved_model(model, ["left", "right"], 8, tmp_path, "m", tta="flip")
    loaded = tf.saved_model.load(str(path))
    images = np.random.default_rng(2).uniform(0, 255, (3, 8, 8, 3)).astype(np.float32)
    expected = (model(images).numpy() + model(images[:, :, ::-1].copy()).numpy()) / 2
    served = loaded.signatures["predict_images"](images=tf.constant(images))["probabilities"].numpy()
    np.testing.assert_allclose(served, expected, atol=1e-5)
    png = tf.io.encode_png(tf.constant(images[0].round().astype(np.uint8)))
    from_bytes = loaded.signatures["serving_default"](image_bytes=tf.stack([png]))["probabilities"].numpy()
    assert from_bytes.shape == (1, 2) and abs(from_bytes.sum() - 1) < 1e-5
    assert json.loads((path / "assets" / "metadata.json").read_text())["tta"] == "flip"
