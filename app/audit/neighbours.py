"""Each photo's nearest neighbours among the audit's embeddings (unit rows, cosine similarity):
exact, from blocked matrix products (O(n² d) arithmetic, O(block × n) memory), or past
`EXACT_UP_TO` photos from an approximate HNSW index (faiss), whose cost grows far slower. The
library and the size were chosen by measurement on real photos: benchmarks/README.md,
"Neighbours" (`python -m benchmarks.neighbours`).
"""

from __future__ import annotations

import importlib.util

import numpy as np

EXACT_UP_TO = 10_000  # photos up to which the search is exact
CONNECTIVITY, EF_CONSTRUCTION, EF_SEARCH = 16, 128, 128  # HNSW's graph degree and search widths

Nearest = tuple[np.ndarray, np.ndarray]  # ids [n, k] int64 and similarities [n, k] float32, most similar first


def index_available() -> bool:
    return importlib.util.find_spec("faiss") is not None


def nearest(embeddings: np.ndarray, k: int) -> Nearest:
    """Each row's k most similar other rows: exact up to EXACT_UP_TO rows (or without faiss),
    approximate past it."""
    if len(embeddings) <= EXACT_UP_TO or not index_available():
        return exact_nearest(embeddings, k)
    return index_nearest(embeddings, k)


def exact_nearest(embeddings: np.ndarray, k: int, block_bytes: int = 2**27) -> Nearest:
    """Each row's k most similar other rows, exactly."""
    n = len(embeddings)
    k = min(k, n - 1)
    ids, sims = np.zeros((n, k), np.int64), np.zeros((n, k), np.float32)
    rows_per_block = max(1, block_bytes // (4 * max(n, 1)))
    for start in range(0, n, rows_per_block):
        block = embeddings[start : start + rows_per_block] @ embeddings.T
        block[np.arange(len(block)), np.arange(start, start + len(block))] = -np.inf  # not itself
        top = np.argpartition(block, n - k, axis=1)[:, n - k :]
        top_sims = np.take_along_axis(block, top, axis=1)
        order = np.argsort(-top_sims, axis=1)
        ids[start : start + len(block)] = np.take_along_axis(top, order, axis=1)
        sims[start : start + len(block)] = np.take_along_axis(top_sims, order, axis=1)
    return ids, sims


def index_nearest(embeddings: np.ndarray, k: int) -> Nearest:
    """Each row's k most similar other rows (approximately), from a faiss HNSW index of them all."""
    import faiss

    data = np.ascontiguousarray(embeddings, np.float32)
    k = min(k, len(data) - 1)
    index = faiss.IndexHNSWFlat(data.shape[1], CONNECTIVITY, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction, index.hnsw.efSearch = EF_CONSTRUCTION, max(EF_SEARCH, k + 1)
    index.add(data)
    similarities, ids = index.search(data, k + 1)
    return without_self(ids.astype(np.int64), similarities.astype(np.float32))


def without_self(ids: np.ndarray, sims: np.ndarray) -> Nearest:
    """k+1 results a row → k: the row itself removed (or, where the index missed it, the last)."""
    n = len(ids)
    keep = ids != np.arange(n)[:, None]
    keep[keep.all(axis=1), -1] = False
    return ids[keep].reshape(n, -1), sims[keep].reshape(n, -1)
