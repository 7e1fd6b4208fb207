"""Training options that have no other test: class weights, steps_per_execution, mixed precision."""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from app.config import TrainConfig
from app.data.pipeline import DatasetInfo
from app.errors import UserError
from app.training.builders import class_weights
from app.training.context import setup
from app.training.phase import run_phase
from app.training.steps import CompiledSteps
from app.training.train import build_phase, run_phase1


def test_class_weights_are_inverse_frequency():
    info = DatasetInfo(
        root=None, classes=["a", "b", "c"], counts={"train": {"a": 10, "b": 30, "c": 20}}, shards={}, shard_records={}
    )
    weights = class_weights(info)
    assert weights == pytest.approx([2.0, 2 / 3, 1.0], rel=1e-5)
    assert sum(w * n for w, n in zip(weights, (10, 30, 20))) == pytest.approx(60)  # total weight unchanged


def _one_sgd_step(weights: list[float] | None, features: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The kernel change after one CompiledSteps.train call with SGD at learning rate 1 (= minus the gradient)."""
    model = keras.Sequential([keras.Input((features.shape[1],)), keras.layers.Dense(3, kernel_initializer="ones")])
    optimizer = keras.optimizers.SGD(learning_rate=1.0)
    steps = CompiledSteps(
        tf.distribute.get_strategy(),
        model,
        optimizer,
        num_classes=3,
        global_batch_size=len(labels),
        class_weights=weights,
    )
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
        np.testing.assert_allclose(
            _one_sgd_step(given, features, labels), -tape.gradient(loss, kernel).numpy(), atol=1e-6
        )
    assert not np.allclose(_one_sgd_step(None, features, labels), _one_sgd_step(weights, features, labels))


def test_class_weights_option_reaches_the_training_steps(tiny_config: TrainConfig):
    ctx = setup(tiny_config.replace(class_weights=True, epochs_finetune=0))
    steps = build_phase(ctx, 1).steps
    np.testing.assert_allclose(steps.class_weights.numpy(), class_weights(ctx.info), rtol=1e-6)
    assert build_phase(setup(tiny_config.replace(out=tiny_config.out + "2")), 1).steps.class_weights is None


def test_steps_per_execution_runs_exactly_the_steps_of_an_epoch(tiny_config: TrainConfig):
    """5 steps per epoch in calls of 3 steps (3 + 2): the optimizer steps exactly 5 times per epoch."""
    cfg = tiny_config.replace(
        steps_per_execution=3, batch_size=4, max_steps_per_epoch=5, epochs_head=2, epochs_finetune=0
    )
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


def _replica_inputs(steps: CompiledSteps, batch: tf.Tensor) -> np.ndarray:
    return steps.strategy.run(steps._train_inputs, args=(batch,)).numpy()


def test_train_step_jitters_uint8_images_differently_at_each_step():
    """The pipeline hands uint8 over; the step casts it and draws the colour jitter from
    (seed, replica, optimizer step): the same again on resume, new at every step."""
    model = keras.Sequential([keras.Input((4, 4, 3)), keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3)])
    images = tf.cast(tf.reshape(tf.range(2 * 4 * 4 * 3) * 5 % 256, [2, 4, 4, 3]), tf.uint8)

    def steps(jitter: float) -> CompiledSteps:
        return CompiledSteps(
            tf.distribute.get_strategy(),
            model,
            keras.optimizers.SGD(),
            num_classes=3,
            global_batch_size=2,
            color_jitter=jitter,
            seed=3,
        )

    plain = steps(0.0)
    np.testing.assert_array_equal(_replica_inputs(plain, images), images.numpy().astype(np.float32))
    jittered = steps(0.4)
    first = _replica_inputs(jittered, images)
    assert first.dtype == np.float32 and not np.allclose(first, images.numpy(), atol=1.0)
    np.testing.assert_array_equal(_replica_inputs(jittered, images), first)  # same step, same jitter
    jittered.optimizer.iterations.assign(1)
    assert not np.allclose(_replica_inputs(jittered, images), first)
    features = tf.random.stateless_normal([2, 8], [0, 1])  # cached features: not images, left alone
    np.testing.assert_array_equal(_replica_inputs(jittered, features), features.numpy())


@pytest.mark.slow  # XLA's compilation: the fast tier stays under 3 minutes
def test_xla_compiled_step_trains_like_the_plain_one():
    rng = np.random.default_rng(1)
    features = rng.normal(size=(8, 4)).astype(np.float32)
    labels = rng.integers(0, 3, 8).astype(np.int32)
    kernels = []
    for jit in (False, True):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, kernel_initializer="ones")])
        steps = CompiledSteps(
            tf.distribute.get_strategy(),
            model,
            keras.optimizers.Adam(0.1),
            num_classes=3,
            global_batch_size=8,
            label_smoothing=0.1,
            jit_compile=jit,
        )
        steps.train(iter(tf.data.Dataset.from_tensors((features, labels)).repeat()), 3)
        kernels.append(model.layers[0].kernel.numpy())
    assert not np.allclose(kernels[0], 1.0)
    np.testing.assert_allclose(kernels[1], kernels[0], rtol=1e-4, atol=1e-6)


def test_jit_compile_option_is_off_on_cpus_unless_asked(tiny_config: TrainConfig):
    ctx = setup(tiny_config)
    assert not ctx.jit_compile and "off on CPUs" in ctx.jit_reason
    steps = build_phase(ctx, 1).steps
    assert steps._replica_step == steps._replica_train  # not wrapped in an XLA-compiled function
    assert setup(tiny_config.replace(jit_compile="true", out=tiny_config.out + "-xla")).jit_compile


@pytest.mark.slow
def test_mobilenet_train_step_compiles_and_trains_under_xla(tiny_config: TrainConfig):
    forced = setup(
        tiny_config.replace(backbone="mobilenet_v2", jit_compile="true", feature_views="0", epochs_finetune=0)
    )
    result = run_phase1(forced)  # MobileNetV2's train step through XLA on the CPU
    assert result.epochs == 1 and np.isfinite(result.val_loss)


def test_a_dataset_with_side_features_trains_with_side_label_smoothing(tiny_config: TrainConfig, tmp_path):
    """Side features: side_label_smoothing (0 by default); images alone: label_smoothing."""
    from app.data.side_demo import FEATURE_COLUMNS, generate_side_feature_dataset
    from app.data.writer import write_tfrecords

    manifest = generate_side_feature_dataset(tmp_path / "photos", per_class=4, image_size=32)
    write_tfrecords(
        manifest,
        tmp_path / "records",
        feature_columns=FEATURE_COLUMNS,
        val_fraction=0.25,
        test_fraction=0.0,
        num_shards=1,
    )
    side = tiny_config.replace(
        data=str(tmp_path / "records"),
        out=str(tmp_path / "side"),
        image_size=32,
        batch_size=4,
        epochs_finetune=0,
        label_smoothing=0.1,
        side_label_smoothing=0.05,
    )
    assert build_phase(setup(side), 1).steps.label_smoothing == 0.05
    plain = tiny_config.replace(epochs_finetune=0, label_smoothing=0.1, side_label_smoothing=0.05)
    assert build_phase(setup(plain), 1).steps.label_smoothing == 0.1
    assert TrainConfig().side_label_smoothing == 0.0 and TrainConfig().label_smoothing == 0.1


def test_phase1_caches_feature_views_per_image_and_one_plain_view_without_augmentation(tiny_config: TrainConfig):
    assert setup(tiny_config.replace(feature_views="3")).views_per_image == 3
    plain = tiny_config.replace(feature_views="3", augment=False, out=tiny_config.out + "-plain")
    assert setup(plain).views_per_image == 1


@pytest.mark.parametrize("views", ["2", "5"])
def test_a_number_of_views_with_several_workers_is_refused_before_anything_is_built(
    tiny_config: TrainConfig, views: str, monkeypatch: pytest.MonkeyPatch
):
    """Each worker would cache every split; auto trains phase 1 on images there instead."""
    import app.training.context as context

    monkeypatch.setattr(context, "num_workers", lambda strategy: 2)
    with pytest.raises(UserError, match=f"^feature_views = {views}: cached views need one worker"):
        setup(tiny_config.replace(feature_views=views))
    assert not Path(tiny_config.out).exists()  # refused before the run dir was claimed
