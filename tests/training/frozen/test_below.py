"""Phase 2 on images with the layers below its cut run on the host's runtime: decided where it
may pay, the same activations as TensorFlow's layers on the same jittered images, and the tail
trained on them."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from app.config import TrainConfig
from app.data.preprocess import color_jitter
from app.models.classifier import unfreeze_top
from app.training.context import setup
from app.training.frozen import FrozenBackbone
from app.training.frozen.below import JITTER_STREAM, below_forward, fresh_activations
from app.training.train import build_phase, run_phase1, train


@pytest.mark.parametrize(
    ("setting", "below"),
    [
        ({"forward_runtime": "openvino"}, True),
        ({"forward_runtime": "tensorflow"}, False),
        ({"forward_runtime": "auto"}, False),  # 2 steps of 8 photos: too few rows for converting to pay
        ({"forward_runtime": "openvino", "phase2_mode": "views"}, False),  # the views' activations are cached
        ({"forward_runtime": "openvino", "epochs_finetune": 0}, False),
    ],
)
def test_phase2_on_images_runs_the_layers_below_the_cut_on_the_host_where_it_may_pay(
    setting: dict, below: bool, tiny_config: TrainConfig
):
    frozen = FrozenBackbone(setup(tiny_config.replace(**{"phase2_mode": "images", **setting})))
    assert frozen.decision.below_on_host is below
    assert frozen.phase2_on_activations is (below or frozen.decision.phase2_on_views)


@pytest.mark.parametrize("side", [False, True])
def test_fresh_activations_are_the_jittered_images_through_the_layers_below(side: bool, tiny_config: TrainConfig):
    """Each batch: the train step's colour jitter, seeded by the batch's index, then the frozen
    layers below the cut, as TensorFlow computes them; labels and side features pass through."""
    ctx = setup(tiny_config.replace(phase2_mode="images", forward_runtime="openvino"))
    cut, strength = FrozenBackbone(ctx).cut, ctx.augmentation.color_jitter
    assert strength > 0
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (12, 64, 64, 3), dtype=np.uint8)
    sides, labels = rng.normal(size=(12, 3)).astype(np.float32), np.arange(12, dtype=np.int32) % 4
    inputs = {"image": images, "side": sides} if side else images
    forward = below_forward(ctx, cut, epochs=1)
    batches = list(fresh_activations(ctx, cut, forward, tf.data.Dataset.from_tensor_slices((inputs, labels)).batch(4)))

    assert len(batches) == 3 and forward.choice.runtime == "openvino"
    for index, (got, got_labels) in enumerate(batches):
        rows = slice(4 * index, 4 * index + 4)
        seed = tf.random.experimental.stateless_fold_in(tf.constant([ctx.cfg.seed, JITTER_STREAM]), index)
        expected = cut.lower(color_jitter(images[rows], seed, strength), training=False).numpy()
        activations = got["activations"] if side else got
        np.testing.assert_allclose(activations.numpy(), expected, rtol=1e-4, atol=1e-4)
        assert not np.allclose(expected, cut.lower(images[rows].astype(np.float32), training=False).numpy())
        assert got_labels.numpy().tolist() == labels[rows].tolist()
        if side:
            np.testing.assert_array_equal(got["side"].numpy(), sides[rows])


@pytest.mark.slow  # a whole run: the fast tier stays under 3 minutes
def test_phase2_trains_the_tail_on_fresh_activations_and_the_run_records_the_runtime(tiny_config: TrainConfig):
    cfg = tiny_config.replace(phase2_mode="images", forward_runtime="openvino", lr_finetune=1e-2)
    ctx = setup(cfg)
    frozen = FrozenBackbone(ctx)
    phase1 = run_phase1(ctx, frozen)
    unfreeze_top(ctx.clf, cfg.unfreeze)
    phase = build_phase(ctx, 2, phase1, frozen)
    assert phase.steps.model.name == "tail" and phase.val_steps is None and phase.model is ctx.clf.model
    batch, batch_labels = next(phase.inputs.train_iterator())
    assert batch.shape == (cfg.batch_size, *frozen.cut.lower.output.shape[1:]) and batch.dtype == tf.float32
    assert batch_labels.shape == (cfg.batch_size,)

    metrics = train(cfg.replace(out=cfg.out + "-whole"))
    assert metrics["phase2"]["epochs"] == cfg.epochs_finetune
    assert metrics["phase2_below_runtime"]["runtime"] == "openvino"
    assert "openvino float32" in metrics["phase2_below_runtime"]["why"]
