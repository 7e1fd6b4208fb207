"""The ONNX file's conversion: tf2onnx without its per-optimizer deep copies, falling back to them."""

from __future__ import annotations

import os

import keras
import numpy as np
import onnxruntime
import pytest

from app.export import onnx_model
from app.export.frozen import frozen_forward

SIZE = 16


@pytest.fixture(scope="module")
def forward():
    """A small conv net with BatchNorm and a softmax: tf2onnx's transpose and folding passes apply."""
    images = keras.Input((SIZE, SIZE, 3), name="image")
    x = keras.layers.Conv2D(4, 3, padding="same")(images)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.GlobalAveragePooling2D()(keras.layers.ReLU()(x))
    model = keras.Model(images, keras.layers.Dense(3, activation="softmax", name="probabilities")(x))
    batchnorm = model.layers[2]
    batchnorm.moving_mean.assign(np.linspace(-1, 1, 4).astype(np.float32))  # statistics to fold, not 0 and 1
    batchnorm.moving_variance.assign(np.linspace(0.5, 2, 4).astype(np.float32))
    return frozen_forward(model, SIZE), model


def _answers(model_bytes: bytes, pixels: np.ndarray) -> np.ndarray:
    session = onnxruntime.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    return session.run(None, {"image": pixels})[0]


def _pixels() -> np.ndarray:
    return np.random.default_rng(0).uniform(0, 255, (4, SIZE, SIZE, 3)).astype(np.float32)


def test_the_file_computes_the_keras_model_s_answers_and_tf2onnx_s_switch_is_left_as_it_was(forward):
    frozen, model = forward
    before = os.environ.get("TF2ONNX_CATCH_ERRORS")
    converted = onnx_model.convert(frozen)
    assert os.environ.get("TF2ONNX_CATCH_ERRORS") == before
    np.testing.assert_allclose(_answers(converted, _pixels()), model(_pixels()).numpy(), atol=1e-5)


def test_without_catching_errors_the_optimizers_make_the_graph_they_make_with_it(forward):
    frozen, _ = forward
    fast = onnx_model._from_graph_def(frozen, catch_errors=False)
    careful = onnx_model._from_graph_def(frozen, catch_errors=True)
    assert [n.op_type for n in fast.graph.node] == [n.op_type for n in careful.graph.node]
    assert "Transpose" not in [n.op_type for n in fast.graph.node][1:-1]  # the transpose pass did run


def test_an_optimizer_that_fails_is_skipped_as_tf2onnx_skips_it(forward, monkeypatch: pytest.MonkeyPatch):
    from tf2onnx.optimizer.transpose_optimizer import TransposeOptimizer

    def broken(*_args, **_kwargs):
        raise RuntimeError("an optimizer's bug")

    monkeypatch.setattr(TransposeOptimizer, "_optimize", broken)
    frozen, model = forward
    converted = onnx_model.convert(frozen)
    np.testing.assert_allclose(_answers(converted, _pixels()), model(_pixels()).numpy(), atol=1e-5)
