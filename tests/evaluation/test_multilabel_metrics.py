"""Multi-label metrics and the multi-label loss, against hand computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

from app.evaluation.multilabel import best_threshold, compute_multilabel_metrics

TRUTH = np.array([[1, 0], [1, 1], [0, 0], [0, 1]])
PROBS = np.array([[0.9, 0.35], [0.4, 0.7], [0.3, 0.1], [0.2, 0.3]])


def test_the_threshold_is_the_one_with_the_best_f1_on_the_given_photos():
    # 0.9 and 0.4 yes, 0.3 and 0.2 no: halfway between 0.4 and 0.3
    assert best_threshold(TRUTH[:, 0], PROBS[:, 0]) == (pytest.approx(0.35), pytest.approx(1.0))
    assert best_threshold(np.zeros(4), PROBS[:, 1]) == (0.5, None)  # no photo has it: the default, no F1


def test_per_label_counts_f1_ap_map_and_exact_match():
    m = compute_multilabel_metrics(TRUTH, PROBS, [0.5, 0.5], ["cat", "dog"])
    cat, dog = m["labels"]
    assert (
        (cat["tp"], cat["fp"], cat["fn"], cat["tn"]) == (1, 0, 1, 2)
        and cat["recall"] == 0.5
        and cat["precision"] == 1.0
    )
    assert (dog["tp"], dog["fp"], dog["fn"], dog["tn"]) == (1, 0, 1, 2) and dog["f1"] == pytest.approx(2 / 3)
    assert cat["average_precision"] == pytest.approx(1.0)  # both cats score above every non-cat
    assert dog["average_precision"] == pytest.approx(
        (1 + 2 / 3) / 2
    )  # ranked: dog, no dog (0.35), dog: precision 1, then 2/3
    assert m["macro_map"] == pytest.approx((1 + 5 / 6) / 2)
    assert m["exact_match"] == pytest.approx(2 / 4)  # photos 0 and 2 get every label right


def test_the_multi_label_loss_is_mean_binary_cross_entropy_with_smoothing_and_positive_weights():
    from app.training.steps import CompiledSteps

    logits = tf.constant([[2.0, -1.0]])
    labels = tf.constant([[1.0, 0.0]])

    def bce(y: float, x: float, w: float = 1.0) -> float:
        p = 1 / (1 + math.exp(-x))
        return -(w * y * math.log(p) + (1 - y) * math.log(1 - p))

    plain = CompiledSteps(
        tf.distribute.get_strategy(), None, None, num_classes=2, global_batch_size=1, multi_label=True
    )
    assert float(plain._per_example_loss(labels, logits)[0]) == pytest.approx((bce(1, 2) + bce(0, -1)) / 2, rel=1e-5)
    smooth = CompiledSteps(
        tf.distribute.get_strategy(),
        None,
        None,
        num_classes=2,
        global_batch_size=1,
        multi_label=True,
        label_smoothing=0.2,
        class_weights=[3.0, 1.0],
    )
    expected = (bce(0.9, 2, 3.0) + bce(0.1, -1)) / 2
    assert float(smooth._per_example_loss(labels, logits, weighted=True)[0]) == pytest.approx(expected, rel=1e-5)
    assert smooth._correct(labels, logits).numpy().tolist() == [True]
    assert smooth._confusion(
        tf.constant([[1.0, 0.0], [1.0, 1.0]]), tf.constant([[2.0, -1.0], [-1.0, 1.0]])
    ).numpy().tolist() == [
        0,
        0,
        1,
        1,  # label 0: t1p0 (photo 1), t1p1 (photo 0)
        1,
        0,
        0,
        1,
    ]  # label 1: t0p0 (photo 0), t1p1 (photo 1)
