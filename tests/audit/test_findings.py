"""Each audit finder on a small synthetic case whose answer is known."""

from __future__ import annotations

import numpy as np
import pytest

from app.audit import findings


def _unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def test_exact_duplicates_group_identical_pixel_hashes():
    assert sorted(map(sorted, findings.exact_duplicate_groups(["a", "b", "a", "c", "b", "a"]))) == [[0, 2, 5], [1, 4]]
    assert findings.exact_duplicate_groups(["a", "b"]) == []


def test_near_duplicate_pairs_match_brute_force():
    rng = np.random.default_rng(0)
    base = _unit(rng.normal(size=(40, 16)))
    copies = _unit(base[[3, 17, 29]] + 0.05 * rng.normal(size=(3, 16)))  # three near copies
    embeddings = np.concatenate([base, copies])
    similarity = embeddings @ embeddings.T
    expected = {(i, j) for i in range(43) for j in range(i + 1, 43) if similarity[i, j] >= 0.9}
    assert {(3, 40), (17, 41), (29, 42)} <= expected
    pairs = findings.near_duplicate_pairs(embeddings, 0.9)
    assert {(i, j) for i, j, _ in pairs} == expected
    assert all(i < j for i, j, _ in pairs) and [s for *_, s in pairs] == sorted((s for *_, s in pairs), reverse=True)


def test_a_set_whose_photos_all_look_alike_lists_each_photo_s_closest_pairs_not_every_pair():
    rng = np.random.default_rng(2)
    alike = _unit(1.0 + 0.01 * rng.normal(size=(300, 8)))  # every pair is over the threshold
    pairs = findings.near_duplicate_pairs(alike, 0.9)
    assert len(pairs) <= 300 * findings.NEAR_CANDIDATES < 300 * 299 // 2
    similarity = alike @ alike.T
    np.fill_diagonal(similarity, -np.inf)
    nearest_of_0 = set(np.argsort(-similarity[0])[: findings.NEAR_CANDIDATES].tolist())
    assert nearest_of_0 <= {j for i, j, _ in pairs if i == 0} | {i for i, j, _ in pairs if j == 0}


def test_neighbour_similarity_is_the_mean_of_the_k_nearest_others():
    rng = np.random.default_rng(1)
    embeddings = _unit(rng.normal(size=(12, 8)))
    similarity = embeddings @ embeddings.T
    np.fill_diagonal(similarity, -np.inf)
    expected = np.sort(similarity, axis=1)[:, -3:].mean(1)
    np.testing.assert_allclose(findings.neighbour_similarity(embeddings, k=3), expected, rtol=1e-5)
    with_a_copy = np.concatenate([embeddings, embeddings[:1]])  # row 0's copy is not its neighbour
    np.testing.assert_allclose(findings.neighbour_similarity(with_a_copy, k=3)[0], expected[0], rtol=1e-5)


def test_outliers_flag_the_image_far_from_a_cluster_and_the_cheap_checks():
    rng = np.random.default_rng(2)
    cluster = _unit(np.ones((30, 8)) + 0.1 * rng.normal(size=(30, 8)))
    loner = _unit(-np.ones((1, 8)))
    embeddings = np.concatenate([cluster, loner])
    n = len(embeddings)
    stats = findings.PixelStats(
        heights=np.full(n, 300),
        widths=np.full(n, 400),
        pixel_std=np.full(n, 50.0),
        detail=np.full(n, 5.0),
        flat_share=np.full(n, 0.1),
    )
    stats.heights[0], stats.widths[1], stats.pixel_std[2], stats.detail[3], stats.flat_share[4] = (
        20,
        2000,
        1.0,
        0.1,
        0.9,
    )
    found = findings.outliers(findings.neighbour_similarity(embeddings), stats)
    assert set(found) == {0, 1, 2, 3, 4, 30}
    assert "far from every other image" in found[30][0]
    assert [found[k][0].split(" (")[0] for k in range(5)] == [
        "tiny",
        "extreme aspect ratio",
        "near-constant",
        "no fine detail",
        "mostly one flat colour",
    ]


def test_label_issues_follow_confident_learning_thresholds():
    # Class 0 images give class 0 about 0.8; class 1 images give class 1 about 0.7.
    probabilities = np.array(
        [
            [0.8, 0.2],
            [0.85, 0.15],
            [0.75, 0.25],
            [0.3, 0.7],
            [0.25, 0.75],
            [0.35, 0.65],
            [0.1, 0.9],  # labelled 0, but class 1 clears its threshold: flagged, suggested 1
            [0.45, 0.55],
        ]
    )  # labelled 0, class 1 (0.55) is below class 1's threshold: not flagged
    labels = np.array([0, 0, 0, 1, 1, 1, 0, 0])
    assert findings.label_issues(probabilities, labels) == [(6, 1, pytest.approx(0.1))]


def test_out_of_sample_probabilities_catch_a_flipped_label_the_head_never_saw():
    rng = np.random.default_rng(3)
    embeddings = np.concatenate([rng.normal(2.0, 1.0, (30, 6)), rng.normal(-2.0, 1.0, (30, 6))]).astype(np.float32)
    labels = np.array([0] * 30 + [1] * 30)
    labels[[4, 40]] = [1, 0]  # two flipped labels
    probabilities = findings.out_of_sample_probabilities(embeddings, labels)
    assert probabilities.shape == (60, 2) and np.allclose(probabilities.sum(1), 1.0)
    self_confidence = probabilities[np.arange(60), labels]
    assert set(np.argsort(self_confidence)[:2]) == {4, 40}  # a head that had seen them would have fitted them
    assert {row for row, _, _ in findings.label_issues(probabilities, labels)} == {4, 40}
