"""Nearest neighbours for the audit: exact as brute force gives them, and from the HNSW index
close enough that the finders past the exact search's size find what it finds."""

from __future__ import annotations

import numpy as np
import pytest

from app.audit import findings, neighbours


def _clustered(n: int, dim: int = 32, clusters: int = 40, seed: int = 0) -> np.ndarray:
    """Unit rows in clusters, as photos of a few kinds of things are."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, dim))
    rows = centres[rng.integers(0, clusters, n)] + 0.6 * rng.normal(size=(n, dim))
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def test_exact_nearest_is_brute_force_whatever_the_block_size():
    rows = _clustered(200)
    similarity = rows @ rows.T
    np.fill_diagonal(similarity, -np.inf)
    expected_ids = np.argsort(-similarity, axis=1)[:, :7]
    for block_bytes in (4 * 200, 4 * 200 * 13, 2**27):
        ids, sims = neighbours.exact_nearest(rows, 7, block_bytes=block_bytes)
        np.testing.assert_array_equal(ids, expected_ids)
        np.testing.assert_allclose(sims, np.take_along_axis(similarity, expected_ids, axis=1), rtol=1e-5)


def test_the_index_finds_nearly_every_true_neighbour_and_never_the_row_itself():
    if not neighbours.index_available():
        pytest.skip("faiss-cpu is not installed")
    rows = _clustered(3000)
    exact_ids, exact_sims = neighbours.exact_nearest(rows, 10)
    ids, sims = neighbours.index_nearest(rows, 10)
    assert ids.shape == sims.shape == (3000, 10)
    assert not (ids == np.arange(3000)[:, None]).any()
    recall = np.mean([len(np.intersect1d(a, b)) / 10 for a, b in zip(exact_ids, ids)])
    assert recall > 0.97
    np.testing.assert_allclose(sims, np.take_along_axis(rows @ rows.T, ids, axis=1), atol=1e-4)  # true similarities
    assert (np.diff(sims, axis=1) <= 1e-6).all()  # most similar first


def test_past_the_exact_size_the_finders_use_an_index_and_find_the_planted_copies(monkeypatch):
    if not neighbours.index_available():
        pytest.skip("faiss-cpu is not installed")
    rng = np.random.default_rng(3)
    base = _clustered(2000, seed=3)
    copies = base[[5, 500, 1500]] + 0.02 * rng.normal(size=(3, 32))
    rows = np.concatenate([base, copies / np.linalg.norm(copies, axis=1, keepdims=True)]).astype(np.float32)
    exact_pairs = {(i, j) for i, j, _ in findings.near_duplicate_pairs(rows, 0.97)}
    exact_scores = findings.neighbour_similarity(rows)
    monkeypatch.setattr(neighbours, "EXACT_UP_TO", 1000)
    indexed_pairs = {(i, j) for i, j, _ in findings.near_duplicate_pairs(rows, 0.97)}
    assert {(5, 2000), (500, 2001), (1500, 2002)} <= indexed_pairs <= exact_pairs
    assert len(indexed_pairs) >= 0.95 * len(exact_pairs)
    assert np.abs(findings.neighbour_similarity(rows) - exact_scores).max() < 0.02
