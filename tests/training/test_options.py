"""Training options that have no other test: class weights, steps_per_execution, mixed precision."""

from __future__ import annotations

import keras
import pytest

from app.config import TrainConfig
from app.data.pipeline import DatasetInfo
from app.training.train import class_weights, run_phase1, setup


def test_class_weights_are_inverse_frequency():
    info = DatasetInfo(root=None, classes=["a", "b", "c"], counts={"train": {"a": 10, "b": 30, "c": 20}}, shards={}, shard_records={})
    weights = class_weights(info)
    assert weights == pytest.approx([2.0, 2 / 3, 1.0], rel=1e-5)
    assert sum(w * n for w, n in zip(weights, (10, 30, 20))) == pytest.approx(60)  # total weight unchanged


def test_steps_per_execution_and_class_weights_train(tiny_config: TrainConfig):
    cfg = tiny_config.replace(steps_per_execution=3, max_steps_per_epoch=4, class_weights=True, epochs_finetune=0)
    ctx = setup(cfg)
    result = run_phase1(ctx)
    assert result.epochs == 1
    assert result.images_per_s > 0


def test_mixed_precision_keeps_logits_float32(tiny_config: TrainConfig):
    try:
        ctx = setup(tiny_config.replace(mixed_precision="on", epochs_finetune=0, max_steps_per_epoch=1))
        assert ctx.policy == "mixed_float16"
        assert ctx.clf.model.get_layer("logits").compute_dtype == "float32"
        assert ctx.clf.model.get_layer("backbone").layers[2].compute_dtype == "float16"
        result = run_phase1(ctx)  # LossScaleOptimizer path
        assert result.epochs == 1
    finally:
        keras.mixed_precision.set_global_policy("float32")
