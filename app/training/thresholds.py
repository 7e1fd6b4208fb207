"""Per-label decision thresholds of a multi-label run, chosen on the validation split.

A sigmoid output of 0.5 is rarely each label's best cut: a rare label's scores sit lower. For
each label, the threshold with the best F1 on validation is kept (0.5 for a label no validation
photo has); the export stores them and its signatures return the labels at or above them.
"""

from __future__ import annotations

import numpy as np

from app.evaluation.multilabel import best_threshold
from app.training.calibration import validation_logits
from app.training.context import Context
from app.training.phase import KeptPhases


def choose_thresholds(ctx: Context, phases: KeptPhases | None = None) -> dict:
    """What metrics.json records under "thresholds" (`phases`: as for validation_logits)."""
    logits, labels = validation_logits(ctx, phases)
    probabilities = 1 / (1 + np.exp(-logits))
    found = [best_threshold(labels[:, c], probabilities[:, c]) for c in range(labels.shape[1])]
    return {
        "thresholds": [round(t, 6) for t, _ in found],
        "val_f1": [f1 for _, f1 in found],
        "fitted_on": f"val ({len(labels)} images)",
    }
