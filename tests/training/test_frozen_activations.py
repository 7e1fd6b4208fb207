"""Phase 2 validates on activations computed once below its trained layers, with the same
results as validating on images."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from app.config import TrainConfig
from app.models.classifier import unfreeze_top
from app.training import frozen_activations
from app.training.context import setup
from app.training.inputs import eval_dataset
from app.training.train import build_phase, run_phase1, run_phase2


@pytest.fixture(scope="module")
def side_records(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from app.data.side_demo import FEATURE_COLUMNS, generate_side_feature_dataset
    from app.data.writer import write_tfrecords

    tmp = tmp_path_factory.mktemp("side")
    manifest = generate_side_feature_dataset(tmp / "photos", per_class=6, image_size=48)
    write_tfrecords(manifest, tmp / "records", feature_columns=FEATURE_COLUMNS, val_fraction=0.25,
                    test_fraction=0.0, num_shards=1)
    return tmp / "records"


def _config(data: str, tiny_config: TrainConfig, side_records: Path) -> TrainConfig:
    if data == "images_and_side_features":
        return tiny_config.replace(data=str(side_records), image_size=32, batch_size=4)
    return tiny_config


def _phase2_after_phase1(cfg: TrainConfig):
    ctx = setup(cfg)
    phase1 = run_phase1(ctx)
    unfreeze_top(ctx.clf, cfg.unfreeze)
    return ctx, build_phase(ctx, 2, phase1)


@pytest.mark.parametrize("data", ["images", "images_and_side_features"])
def test_validation_on_activations_equals_validation_on_images(data: str, tiny_config: TrainConfig, side_records: Path):
    cfg = _config(data, tiny_config, side_records).replace(label_smoothing=0.1)  # the tail's loss: the steps' own
    ctx, phase = _phase2_after_phase1(cfg)
    assert phase.val_steps is not None and phase.val_steps.model.name == "tail"

    phase.inputs.train_iterator()  # computes the activations, as the phase's first epoch does
    _assert_same_validation(ctx, phase)


@pytest.mark.parametrize("data", ["images", "images_and_side_features"])
def test_phase1s_feature_cache_hands_phase2_its_activations(data: str, tiny_config: TrainConfig, side_records: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture):
    """Phase 1's cache runs every val photo through the backbone; phase 2 then computes nothing."""
    cfg = _config(data, tiny_config, side_records).replace(cache_features="true")
    ctx = setup(cfg)
    frozen = frozen_activations.frozen_validation(ctx)
    with caplog.at_level(logging.INFO, logger="app.training.frozen_activations"):
        phase1 = run_phase1(ctx, frozen)
    assert "computed once, as phase 1's feature cache was built" in caplog.text
    unfreeze_top(ctx.clf, cfg.unfreeze)
    monkeypatch.setattr(frozen_activations, "_activations", lambda *_: pytest.fail("phase 2 computed them again"))
    phase = build_phase(ctx, 2, phase1, frozen)
    phase.inputs.train_iterator()
    _assert_same_validation(ctx, phase)


def _assert_same_validation(ctx, phase) -> None:
    cached = phase.validation.evaluate(phase.inputs.val_dataset())
    on_images = phase.steps.evaluate(eval_dataset(ctx, "val"))
    assert cached.count == on_images.count == ctx.info.num_examples("val") > 0
    assert cached.loss == pytest.approx(on_images.loss, abs=1e-5)
    assert cached.accuracy == on_images.accuracy
    np.testing.assert_array_equal(cached.confusion_matrix, on_images.confusion_matrix)
    np.testing.assert_array_equal(cached.labels, on_images.labels)
    np.testing.assert_allclose(cached.logits, on_images.logits, atol=1e-5)


@pytest.mark.slow  # a real phase 2 (10 s); the equalities themselves are checked above in the fast tier
def test_phase2_trains_the_layers_the_tail_validates(tiny_config: TrainConfig, caplog: pytest.LogCaptureFixture):
    """The tail shares the classifier's weights: what phase 2 trains is what it validates."""
    cfg = tiny_config.replace(lr_finetune=1e-2, warmup_fraction=0.0)
    ctx = setup(cfg)
    phase1 = run_phase1(ctx)
    with caplog.at_level(logging.INFO, logger="app.training.frozen_activations"):
        run_phase2(ctx, phase1)
    assert "phase 2 validates from block_2_relu" in caplog.text
    phase = build_phase(ctx, 2, phase1)
    phase.inputs.train_iterator()
    _assert_same_validation(ctx, phase)


def test_validation_stays_on_images_when_the_activations_would_not_fit(
        tiny_config: TrainConfig, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture):
    monkeypatch.setattr(frozen_activations, "FEATURE_CACHE_LIMIT", 1000)
    with caplog.at_level(logging.INFO, logger="app.training.frozen_activations"):
        _, phase = _phase2_after_phase1(tiny_config)
    assert phase.val_steps is None and phase.validation is phase.steps
    assert "phase 2 validates on images: the val activations at block_2_relu would take" in caplog.text
