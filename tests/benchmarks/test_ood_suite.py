"""The suite's out-of-distribution benchmark: the activation-shaping scores it adds (ASH-S, SCALE)."""

from __future__ import annotations

import numpy as np

from benchmarks.ood_suite import rescaled


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
