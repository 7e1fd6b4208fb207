"""A TF-Hub-style SavedModel backbone, built locally (no network): frozen in phase 1, trained in phase 2."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from app.config import TrainConfig
from app.export.saved_model import export_saved_model
from app.training.context import setup
from app.training.train import run_phase1, run_phase2


class _TinyFeatureVector(tf.__internal__.tracking.AutoTrackable):
    """The reusable-SavedModel shape TF-Hub uses: __call__(images, training) → [B, C], plus
    `variables` / `trainable_variables` lists (hub_style), or only the function (plain SavedModel)."""

    def __init__(self, hub_style: bool):
        super().__init__()
        self.kernel = tf.Variable(tf.random.stateless_normal([3, 3, 3, 8], [1, 2]) * 0.3, name="conv/kernel")
        self.bias = tf.Variable(tf.zeros([8]), name="conv/bias")
        self.moving_mean = tf.Variable(tf.zeros([8]), trainable=False, name="bn/moving_mean")
        if hub_style:
            self.variables = [self.kernel, self.bias, self.moving_mean]
            self.trainable_variables = [self.kernel, self.bias]

    @tf.function
    def __call__(self, images, training=False):
        x = tf.nn.relu(tf.nn.conv2d(images, self.kernel, 2, "SAME") + self.bias - self.moving_mean)
        return tf.reduce_mean(x, axis=[1, 2])


@pytest.fixture(scope="module", params=["hub_style", pytest.param("plain_savedmodel", marks=pytest.mark.slow)])
def hub_dir(tmp_path_factory, request) -> Path:
    module = _TinyFeatureVector(hub_style=request.param == "hub_style")
    for training in (True, False):
        module.__call__.get_concrete_function(tf.TensorSpec([None, None, None, 3], tf.float32), training=training)
    path = tmp_path_factory.mktemp("hub") / "feature_vector"
    tf.saved_model.save(module, str(path))
    return path


IMAGES = tf.random.stateless_uniform([2, 64, 64, 3], [3, 4], 0, 255)


def _features(ctx) -> np.ndarray:
    return ctx.clf.features_model(IMAGES, training=False).numpy()


def _values(weights) -> list[np.ndarray]:
    return [w.numpy().copy() for w in weights]


def test_hub_backbone_frozen_in_phase1_trained_in_phase2(hub_dir: Path, tiny_config: TrainConfig, tmp_path: Path):
    cfg = tiny_config.replace(backbone=str(hub_dir), weights="auto", lr_finetune=1e-2, warmup_fraction=0.0)
    ctx = setup(cfg)
    assert ctx.weights_used == f"SavedModel {hub_dir}"
    features, head = _features(ctx), _values(ctx.clf.model.get_layer("logits").weights)
    phase1 = run_phase1(ctx)
    np.testing.assert_array_equal(_features(ctx), features)  # phase 1: the backbone computes exactly what it did
    assert any(not np.array_equal(a, b) for a, b in zip(head, _values(ctx.clf.model.get_layer("logits").weights)))
    weights = ctx.clf.backbone.weights
    before = _values(weights)
    run_phase2(ctx, dataclasses.replace(phase1, val_loss=float("inf"), val_accuracy=0.0))  # keep phase 2's own weights
    # The forward pass reads what the optimizer trained (no stale copies): the features move.
    assert not np.allclose(_features(ctx), features), "phase 2 did not train the module"
    # The module's non-trainable variable (its moving mean) is exposed to Keras and stays put.
    untrained = [i for i, w in enumerate(weights) if any(w is n for n in ctx.clf.backbone.non_trainable_weights)]
    assert len(untrained) == 1
    np.testing.assert_array_equal(weights[untrained[0]].numpy(), before[untrained[0]])
    # ... and an export serves the trained module, not the one loaded from disk.
    version = export_saved_model(ctx.clf.model, ctx.info.classes, 64, tmp_path, "hub")
    served = tf.saved_model.load(str(version)).signatures["predict_images"](images=IMAGES)["probabilities"]
    np.testing.assert_allclose(served.numpy(), ctx.clf.model(IMAGES, training=False).numpy(), atol=1e-5)


def test_weights_flag_is_refused_for_hub_backbones(hub_dir: Path, tiny_config: TrainConfig):
    from app.errors import UserError

    with pytest.raises(UserError, match="brings its own weights"):
        setup(tiny_config.replace(backbone=str(hub_dir), weights="none"))
