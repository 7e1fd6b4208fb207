"""Multi-label metrics from multi-hot labels and per-label probabilities: numpy and scikit-learn,
no model needed (the training run uses `best_threshold`, the evaluation everything).

Each label is its own yes/no question: precision, recall and F1 at the label's decision
threshold (chosen on validation, stored in the export), average precision (AP: the area under
its precision-recall curve, threshold-free), and a 2x2 of counts. Over labels: macro mAP (the
mean of the labels' APs), micro mAP (every photo-label pair pooled) and the exact-match ratio
(photos whose every label is right). A label no photo has gets no AP or recall (undefined, not 0).
"""

from __future__ import annotations

import numpy as np
from sklearn.metrics import average_precision_score, precision_recall_curve

DEFAULT_THRESHOLD = 0.5  # for a label no validation photo has


def best_threshold(truth: np.ndarray, scores: np.ndarray) -> tuple[float, float | None]:
    """(the threshold with the best F1 on these photos, that F1); `scores >= threshold` is a yes.
    It lies halfway between the lowest score kept and the next lower one, not on a photo's score:
    on a score, the last digits of another runtime (LiteRT) would decide that photo's answer."""
    truth = np.asarray(truth).astype(bool)
    if not truth.any():
        return DEFAULT_THRESHOLD, None
    precision, recall, thresholds = precision_recall_curve(truth, scores)
    f1 = np.divide(
        2 * precision * recall, precision + recall, out=np.zeros_like(precision), where=precision + recall > 0
    )
    best = int(np.argmax(f1[:-1]))  # the last point (recall 0) has no threshold
    below = thresholds[best - 1] if best > 0 else 0.0  # thresholds ascend: the next lower score
    return float((thresholds[best] + below) / 2), float(f1[best])


def _safe(numerator: float, denominator: float) -> float | None:
    return float(numerator / denominator) if denominator else None


def label_metrics(
    truth: np.ndarray, probabilities: np.ndarray, thresholds: list[float], classes: list[str]
) -> list[dict]:
    """Per label: support (photos with it), counts, precision, recall, F1 at its threshold, AP."""
    truth = np.asarray(truth).astype(bool)
    predicted = probabilities >= np.asarray(thresholds)[None, :]
    rows = []
    for c, name in enumerate(classes):
        t, p = truth[:, c], predicted[:, c]
        tp, fp, fn = int((t & p).sum()), int((~t & p).sum()), int((t & ~p).sum())
        precision, recall = _safe(tp, tp + fp), _safe(tp, tp + fn)
        f1 = _safe(2 * tp, 2 * tp + fp + fn) if t.any() or p.any() else None
        rows.append(
            {
                "label": name,
                "threshold": float(thresholds[c]),
                "support": int(t.sum()),
                "tp": tp,
                "fp": fp,
                "fn": fn,
                "tn": int((~t & ~p).sum()),
                "precision": precision,
                "recall": recall,
                "f1": f1,
                "average_precision": float(average_precision_score(t, probabilities[:, c])) if t.any() else None,
            }
        )
    return rows


def compute_multilabel_metrics(
    truth: np.ndarray, probabilities: np.ndarray, thresholds: list[float], classes: list[str]
) -> dict:
    """What evaluate.py reports of a multi-label model."""
    truth = np.asarray(truth).astype(bool)
    rows = label_metrics(truth, probabilities, thresholds, classes)
    aps = [r["average_precision"] for r in rows if r["average_precision"] is not None]
    f1s = [r["f1"] for r in rows if r["f1"] is not None]
    predicted = probabilities >= np.asarray(thresholds)[None, :]
    return {
        "task": "multi_label",
        "count": int(len(truth)),
        "labels": rows,
        "macro_map": float(np.mean(aps)) if aps else None,
        "micro_map": float(average_precision_score(truth.ravel(), probabilities.ravel())) if truth.any() else None,
        "macro_f1": float(np.mean(f1s)) if f1s else None,
        "exact_match": float((predicted == truth).all(axis=1).mean()),
        "thresholds": [float(t) for t in thresholds],
    }
