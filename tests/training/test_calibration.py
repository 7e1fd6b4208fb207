"""Temperature scaling: the fitted T, the calibrated export, and what evaluation reports."""

from __future__ import annotations

import json
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from app.evaluation.metrics import calibration_effect, log_loss, softmax, uncalibrated
from app.export.layout import read_metadata, resolve_model_dir
from app.export.rebuild import rebuild_served_model
from app.models.classifier import with_temperature
from app.run_dir import RunDir
from app.training.calibration import (
    MIN_CALIBRATION_PHOTOS,
    TEMPERATURE_RANGE,
    calibration_summary,
    choose_temperature,
    fit_temperature,
)
from app.training.report import format_result


def _synthetic(temperature: float, n: int = 20000, classes: int = 5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Logits whose labels are drawn from softmax(logits / temperature): T is the right answer."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, 3.0, (n, classes))
    p = softmax(logits / temperature)
    labels = (p.cumsum(1) > rng.random((n, 1))).argmax(1)
    return logits, labels


@pytest.mark.parametrize("true_t", [0.5, 1.0, 2.5])
def test_fitted_temperature_recovers_the_one_the_labels_were_drawn_with(true_t: float):
    logits, labels = _synthetic(true_t)
    assert fit_temperature(logits, labels) == pytest.approx(true_t, rel=0.05)


def test_summary_reports_before_and_after_and_never_raises_the_log_loss():
    logits, labels = _synthetic(2.5, n=3000)
    found = calibration_summary(logits, labels, fit_temperature(logits, labels))
    assert found["val_log_loss_after"] <= found["val_log_loss_before"]
    assert found["val_ece_after"] < found["val_ece_before"] / 2  # over-confident logits, fixed
    assert found["val_log_loss_before"] == pytest.approx(log_loss(labels, softmax(logits)), abs=1e-6)


def test_t_is_fitted_on_enough_photos_and_left_at_1_on_a_few_saying_why():
    logits, labels = _synthetic(2.5, n=MIN_CALIBRATION_PHOTOS)
    fitted, why = choose_temperature(logits, labels)
    assert fitted == pytest.approx(fit_temperature(logits, labels)) and fitted != 1.0 and why is None
    few, why = choose_temperature(logits[:-1], labels[:-1])
    assert few == 1.0 and why.startswith(f"not fitted: {MIN_CALIBRATION_PHOTOS - 1} validation photos, fewer than")
    summary = calibration_summary(logits[:-1], labels[:-1], few, why)
    assert summary["not_fitted"] == why and summary["val_log_loss_after"] == summary["val_log_loss_before"]


def test_t_that_runs_to_its_bound_is_not_used():
    """Photos without a mistake: the log loss falls as T falls, and T runs to its lower bound
    (every answer 100%): what 12 val photos of 6 flower species did."""
    logits, _ = _synthetic(1.0, n=200)
    labels = logits.argmax(1)  # every one right
    assert fit_temperature(logits, labels) == pytest.approx(TEMPERATURE_RANGE[0], rel=0.01)
    temperature, why = choose_temperature(logits, labels)
    assert temperature == 1.0 and why.startswith("not fitted: the temperature reached its bound (0.050)")
    assert why.endswith("the validation photos hold (almost) no mistakes")


def test_t_that_runs_to_its_upper_bound_is_not_used_and_says_why():
    """A model sure of answers that are mostly wrong (a diverged run): the log loss falls as T
    rises, towards the uniform answer, and T runs to its upper bound."""
    logits, _ = _synthetic(1.0, n=200)
    labels = (logits.argmax(1) + 1) % logits.shape[1]  # every one wrong
    temperature, why = choose_temperature(5 * logits, labels)
    assert temperature == 1.0 and why.startswith("not fitted: the temperature reached its bound (19.9")
    assert why.endswith("the model's confident answers on val are mostly wrong")


def test_the_calibrated_model_serves_softmax_of_logits_over_t():
    inputs = keras.Input((3,))
    logits_model = keras.Model(inputs, keras.layers.Dense(4, name="logits")(inputs), name="toy_logits")
    x = np.random.default_rng(1).normal(size=(6, 3)).astype(np.float32)
    served = with_temperature(logits_model, 1.7)(x).numpy()
    np.testing.assert_allclose(served, softmax(logits_model(x).numpy() / 1.7), rtol=1e-5, atol=1e-7)
    assert (served.argmax(1) == logits_model(x).numpy().argmax(1)).all()  # predictions unchanged


def test_evaluation_recovers_the_uncalibrated_probabilities():
    logits, labels = _synthetic(2.0, n=500)
    served = softmax(logits / 2.0)
    np.testing.assert_allclose(uncalibrated(served, 2.0), softmax(logits), rtol=1e-6, atol=1e-9)
    effect = calibration_effect(labels, served, 2.0)
    assert effect["log_loss_uncalibrated"] == pytest.approx(log_loss(labels, softmax(logits)))


def test_a_run_fits_t_and_its_export_serves_calibrated_probabilities(trained_run: Path):
    run = RunDir(trained_run)
    metrics = run.read_metrics()
    calibration = metrics["calibration"]
    assert calibration["val_log_loss_after"] <= calibration["val_log_loss_before"] + 1e-9
    version = resolve_model_dir(trained_run)
    assert read_metadata(version)["calibration"] == calibration
    served = rebuild_served_model(run.load())
    logits = keras.Model(served.inputs, served.get_layer("logits").output)
    images = tf.random.stateless_uniform([3, 64, 64, 3], [0, 1], 0, 255)
    exported = tf.saved_model.load(str(version)).signatures["predict_images"](images=images)["probabilities"].numpy()
    np.testing.assert_allclose(
        exported, softmax(logits(images).numpy() / calibration["temperature"]), rtol=1e-4, atol=1e-6
    )
    assert json.loads(json.dumps(calibration))  # plain JSON
    assert f"calibration: temperature {calibration['temperature']:.3f}; val ECE" in format_result(metrics)


@pytest.mark.slow
def test_calibrate_false_exports_the_plain_classifier(tiny_config):
    from app.training.train import train

    metrics = train(tiny_config.replace(calibrate=False, epochs_finetune=0))
    assert "calibration" not in metrics
    assert read_metadata(Path(metrics["export"]))["calibration"] is None


@pytest.mark.slow
def test_a_run_on_a_small_val_split_says_its_temperature_is_1_and_why(tiny_config):
    from app.training.train import train

    metrics = train(tiny_config.replace(epochs_finetune=0))
    found = metrics["calibration"]
    assert found["temperature"] == 1.0 and found["not_fitted"].startswith("not fitted: 12 validation photos")
    assert f"calibration: temperature 1, {found['not_fitted']}" in format_result(metrics)
    assert read_metadata(Path(metrics["export"]))["calibration"] == found  # the export serves T = 1
