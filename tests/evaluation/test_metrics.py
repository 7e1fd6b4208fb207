"""compute_metrics against a plain, independent computation on a small known set."""

from __future__ import annotations

import math

import numpy as np
import pytest

from app.evaluation.metrics import accuracy_with_interval, compute_metrics, wilson_interval

CLASSES = ["a", "b", "c", "d"]
# Imbalanced (a: 5, b: 3, c: 2, d: 1); class "c" is never predicted.
LABELS = [0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 3]
PROBS = np.array(
    [
        [0.9, 0.05, 0.03, 0.02],
        [0.6, 0.3, 0.05, 0.05],
        [0.4, 0.5, 0.05, 0.05],
        [0.7, 0.1, 0.1, 0.1],
        [0.2, 0.1, 0.3, 0.4],
        [0.1, 0.8, 0.05, 0.05],
        [0.5, 0.4, 0.05, 0.05],
        [0.2, 0.7, 0.05, 0.05],
        [0.5, 0.1, 0.35, 0.05],
        [0.1, 0.6, 0.25, 0.05],
        [0.05, 0.05, 0.1, 0.8],
    ]
)


def _plain(labels, probs, k):
    """Straight from the definitions, with loops."""
    n, c = probs.shape
    pred = [max(range(c), key=lambda j: probs[i][j]) for i in range(n)]
    cm = [[sum(1 for i in range(n) if labels[i] == t and pred[i] == p) for p in range(c)] for t in range(c)]
    out = {"accuracy": sum(pred[i] == labels[i] for i in range(n)) / n, "cm": cm}
    out["topk"] = sum(labels[i] in sorted(range(c), key=lambda j: -probs[i][j])[:k] for i in range(n)) / n
    out["log_loss"] = -sum(math.log(probs[i][labels[i]]) for i in range(n)) / n
    per = {}
    for j in range(c):
        tp = cm[j][j]
        col = sum(cm[t][j] for t in range(c))
        row = sum(cm[j])
        p = tp / col if col else 0.0
        r = tp / row if row else 0.0
        per[j] = (p, r, 2 * p * r / (p + r) if p + r else 0.0, row)
    out["per"] = per
    ece = 0.0
    for b in range(15):
        lo, hi = b / 15, (b + 1) / 15
        members = [i for i in range(n) if lo < max(probs[i]) <= hi]
        if members:
            acc = sum(pred[i] == labels[i] for i in members) / len(members)
            conf = sum(max(probs[i]) for i in members) / len(members)
            ece += len(members) / n * abs(acc - conf)
    out["ece"] = ece
    return out


def test_metrics_match_a_plain_computation():
    m = compute_metrics(np.array(LABELS), PROBS, CLASSES, top_k=2)
    ref = _plain(LABELS, PROBS, 2)
    assert m["confusion_matrix"] == ref["cm"]
    assert m["accuracy"] == pytest.approx(ref["accuracy"])
    assert m["top_k_accuracy"] == pytest.approx(ref["topk"])
    assert m["log_loss"] == pytest.approx(ref["log_loss"])
    assert m["ece"] == pytest.approx(ref["ece"])
    for j, name in enumerate(CLASSES):
        p, r, f, s = ref["per"][j]
        assert m["per_class"][name] == pytest.approx({"precision": p, "recall": r, "f1": f, "support": s})
    assert m["per_class"]["c"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 2}  # never predicted
    f1 = [ref["per"][j][2] for j in range(4)]
    assert m["macro_avg"]["f1"] == pytest.approx(sum(f1) / 4)
    assert m["weighted_avg"]["f1"] == pytest.approx(sum(f * s for f, s in zip(f1, [5, 3, 2, 1])) / 11)
    assert m["confusion_matrix_normalized"][2] == pytest.approx([0.5, 0.5, 0.0, 0.0])
    assert m["most_confused"][0]["count"] == max(ref["cm"][t][p] for t in range(4) for p in range(4) if t != p)


