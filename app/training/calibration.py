"""Temperature scaling (Guo et al., 2017): one number T fitted on the validation split after
training, so that softmax(logits / T) is calibrated. It never changes a prediction (argmax is
unchanged), only how confident each one is.

T is fitted on the kept weights' validation logits by minimising the log loss (a 1-D convex
problem in 1/T, solved on log T in [1/20, 20]); it is recorded in metrics.json and the export's
metadata and applied inside the exported model (`with_temperature`), so SavedModel and TFLite
serve calibrated probabilities. Validation thereby chooses one more number; the test split
chooses nothing.
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from app.evaluation.metrics import expected_calibration_error, log_loss, reliability_bins, softmax
from app.training.context import Context
from app.training.feature_cache import eval_images, model_outputs

TEMPERATURE_RANGE = (0.05, 20.0)


def fit_temperature(logits: np.ndarray, labels: np.ndarray) -> float:
    """The T > 0 that minimises the mean log loss of softmax(logits / T)."""
    from scipy.optimize import minimize_scalar

    logits = np.asarray(logits, np.float64)

    def loss(log_t: float) -> float:
        return log_loss(labels, softmax(logits / math.exp(log_t)))

    low, high = (math.log(t) for t in TEMPERATURE_RANGE)
    return float(math.exp(minimize_scalar(loss, bounds=(low, high), method="bounded", options={"xatol": 1e-4}).x))


def calibration_summary(logits: np.ndarray, labels: np.ndarray, temperature: float) -> dict:
    """What metrics.json records: T, and the validation log loss and ECE before and after."""
    before, after = softmax(np.asarray(logits, np.float64)), softmax(np.asarray(logits, np.float64) / temperature)
    ece = lambda p: expected_calibration_error(reliability_bins(labels, p))  # noqa: E731
    return {"temperature": round(temperature, 6), "fitted_on": f"val ({len(labels)} images)",
            "val_log_loss_before": round(log_loss(labels, before), 6), "val_log_loss_after": round(log_loss(labels, after), 6),
            "val_ece_before": round(ece(before), 6), "val_ece_after": round(ece(after), 6)}


def validation_logits(ctx: Context) -> tuple[np.ndarray, np.ndarray]:
    """The current weights' logits for the whole validation split (run on the chief)."""
    model = ctx.clf.logits_model
    call = tf.function(lambda images: model(images, training=False), reduce_retracing=True)
    logits, labels = model_outputs(call, eval_images(ctx, "val"))
    return logits.astype(np.float64), labels


def calibrate(ctx: Context) -> dict:
    logits, labels = validation_logits(ctx)
    return calibration_summary(logits, labels, fit_temperature(logits, labels))
