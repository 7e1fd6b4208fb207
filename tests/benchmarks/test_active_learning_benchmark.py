"""The active-learning benchmark's rounds, on features with a known answer (no photos, no backbone)."""

from __future__ import annotations

import numpy as np

from benchmarks.active_learning import curve, labels_to_reach


def _blobs(seed: int) -> dict:
    """Three classes along a line: the photos near the two boundaries are the ones that decide them."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(3), 200)
    x = np.stack([y * 2.0 + rng.normal(0, 0.9, len(y)), rng.normal(0, 1, len(y))], axis=1)
    signatures = rng.normal(size=(len(y), 16))
    signatures /= np.linalg.norm(signatures, axis=1, keepdims=True)
    test = rng.integers(0, len(y), 300)
    return {"train_x": x, "train_y": y, "signatures": signatures, "test_x": x[test], "test_y": y[test]}


def test_each_round_adds_its_photos_to_the_labelled_ones_and_is_scored():
    points = curve("ranked", _blobs(0), seed=0, start=2, per_round=10, rounds=3)
    assert [n for n, _ in points] == [6, 16, 26, 36]
    assert all(0.0 <= accuracy <= 1.0 for _, accuracy in points)


def test_the_ranking_picks_photos_at_the_boundaries_and_beats_random_early():
    data = _blobs(1)
    ranked = np.mean([curve("ranked", data, s, 1, 6, 2)[-1][1] for s in range(4)])
    random = np.mean([curve("random", data, s, 1, 6, 2)[-1][1] for s in range(4)])
    assert ranked >= random


def test_labels_to_reach_is_the_first_point_at_the_target():
    points = [(10, 0.5), (20, 0.7), (30, 0.8)]
    assert labels_to_reach(points, 0.7) == 20 and labels_to_reach(points, 0.9) is None
