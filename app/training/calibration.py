"""Temperature scaling (Guo et al., 2017): one number T fitted on the validation split after
training, so that softmax(logits / T) is calibrated. It never changes a prediction (argmax is
unchanged), only how confident each one is.

T is fitted on the kept weights' validation logits by minimising the log loss (a 1-D convex
problem in 1/T, solved on log T in [1/20, 20]); it is recorded in metrics.json and the export's
metadata and applied inside the exported model (`with_temperature`), so SavedModel and TFLite
serve calibrated probabilities. Validation thereby chooses one more number; the test split
chooses nothing.

On a small validation split T follows its few photos rather than the model: on photos without
a mistake the log loss falls as T falls, so T runs to its bound and every answer reads 100%.
So T stays 1 (and the run says why) where the split holds fewer than MIN_CALIBRATION_PHOTOS or
the fitted T reached a bound; benchmarks/README.md ("Small data") has the measurements.
"""

from __future__ import annotations

import math

import numpy as np

from app.evaluation.metrics import expected_calibration_error, log_loss, reliability_bins, softmax
from app.training.context import Context
from app.training.frozen import eval_images, model_outputs
from app.training.phase import KeptPhases

TEMPERATURE_RANGE = (0.05, 20.0)
MIN_CALIBRATION_PHOTOS = 50  # validation photos below which T is not fitted


def fit_temperature(logits: np.ndarray, labels: np.ndarray) -> float:
    """The T > 0 that minimises the mean log loss of softmax(logits / T)."""
    from scipy.optimize import minimize_scalar

    logits = np.asarray(logits, np.float64)

    def loss(log_t: float) -> float:
        return log_loss(labels, softmax(logits / math.exp(log_t)))

    low, high = (math.log(t) for t in TEMPERATURE_RANGE)
    return float(math.exp(minimize_scalar(loss, bounds=(low, high), method="bounded", options={"xatol": 1e-4}).x))


def choose_temperature(logits: np.ndarray, labels: np.ndarray) -> tuple[float, str | None]:
    """(T, why T was left at 1, or None where it was fitted)."""
    if len(labels) < MIN_CALIBRATION_PHOTOS:
        return 1.0, (
            f"not fitted: {len(labels)} validation photos, fewer than the {MIN_CALIBRATION_PHOTOS} it needs"
            " (a temperature fitted on so few follows them, not the model)"
        )
    temperature = fit_temperature(logits, labels)
    low, high = TEMPERATURE_RANGE
    if temperature <= low * 1.01:
        return 1.0, (
            f"not fitted: the temperature reached its bound ({temperature:.3f}),"
            " as it does when the validation photos hold (almost) no mistakes"
        )
    if temperature >= high / 1.01:
        return 1.0, (
            f"not fitted: the temperature reached its bound ({temperature:.3f}),"
            " as it does when the model's confident answers on val are mostly wrong"
        )
    return temperature, None


def calibration_summary(
    logits: np.ndarray, labels: np.ndarray, temperature: float, not_fitted: str | None = None
) -> dict:
    """What metrics.json records: T (and why it is 1 where it was not fitted), and the validation
    log loss and ECE before and after."""
    before, after = softmax(np.asarray(logits, np.float64)), softmax(np.asarray(logits, np.float64) / temperature)
    ece = lambda p: expected_calibration_error(reliability_bins(labels, p))  # noqa: E731
    return {
        "temperature": round(temperature, 6),
        **({"not_fitted": not_fitted} if not_fitted else {}),
        "fitted_on": f"val ({len(labels)} images)",
        "val_log_loss_before": round(log_loss(labels, before), 6),
        "val_log_loss_after": round(log_loss(labels, after), 6),
        "val_ece_before": round(ece(before), 6),
        "val_ece_after": round(ece(after), 6),
    }


def validation_logits(ctx: Context, phases: KeptPhases | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The kept weights' logits and labels for the whole validation split: those the kept epoch's
    own validation pass saved (`phases`: the results of phases 1 and 2), else one more pass with
    the current weights (run on the chief)."""
    saved = saved_validation_outputs(ctx, phases or {})
    if saved is not None:
        return saved
    model = ctx.clf.logits_model
    logits, labels = model_outputs(lambda images, labels: model(images, training=False), eval_images(ctx, "val"))
    return logits.astype(np.float64), labels


def saved_validation_outputs(ctx: Context, phases: KeptPhases) -> tuple[np.ndarray, np.ndarray] | None:
    """The kept epoch's saved validation outputs: phase 2's, or phase 1's where phase 2 kept its
    weights (best epoch 0). None where the run kept none (e.g. it was started by an older version)."""
    for number in (2, 1):
        result = phases.get(number)
        if result is None or not result.best_epoch:
            continue
        path = ctx.run.best_val_outputs(number, result.best_epoch)
        if not path.exists():
            return None
        with np.load(path) as saved:
            return saved["logits"].astype(np.float64), saved["labels"].astype(np.int32)
    return None


def calibrate(ctx: Context, phases: KeptPhases | None = None) -> dict:
    logits, labels = validation_logits(ctx, phases)
    return calibration_summary(logits, labels, *choose_temperature(logits, labels))
