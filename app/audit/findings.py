"""The finders: exact and near duplicates, cross-split leaks, likely wrong labels, outliers.

All work on arrays from `scan.py` (row r = one readable image) and return plain dicts, so the
JSON report is exactly what they found. Each has a small synthetic test with a known answer.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

NEAR_DUPLICATE_SIMILARITY = 0.85  # cosine similarity of backbone embeddings; chosen on python -m benchmarks.audit
OUTLIER_MAD = 4.0  # an image is an outlier when its neighbour similarity is this many MADs below the median
NEIGHBOURS = 5
TINY_SIDE = 32
EXTREME_ASPECT = 4.0
NEAR_CONSTANT_STD = 4.0  # pixel standard deviation (0..255) below which an image is blank
LOW_DETAIL = 0.75  # mean neighbour difference of gray levels; under every real photo measured (benchmarks: Audit)
FLAT_SHARE = 0.6  # share of one flat colour; above every real photo measured, under placeholders and screenshots


def exact_duplicate_groups(pixel_hashes: list[str]) -> list[list[int]]:
    """Rows whose decoded pixels are identical, in groups of two or more."""
    groups: dict[str, list[int]] = defaultdict(list)
    for row, digest in enumerate(pixel_hashes):
        groups[digest].append(row)
    return [rows for rows in groups.values() if len(rows) > 1]


def near_duplicate_pairs(
    embeddings: np.ndarray, threshold: float = NEAR_DUPLICATE_SIMILARITY, block_bytes: int = 2**27
) -> list[tuple[int, int, float]]:
    """(i, j, similarity) with i < j and cosine similarity >= threshold, from blocked matrix
    products of the L2-normalised embeddings: O(n^2 d) arithmetic in BLAS, O(block x n) memory.
    About a minute for 50,000 images on 2 cores; beyond a few hundred thousand an approximate
    nearest-neighbour index (FAISS, ScaNN) is the tool."""
    n = len(embeddings)
    rows_per_block = max(1, block_bytes // (4 * max(n, 1)))
    pairs = []
    for start in range(0, n, rows_per_block):
        block = embeddings[start : start + rows_per_block] @ embeddings.T
        i, j = np.nonzero(block >= threshold)
        keep = j > i + start
        pairs += [(int(a + start), int(b), float(block[a, b])) for a, b in zip(i[keep], j[keep])]
    return sorted(pairs, key=lambda p: -p[2])


def neighbour_similarity(embeddings: np.ndarray, k: int = NEIGHBOURS, block_bytes: int = 2**27) -> np.ndarray:
    """Mean cosine similarity of each row to its k nearest other rows (exact copies excluded, so
    a duplicated outlier is still one)."""
    n = len(embeddings)
    k = min(k, n - 1)
    scores = np.zeros(n, np.float32)
    if k < 1:
        return scores
    rows_per_block = max(1, block_bytes // (4 * n))
    for start in range(0, n, rows_per_block):
        block = embeddings[start : start + rows_per_block] @ embeddings.T
        block[block > 0.9999] = -1.0  # itself and identical copies
        scores[start : start + len(block)] = np.sort(np.partition(block, n - k, axis=1)[:, n - k :], axis=1).mean(1)
    return scores


@dataclass(frozen=True)
class PixelStats:
    heights: np.ndarray
    widths: np.ndarray
    pixel_std: np.ndarray
    detail: np.ndarray
    flat_share: np.ndarray


def outliers(similarity: np.ndarray, stats: PixelStats, mads: float = OUTLIER_MAD) -> dict[int, list[str]]:
    """row → reasons: far from every other image (robust z-score of the neighbour similarity),
    or one of the cheap checks: tiny, extreme aspect ratio, near-constant, no fine detail
    (gradients, renders), mostly one flat colour (placeholders, screenshots, charts)."""
    median = float(np.median(similarity))
    mad = float(np.median(np.abs(similarity - median))) or 1e-6
    reasons: dict[int, list[str]] = defaultdict(list)
    for row in np.nonzero(similarity < median - mads * mad)[0]:
        reasons[int(row)].append(
            f"far from every other image (neighbour similarity {similarity[row]:.2f}, median {median:.2f})"
        )
    for row in range(len(stats.heights)):
        h, w = int(stats.heights[row]), int(stats.widths[row])
        checks = [
            (min(h, w) < TINY_SIDE, f"tiny ({w}x{h})"),
            (max(h, w) / max(min(h, w), 1) > EXTREME_ASPECT, f"extreme aspect ratio ({w}x{h})"),
            (stats.pixel_std[row] < NEAR_CONSTANT_STD, f"near-constant (pixel std {stats.pixel_std[row]:.1f})"),
            (stats.detail[row] < LOW_DETAIL, f"no fine detail ({stats.detail[row]:.2f})"),
            (stats.flat_share[row] > FLAT_SHARE, f"mostly one flat colour ({stats.flat_share[row]:.0%})"),
        ]
        reasons[row] += [reason for failed, reason in checks if failed]
    return {row: r for row, r in reasons.items() if r}


def out_of_sample_probabilities(
    embeddings: np.ndarray, labels: np.ndarray, folds: int = 5, seed: int = 0
) -> np.ndarray:
    """[n, classes] probabilities from a logistic-regression head trained on the other folds:
    no image is scored by a head that saw it. Classes with fewer images than folds use fewer folds."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_predict

    smallest = int(np.bincount(labels).min()) if len(labels) else 0
    folds = max(2, min(folds, smallest))
    head = LogisticRegression(C=1.0, max_iter=2000)
    cv = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    return cross_val_predict(head, embeddings, labels, cv=cv, method="predict_proba")


def label_issues(probabilities: np.ndarray, labels: np.ndarray) -> list[tuple[int, int, float]]:
    """Confident learning (Northcutt et al.): a class's threshold is the mean probability its own
    images give it; an image is a likely mislabel when another class clears that class's
    threshold and beats the given label. Returns (row, suggested class, self-confidence),
    most suspicious (lowest probability of the given label) first."""
    classes = probabilities.shape[1]
    thresholds = np.array(
        [probabilities[labels == c, c].mean() if (labels == c).any() else 1.0 for c in range(classes)]
    )
    confident = np.where(probabilities >= thresholds, probabilities, -1.0)
    suggested = confident.argmax(1)
    self_confidence = probabilities[np.arange(len(labels)), labels]
    flagged = [
        r
        for r in range(len(labels))
        if confident[r, suggested[r]] > 0
        and suggested[r] != labels[r]
        and probabilities[r, suggested[r]] > self_confidence[r]
    ]
    return sorted(((r, int(suggested[r]), float(self_confidence[r])) for r in flagged), key=lambda t: t[2])
