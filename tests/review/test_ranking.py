"""The review's order: the least sure photos first, "none of these" at the top, one photo per burst."""

from __future__ import annotations

import numpy as np
import pytest

from app.review.ranking import diverse_order, priority, signature, uncertainty


def test_margin_puts_the_closest_call_first_and_a_sure_photo_last():
    p = np.array([[0.98, 0.01, 0.01], [0.50, 0.45, 0.05], [0.70, 0.20, 0.10], [0.40, 0.40, 0.20]])
    u = uncertainty(p, "margin")
    np.testing.assert_allclose(u, [0.03, 0.95, 0.5, 1.0])
    assert list(np.argsort(-u)) == [3, 1, 2, 0]


def test_entropy_is_one_for_a_uniform_answer_and_zero_for_a_certain_one():
    p = np.array([[0.25] * 4, [1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0]])
    np.testing.assert_allclose(uncertainty(p, "entropy"), [1.0, 0.0, 0.5], atol=1e-12)


def test_a_photo_the_model_calls_none_of_these_counts_as_the_least_sure():
    p = np.array([[0.99, 0.01], [0.55, 0.45], [0.9, 0.1]])
    scores = priority(p, unknown=np.array([False, False, True]))
    assert list(np.argsort(-scores, kind="stable")) == [2, 1, 0]
    assert scores[2] == 1.0
    np.testing.assert_allclose(priority(p), uncertainty(p))  # an export without the score: uncertainty alone


def test_an_unknown_method_is_refused():
    with pytest.raises(ValueError, match="margin"):
        uncertainty(np.array([[0.5, 0.5]]), "random")


def _picture(seed: int, brightness: float = 0.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 200, (8, 8, 3)).repeat(8, 0).repeat(8, 1)  # 64 x 64 blocks
    return np.clip(base + brightness, 0, 255).astype(np.uint8)


def test_signatures_of_one_scene_correlate_whatever_the_brightness_and_of_two_scenes_do_not():
    a, a_brighter, b = signature(_picture(0)), signature(_picture(0, 40)), signature(_picture(1))
    assert a.shape == (256,) and abs(np.linalg.norm(a) - 1) < 1e-5
    assert a @ a_brighter > 0.99
    assert abs(a @ b) < 0.5


def test_a_burst_of_near_identical_photos_gets_one_place_in_front_and_the_rest_go_last():
    burst = [signature(_picture(0, shift)) for shift in (0, 5, 10, 15)]  # the four least sure photos
    others = [signature(_picture(seed)) for seed in (1, 2, 3)]
    scores = np.array([0.99, 0.98, 0.97, 0.96, 0.5, 0.4, 0.3])
    order = diverse_order(scores, np.stack(burst + others))
    assert list(order) == [0, 4, 5, 6, 1, 2, 3]


def test_without_near_duplicates_the_order_is_the_score_order():
    signatures = np.stack([signature(_picture(seed)) for seed in range(5)])
    scores = np.array([0.2, 0.9, 0.5, 0.7, 0.1])
    assert list(diverse_order(scores, signatures)) == [1, 3, 2, 0, 4]
