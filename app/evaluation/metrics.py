"""Classification metrics from labels and predicted probabilities: plain numpy, no model needed.

Kept independent of TensorFlow so it can be checked against a hand computation and reused on
any predictions (a SavedModel's, a TFLite file's, another tool's).
"""

from __future__ import annotations

import numpy as np

ECE_BINS = 15


def confusion_matrix(labels: np.ndarray, predicted: np.ndarray, num_classes: int) -> np.ndarray:
    """counts[true, predicted]."""
    matrix = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(matrix, (labels, predicted), 1)
    return matrix


def row_normalized(matrix: np.ndarray) -> np.ndarray:
    """Each row of a confusion matrix as fractions of its true class (all-zero rows stay zero)."""
    matrix = np.asarray(matrix)
    row_sums = matrix.sum(axis=1, keepdims=True)
    return np.divide(matrix, row_sums, out=np.zeros(matrix.shape), where=row_sums > 0)


def reliability_bins(labels: np.ndarray, probabilities: np.ndarray, bins: int = ECE_BINS) -> list[dict]:
    """Equal-width confidence bins: count, accuracy and mean confidence of the predictions in each."""
    confidence = probabilities.max(axis=1)
    correct = probabilities.argmax(axis=1) == labels
    edges = np.linspace(0.0, 1.0, bins + 1)
    out = []
    for low, high in zip(edges[:-1], edges[1:]):
        in_bin = (confidence > low) & (confidence <= high)
        out.append(
            {
                "low": float(low),
                "high": float(high),
                "count": int(in_bin.sum()),
                "accuracy": float(correct[in_bin].mean()) if in_bin.any() else None,
                "confidence": float(confidence[in_bin].mean()) if in_bin.any() else None,
            }
        )
    return out


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion (an accuracy on n photos): unlike the normal
    approximation it stays inside [0, 1] and is honest at 12 photos or at 100%."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return float(max(centre - half, 0.0)), float(min(centre + half, 1.0))


def accuracy_with_interval(accuracy: float, n: int) -> str:
    """'0.9744 on 78 photos (95% interval 0.911-0.993)': how an accuracy is shown to a person."""
    low, high = wilson_interval(round(accuracy * n), n)
    return f"{accuracy:.4f} on {n} photos (95% interval {low:.3f}-{high:.3f})"


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=1, keepdims=True)


def uncalibrated(probabilities: np.ndarray, temperature: float) -> np.ndarray:
    """softmax(logits) from served softmax(logits / T): softmax(T * log p) (the constant drops out)."""
    return softmax(temperature * np.log(np.clip(np.asarray(probabilities, np.float64), 1e-300, 1.0)))


def calibration_effect(labels: np.ndarray, probabilities: np.ndarray, temperature: float) -> dict:
    """Log loss, ECE and reliability bins of the same predictions without the temperature."""
    before = uncalibrated(probabilities, temperature)
    bins = reliability_bins(labels, before)
    return {
        "temperature": temperature,
        "log_loss_uncalibrated": log_loss(labels, before),
        "ece_uncalibrated": expected_calibration_error(bins),
        "reliability_uncalibrated": bins,
    }


def log_loss(labels: np.ndarray, probabilities: np.ndarray, eps: float = 1e-15) -> float:
    """Mean negative log probability of the true class."""
    labels = np.asarray(labels, dtype=np.int64)
    picked = np.clip(np.asarray(probabilities)[np.arange(len(labels)), labels], eps, 1.0)
    return float(-np.mean(np.log(picked))) + 0.0  # + 0.0: never "-0.0000" where every answer is certain


def expected_calibration_error(bins: list[dict]) -> float:
    """Mean |accuracy − confidence| over the reliability bins, weighted by bin size."""
    total = sum(b["count"] for b in bins)
    return float(sum(b["count"] * abs(b["accuracy"] - b["confidence"]) for b in bins if b["count"]) / max(total, 1))


def class_scores(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per class, from a confusion matrix [true, predicted]: precision, recall, F1 and support.
    A never-predicted class's precision is 0 (not NaN)."""
    num_classes = len(matrix)
    true_positive = np.diag(matrix).astype(float)
    support = matrix.sum(axis=1).astype(float)
    predicted_count = matrix.sum(axis=0).astype(float)
    precision = np.divide(true_positive, predicted_count, out=np.zeros(num_classes), where=predicted_count > 0)
    recall = np.divide(true_positive, support, out=np.zeros(num_classes), where=support > 0)
    denominator = precision + recall
    f1 = np.divide(2 * precision * recall, denominator, out=np.zeros(num_classes), where=denominator > 0)
    return precision, recall, f1, support


def per_class(matrix: np.ndarray, classes: list[str]) -> dict[str, dict]:
    """metrics.json's `per_class`: each class's precision, recall, F1 and support."""
    precision, recall, f1, support = class_scores(np.asarray(matrix))
    return {
        name: {
            "precision": float(precision[i]),
            "recall": float(recall[i]),
            "f1": float(f1[i]),
            "support": int(support[i]),
        }
        for i, name in enumerate(classes)
    }


def compute_metrics(labels: np.ndarray, probabilities: np.ndarray, classes: list[str], top_k: int = 5) -> dict:
    """Everything metrics.json holds. Precision of a never-predicted class is 0 (not NaN); a class
    neither in the photos nor in the answers (`classes_absent`, evaluating on a subset of the
    model's classes) has no figures to average, so the macro average leaves it out."""
    labels = np.asarray(labels, dtype=np.int64)
    probabilities = np.asarray(probabilities, dtype=np.float64)
    num_classes = len(classes)
    predicted = probabilities.argmax(axis=1)
    matrix = confusion_matrix(labels, predicted, num_classes)
    precision, recall, f1, support = class_scores(matrix)
    k = min(top_k, num_classes)
    top = np.argsort(-probabilities, axis=1)[:, :k]
    normalized = row_normalized(matrix)
    weights = support / support.sum()
    present = (support > 0) | (matrix.sum(axis=0) > 0)  # in the photos or in the answers, as scikit-learn counts
    pairs = [
        (int(t), int(p), int(matrix[t, p]))
        for t in range(num_classes)
        for p in range(num_classes)
        if t != p and matrix[t, p]
    ]
    pairs.sort(key=lambda x: -x[2])
    reliability = reliability_bins(labels, probabilities)
    return {
        "num_examples": int(len(labels)),
        "accuracy": float((predicted == labels).mean()),
        "accuracy_interval": list(wilson_interval(int((predicted == labels).sum()), len(labels))),
        "top_k": k,
        "top_k_accuracy": float((top == labels[:, None]).any(axis=1).mean()),
        "log_loss": log_loss(labels, probabilities),
        "ece": expected_calibration_error(reliability),
        "per_class": per_class(matrix, classes),
        "macro_avg": {
            k: float(v[present].mean()) for k, v in (("precision", precision), ("recall", recall), ("f1", f1))
        },
        "classes_absent": [name for name, here in zip(classes, present) if not here],
        "weighted_avg": {
            "precision": float((precision * weights).sum()),
            "recall": float((recall * weights).sum()),
            "f1": float((f1 * weights).sum()),
        },
        "confusion_matrix": matrix.tolist(),
        "confusion_matrix_normalized": normalized.round(6).tolist(),
        "most_confused": [{"true": classes[t], "predicted": classes[p], "count": n} for t, p, n in pairs[:10]],
        "reliability": reliability,
    }
