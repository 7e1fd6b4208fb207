"""The finders: exact and near duplicates, cross-split leaks, likely wrong labels, outliers.

All work on arrays from `scan.py` (row r = one readable image) and return plain dicts, so the
JSON report is exactly what they found. Each has a small synthetic test with a known answer.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from app.audit.neighbours import Nearest, nearest

NEAR_DUPLICATE_SIMILARITY = 0.85  # cosine similarity of backbone embeddings; chosen on python -m benchmarks.audit
OUTLIER_MAD = 4.0  # an image is an outlier when its neighbour similarity is this many MADs below the median
NEIGHBOURS = 5
NEAR_CANDIDATES = 32  # a photo's nearest neighbours searched for its near duplicates
PAIRS_CHUNK = 65536  # near-duplicate pairs made into Python objects at a time
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
    embeddings: np.ndarray, threshold: float = NEAR_DUPLICATE_SIMILARITY, found: Nearest | None = None
) -> list[tuple[int, int, float]]:
    """(i, j, similarity) with i < j and cosine similarity >= threshold, among each row's
    NEAR_CANDIDATES nearest (`found`, else app.audit.neighbours.nearest), most similar first: at most
    NEAR_CANDIDATES pairs a photo, so a set whose photos all look alike to the backbone lists its
    closest pairs, not a number of pairs that grows with the square of its size."""
    return [pair for chunk in near_duplicate_chunks(embeddings, threshold, found) for pair in chunk]


def near_duplicate_chunks(
    embeddings: np.ndarray, threshold: float = NEAR_DUPLICATE_SIMILARITY, found: Nearest | None = None
) -> Iterator[list[tuple[int, int, float]]]:
    """`near_duplicate_pairs` a chunk at a time: millions of pairs are never all Python tuples at once."""
    ids, sims = found or nearest(embeddings, NEAR_CANDIDATES)
    rows, cols = np.nonzero(sims >= threshold)
    first, second, similarity = np.minimum(rows, ids[rows, cols]), np.maximum(rows, ids[rows, cols]), sims[rows, cols]
    pair = first.astype(np.int64) * max(len(ids), 1) + second  # a pair met from both of its photos counts once
    _, last = np.unique(pair[::-1], return_index=True)  # the later meeting's similarity, as a dict keeps it
    kept = len(pair) - 1 - last
    first, second, similarity = first[kept], second[kept], similarity[kept]
    order = np.lexsort((second, first, -similarity))
    for start in range(0, len(order), PAIRS_CHUNK):
        at = order[start : start + PAIRS_CHUNK]
        yield list(zip(first[at].tolist(), second[at].tolist(), similarity[at].tolist()))


def neighbour_similarity(embeddings: np.ndarray, k: int = NEIGHBOURS, found: Nearest | None = None) -> np.ndarray:
    """Mean cosine similarity of each row to its k nearest other rows among its NEAR_CANDIDATES
    nearest, exact copies excluded (so a duplicated outlier is still one)."""
    n = len(embeddings)
    k = min(k, n - 1)
    if k < 1:
        return np.zeros(n, np.float32)
    _, sims = found or nearest(embeddings, max(NEAR_CANDIDATES, k))
    sims = -np.sort(-np.where(sims > 0.9999, -1.0, sims), axis=1)  # copies last
    return sims[:, :k].mean(1).astype(np.float32)


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
