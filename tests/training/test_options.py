"""Training options that have no other test: class weights, steps_per_execution, mixed precision."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from app.config import TrainConfig
from app.data.pipeline import DatasetInfo
from app.training.context import setup
from app.training.phase import run_phase
from app.training.steps import Steps
from app.training.train import build_phase, class_weights, run_phase1


def test_class_weights_are_inverse_frequency():
    info = DatasetInfo(root=None, classes=["a", "b", "c"], counts={"train": {"a": 10, "b": 30, "c": 20}}, shards={}, shard_records={})
    weights = class_weights(info)
    assert weights == pytest.approx([2.0, 2 / 3, 1.0], rel=1e-5)
    assert sum(w * n for w, n in zip(weights, (10, 30, 20))) == pytest.approx(60)  # total weight unchanged


def _one_sgd_step(weights: list[float] | None, features: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The kernel change after one Steps.train call with SGD at learning rate 1 (= minus the gradient)."""
    model = keras.Sequential([keras.Input((features.shape[1],)), keras.layers.Dense(3, kernel_initializer="ones")])
    optimizer = keras.optimizers.SGD(learning_rate=1.0)
    steps = Steps(tf.distribute.get_strategy(), model, optimizer, num_classes=3, global_batch_size=len(labels),
                  class_weights=weights)
    before = model.layers[0].kernel.numpy().copy()
    steps.train(iter(tf.data.Dataset.from_tensors((features, labels)).repeat()), 1)
    return model.layers[0].kernel.numpy() - before


def test_class_weights_weight_each_example_in_the_gradient():
    """Against an independent computation: gradient of mean(w[y] * cross-entropy)."""
    rng = np.random.default_rng(0)
    features = rng.normal(size=(6, 4)).astype(np.float32)
    labels = np.array([0, 0, 0, 0, 1, 2], np.int32)
    weights = [0.5, 2.0, 2.0]
    kernel = tf.Variable(np.ones((4, 3), np.float32))
    for given in (None, weights):
        w = tf.constant(given or [1.0] * 3)
        with tf.GradientTape() as tape:
            logits = features @ kernel  # the Dense bias starts at 0
            ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
            loss = tf.reduce_mean(tf.gather(w, labels) * ce)
        np.testing.assert_allclose(_one_sgd_step(given, features, labels), -tape.gradient(loss, kernel).numpy(), atol=1e-6)
    assert not np.allclose(_one_sgd_step(None, features, labels), _one_sgd_step(weights, features, labels))


def test_class_weights_option_reaches_the_training_steps(tiny_config: TrainConfig):
    ctx = setup(tiny_config.replace(class_weights=True, epochs_finetune=0))
    steps = build_phase(ctx, 1).steps
    np.testing.assert_allclose(steps.class_weights.numpy(), class_weights(ctx.info), rtol=1e-6)
    assert build_phase(setup(tiny_config.replace(out=tiny_config.out + "2")), 1).steps.class_weights is None


def test_steps_per_execution_runs_exactly_the_steps_of_an_epoch(tiny_config: TrainConfig):
    """5 steps per epoch in calls of 3 steps (3 + 2): the optimizer steps exactly 5 times per epoch."""
    cfg = tiny_config.replace(steps_per_execution=3, batch_size=4, max_steps_per_epoch=5, epochs_head=2, epochs_finetune=0)
    ctx = setup(cfg)
    assert ctx.steps_per_epoch == 5
    phase = build_phase(ctx, 1)
    result = run_phase(phase)
    assert result.epochs == 2
    assert int(phase.steps.optimizer.iterations) == 2 * 5


def test_mixed_precision_keeps_logits_float32(tiny_config: TrainConfig):
    try:
        ctx = setup(tiny_config.replace(mixed_precision="on", epochs_finetune=0, max_steps_per_epoch=1))
        assert ctx.policy == "mixed_float16"
        assert ctx.clf.model.get_layer("logits").compute_dtype == "float32"
        assert ctx.clf.model.get_layer("backbone").layers[2].compute_dtype == "float16"
        result = run_phase1(ctx)  # LossScaleOptimizer path
        assert result.epochs == 1 and np.isfinite(result.val_loss)
    finally:
        keras.mixed_precision.set_global_policy("float32")
