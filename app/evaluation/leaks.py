"""Accuracy on a split's photos that have no copy in another split, where `photoclf audit` found
some: on a test photo copied among the training photos the model is asked what it was trained
on, so the split's accuracy says more than photos never seen would."""

from __future__ import annotations

import logging

import numpy as np

from app.data.audit_files import leaked_in
from app.evaluation.metrics import accuracy_with_interval, wilson_interval
from app.evaluation.predictions import Predictions

log = logging.getLogger(__name__)


def without_leaks(predictions: Predictions, data_dir: str, split: str) -> dict | None:
    """{"audit", "leaked", "count", "accuracy", "accuracy_interval"} over the photos the data's
    audit does not name as copied; None without an audit of this data, or where it names none.
    An audit naming photos the split does not hold is of other photos: not read, and said so."""
    leaked = leaked_in(data_dir, split)
    if leaked is None or not leaked.names:
        return None
    seen = set(predictions.filenames) | {s["path"] for s in predictions.skipped}
    if not leaked.names <= seen:
        log.warning("%s names %s photos this split does not hold: not this data's audit", leaked.audit, split)
        return None
    kept = np.array([name not in leaked.names for name in predictions.filenames])
    right = int((predictions.probabilities.argmax(axis=1) == predictions.labels)[kept].sum())
    count = int(kept.sum())
    return {
        "audit": str(leaked.audit),
        "leaked": len(kept) - count,
        "count": count,
        "accuracy": right / count if count else None,
        "accuracy_interval": list(wilson_interval(right, count)) if count else None,
    }


def summary_rows(found: dict) -> list[list[str]]:
    """The summary table's rows: the accuracy without the copied photos, and how many they were."""
    figure = accuracy_with_interval(found["accuracy"], found["count"]) if found["count"] else "none left"
    return [[f"accuracy without the {found['leaked']} copied in another split (audit)", figure]]


def in_words(found: dict) -> str:
    """The report card's line."""
    if not found["count"]:
        return f"Every one of these photos has a copy in another split ({found['audit']})."
    return (
        f"{found['leaked']} of these photos have a copy in another split (photoclf audit): without them,"
        f" {100 * found['accuracy']:.1f}% right on {found['count']}."
    )
