"""A TF-Hub-style SavedModel backbone, built locally (no network): frozen in phase 1, trained in phase 2."""

from __future__ import annotations

import dataclasses

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from app.config import TrainConfig
from app.training.train import run_phase1, run_phase2, setup


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


@pytest.fixture(scope="module", params=["hub_style", "plain_savedmodel"])
def hub_dir(tmp_path_factory, request) -> Path:
    module = _TinyFeatureVector(hub_style=request.param == "hub_style")
    for training in (True, False):
        module.__call__.get_concrete_function(tf.TensorSpec([None, None, None, 3], tf.float32), training=training)
    path = tmp_path_factory.mktemp("hub") / "feature_vector"
    tf.saved_model.save(module, str(path))
    return path


def _module_values(ctx) -> dict[str, np.ndarray]:
    layer = ctx.clf.backbone.get_layer("hub_module")
    return {v.name: v.numpy().copy() for v in [layer._module.kernel, layer._module.bias, layer._module.moving_mean]}


def test_hub_backbone_frozen_in_phase1_trained_in_phase2(hub_dir: Path, tiny_config: TrainConfig):
    cfg = tiny_config.replace(backbone=str(hub_dir), weights="auto", lr_finetune=1e-2, warmup_fraction=0.0)
    ctx = setup(cfg)
    assert ctx.weights_used == f"SavedModel {hub_dir}"
    start = _module_values(ctx)
    phase1 = run_phase1(ctx)
    after1 = _module_values(ctx)
    assert all(np.array_equal(start[k], after1[k]) for k in start)
    run_phase2(ctx, dataclasses.replace(phase1, val_loss=float("inf")))  # keep phase 2's own weights
    after2 = _module_values(ctx)
    assert not np.array_equal(after1["conv/kernel:0"], after2["conv/kernel:0"]), "phase 2 did not train the module"
    assert np.array_equal(after1["bn/moving_mean:0"], after2["bn/moving_mean:0"])
    # The forward pass reads the trained variables (no stale copies): output moves with them.
    images = tf.random.stateless_uniform([2, 64, 64, 3], [3, 4], 0, 255)
    layer = ctx.clf.backbone.get_layer("hub_module")
    np.testing.assert_allclose(layer(images / 255.0), layer._module(images / 255.0, training=False), rtol=1e-6)


def test_weights_flag_is_refused_for_hub_backbones(hub_dir: Path, tiny_config: TrainConfig):
    from app.errors import UserError

    with pytest.raises(UserError, match="brings its own weights"):
        setup(tiny_config.replace(backbone=str(hub_dir), weights="none"))