def test_classes_the_photos_lack_and_the_model_never_answered_are_left_out_of_the_macro_average():
    """Evaluating on two of four classes, every photo right: macro F1 is 1, not 0.5, and the
    table names no absent class among the worst."""
    from app.evaluation.report import summary_table

    labels = np.array([0, 0, 2, 2, 2])
    probs = np.eye(4)[labels] * 0.9 + 0.025
    m = compute_metrics(labels, probs, CLASSES, top_k=2)
    assert m["classes_absent"] == [CLASSES[1], CLASSES[3]]
    assert m["macro_avg"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0}
    assert m["per_class"][CLASSES[1]]["support"] == 0  # still listed, with no photos
    assert "worst classes: none (every class perfect)" in summary_table(m)
    wrong = compute_metrics(np.array([0, 0, 2]), np.eye(4)[[0, 1, 2]] * 0.9 + 0.025, CLASSES, top_k=2)
    assert wrong["classes_absent"] == [CLASSES[3]]  # answered once, wrongly: present, precision 0
    assert wrong["macro_avg"]["precision"] == pytest.approx((1.0 + 0.0 + 1.0) / 3)


def test_perfect_predictions():
    labels = np.array([0, 1, 2, 1])
    m = compute_metrics(labels, np.eye(3)[labels], ["x", "y", "z"])
    assert m["accuracy"] == 1.0 and m["ece"] == pytest.approx(0.0) and m["most_confused"] == []
    assert m["log_loss"] == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize(
    ("successes", "n", "interval"),
    [(5, 10, (0.2366, 0.7634)), (12, 12, (0.7575, 1.0)), (0, 10, (0.0, 0.2775)), (89, 96, (0.8571, 0.9642))],
)
def test_the_accuracy_interval_is_wilsons(successes: int, n: int, interval: tuple[float, float]):
    """Textbook values (Wilson 1927; Newcombe 1998's worked examples): honest at 12 photos and at 100%."""
    assert wilson_interval(successes, n) == pytest.approx(interval, abs=1e-4)


def test_metrics_and_the_summary_give_every_accuracy_its_photos_and_interval():
    labels = np.array([0, 1, 1, 0, 1, 1, 0, 0, 1, 1])
    probabilities = np.eye(2)[[0, 1, 1, 0, 1, 1, 0, 0, 0, 0]]  # 8 of 10 right
    found = compute_metrics(labels, probabilities, ["a", "b"])
    assert found["accuracy"] == 0.8 and found["accuracy_interval"] == pytest.approx(wilson_interval(8, 10))
    assert accuracy_with_interval(0.8, 10) == "0.8000 on 10 photos (95% interval 0.490-0.943)"


def test_the_reports_card_says_the_answer_in_plain_words_and_names_only_classes_with_mistakes():
    from app.evaluation.report import summary_card, summary_table

    labels = np.array([0] * 10 + [1] * 10 + [2] * 10)
    predicted = np.array([0] * 9 + [1] + [1] * 10 + [2] * 10)  # one photo of a called b
    found = compute_metrics(labels, np.eye(3)[predicted], ["a", "b", "c"])
    card = summary_card(found)
    assert "96.7% right on 30 photos (95% interval 83.3–99.4%)" in card
    assert "Most mistakes: a: 9 of its 10 photos found; b: 10 of its 10 photos found, 1 other photo called b." in card
    table = summary_table(found)
    assert "top-" not in table  # top-3 of 3 classes is 1 by definition
    assert [line.split()[0] for line in table.split("worst classes")[1].splitlines()[2:4]] == ["a", "b"]  # not c


def test_the_figures_without_the_temperature_are_shown_only_where_one_was_fitted():
    """A run on too few val photos serves T = 1: 'log loss without T=1.00' would repeat the row above."""
    from app.evaluation.evaluate import temperature_effect
    from app.evaluation.metrics import log_loss, softmax, uncalibrated
    from app.evaluation.predictions import Predictions

    served = PROBS / PROBS.sum(axis=1, keepdims=True)
    predictions = Predictions(np.array(LABELS), served, [f"{i}.jpg" for i in range(len(LABELS))], CLASSES)
    assert temperature_effect(predictions, None) is None
    assert (
        temperature_effect(predictions, {"temperature": 1.0, "not_fitted": "not fitted: 9 validation photos"}) is None
    )
    effect = temperature_effect(predictions, {"temperature": 2.0})
    assert effect["log_loss_uncalibrated"] == pytest.approx(log_loss(np.array(LABELS), uncalibrated(served, 2.0)))
    assert effect["log_loss_uncalibrated"] != pytest.approx(log_loss(np.array(LABELS), softmax(np.log(served))))
