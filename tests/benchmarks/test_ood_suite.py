"""The suite's out-of-distribution benchmark: the activation-shaping scores it adds (ASH-S, SCALE)
and the head's stand-in trained with label smoothing."""

from __future__ import annotations

import numpy as np

from benchmarks.ood_suite import rescaled, smoothed_probe


def test_ash_keeps_the_top_share_and_rescales_it_by_the_whole_over_the_kept_sum():
    features = np.array([[4.0, 3.0, 2.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    ash = rescaled(features, keep=0.2, prune=True)  # the top 2 of 10 survive
    factor = np.exp(10.0 / 7.0)
    np.testing.assert_allclose(ash, [[4 * factor, 3 * factor, 0, 0, 0, 0, 0, 0, 0, 0]], rtol=1e-6)


def test_scale_keeps_every_activation_with_the_same_factor():
    features = np.array([[4.0, 3.0, 2.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], [1.0] * 10])
    scaled = rescaled(features, keep=0.2, prune=False)
    np.testing.assert_allclose(scaled[0], features[0] * np.exp(10.0 / 7.0), rtol=1e-6)
    np.testing.assert_allclose(scaled[1], features[1] * np.exp(1.0), rtol=1e-6)  # ties at the cut all count as top


def _classes(seed: int, noise: float) -> tuple[np.ndarray, np.ndarray]:
    """4 classes of 25, each near its own axis of 8 dimensions."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(4), 25)
    features = rng.normal(0, noise, (100, 8))
    features[np.arange(100), labels] += 1.0
    return features, labels


def test_without_smoothing_the_stand_in_is_scikit_learns_logistic_regression():
    """The same objective (mean cross-entropy, L2 penalty 1 / (2 C n), the biases free), so the
    same probabilities."""
    from scipy.special import softmax
    from sklearn.linear_model import LogisticRegression

    features, labels = _classes(6, 0.4)
    ours = softmax(smoothed_probe(features, labels, 0.0, 0.5)(features), axis=1)
    theirs = LogisticRegression(C=0.5, max_iter=2000, tol=1e-8).fit(features, labels).predict_proba(features)
    np.testing.assert_allclose(ours, theirs, atol=2e-3)


def test_label_smoothing_caps_the_stand_ins_confidence_as_it_caps_the_heads():
    """Smoothing 0.1 over 4 classes aims each training photo's top probability at 0.925 (a linear
    model meets it on average, not photo by photo); without it, well-apart classes pass 0.99."""
    from scipy.special import softmax

    features, labels = _classes(7, 0.05)
    plain, smoothed = (softmax(smoothed_probe(features, labels, s, 100.0)(features), axis=1) for s in (0.0, 0.1))
    assert plain.max(axis=1).min() > 0.99
    assert abs(smoothed.max(axis=1).mean() - 0.925) < 0.01 and smoothed.max() < 0.96
    assert (smoothed.argmax(axis=1) == labels).all()
