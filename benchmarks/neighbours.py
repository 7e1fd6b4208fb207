"""The audit's neighbour search at growing sizes: exact blocked matrix products against the
approximate (HNSW) indexes of three libraries (faiss, which the audit uses, and hnswlib and
usearch where installed: `pip install hnswlib usearch`), on real photos' embeddings.

    python -m benchmarks.neighbours photos-audit/embeddings.npz
    python -m benchmarks.neighbours photos-audit/embeddings.npz --sizes 13000,52000,104000 --libraries faiss

EMBEDDINGS is the `embeddings.npz` an audit leaves in its report folder (`photoclf audit DATA`).
Past the photos it holds, a size is made of the real rows and copies of them moved by a little
noise (the scale of the rows' own nearest-neighbour distances), so the search meets as many
near neighbours as real photos give; recall is measured against exact search at every size.
For each size and method: the seconds to build and query (every row's `--k` nearest), the
recall of the k nearest, the recall of the near-duplicate pairs (cosine at least `--threshold`),
and the largest error in the outlier finder's score (mean similarity to the 5 nearest). Prints
one line per measurement, a table, then a JSON line.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time
from pathlib import Path

import numpy as np

from app.audit import neighbours
from app.audit.findings import NEAR_DUPLICATE_SIMILARITY, near_duplicate_pairs
from app.audit.neighbours import exact_nearest, without_self
from app.cli import run_cli
from app.inference.runtime_choice import cpu_name
from app.table import format_table


def _hnswlib(data: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    import hnswlib

    index = hnswlib.Index(space="ip", dim=data.shape[1])
    index.init_index(max_elements=len(data), ef_construction=neighbours.EF_CONSTRUCTION, M=neighbours.CONNECTIVITY)
    index.add_items(data)
    index.set_ef(max(neighbours.EF_SEARCH, k))
    labels, distances = index.knn_query(data, k)
    return labels, 1 - distances


def _usearch(data: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    from usearch.index import Index

    index = Index(ndim=data.shape[1], metric="ip", dtype="f32", connectivity=neighbours.CONNECTIVITY,
                  expansion_add=neighbours.EF_CONSTRUCTION, expansion_search=neighbours.EF_SEARCH)  # fmt: skip
    index.add(np.arange(len(data)), data)
    matches = index.search(data, k)
    return matches.keys, 1 - matches.distances


OTHERS = {"hnswlib": _hnswlib, "usearch": _usearch}  # the same HNSW settings as the audit's faiss index


def libraries() -> list[str]:
    """faiss (the audit's) and the other HNSW libraries installed here."""
    return [name for name in ("faiss", *OTHERS) if importlib.util.find_spec(name) is not None]


def searched(data: np.ndarray, k: int, library: str) -> tuple[np.ndarray, np.ndarray]:
    if library == "faiss":
        return neighbours.index_nearest(data, k)
    ids, sims = OTHERS[library](np.ascontiguousarray(data, np.float32), k + 1)
    return without_self(ids.astype(np.int64), sims.astype(np.float32))


def embeddings_of(path: Path) -> np.ndarray:
    with np.load(path) as stored:
        rows = np.asarray(stored["embeddings"], np.float32)
    return rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)


def grown(rows: np.ndarray, size: int, seed: int = 0) -> np.ndarray:
    """`size` unit rows: the real ones, then noisy copies of them (the noise about a real row's
    distance to its nearest neighbour, so copies are near, not identical)."""
    if size <= len(rows):
        return rows[:size]
    rng = np.random.default_rng(seed)
    sample = rows[rng.choice(len(rows), min(len(rows), 2000), replace=False)]
    nearest = np.sort(sample @ rows.T, axis=1)[:, -2]  # -1 is the row itself
    scale = float(np.sqrt(max(2 - 2 * np.median(nearest), 1e-6)) / np.sqrt(rows.shape[1]))
    copies = rows[rng.integers(0, len(rows), size - len(rows))]
    copies = copies + rng.normal(0, scale, copies.shape).astype(np.float32)
    copies /= np.linalg.norm(copies, axis=1, keepdims=True)
    return np.concatenate([rows, copies])


def _pairs(found: tuple[np.ndarray, np.ndarray], threshold: float) -> set[tuple[int, int]]:
    """The (i, j) pairs, i < j, among the neighbours found, at or over the threshold, as the
    audit's near-duplicate finder takes them."""
    return {(i, j) for i, j, _ in near_duplicate_pairs(found[0], threshold, found)}


def scored(exact: tuple[np.ndarray, np.ndarray], found: tuple[np.ndarray, np.ndarray], threshold: float) -> dict:
    """Recall of the k nearest and of the pairs over `threshold`; the worst outlier-score error."""
    (e_ids, e_sims), (f_ids, f_sims) = exact, found
    knn = np.mean([len(np.intersect1d(a, b)) / len(a) for a, b in zip(e_ids, f_ids)])
    wanted = _pairs(exact, threshold)
    pair_recall = len(wanted & _pairs(found, threshold)) / len(wanted) if wanted else 1.0
    score_error = float(np.abs(e_sims[:, :5].mean(1) - f_sims[:, :5].mean(1)).max())
    return {"knn_recall": round(float(knn), 4), "pair_recall": round(pair_recall, 4), "pairs": len(wanted),
            "score_error": round(score_error, 4)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("embeddings", type=Path, help="an audit's embeddings.npz")
    p.add_argument("--sizes", default="13000,52000", help="comma-separated row counts")
    p.add_argument("--libraries", default=",".join(libraries()), help="comma-separated, of the installed ones")
    p.add_argument("--k", type=int, default=16, help="neighbours per row")
    p.add_argument("--threshold", type=float, default=NEAR_DUPLICATE_SIMILARITY, help="near-duplicate cosine")
    args = p.parse_args(argv)
    real = embeddings_of(args.embeddings)
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores; {len(real)} real rows of {real.shape[1]}", flush=True)
    rows, results = [["rows", "method", "seconds", "x exact", "k-NN recall", "pair recall", "pairs", "score error"]], {}
    for size in (int(s) for s in args.sizes.split(",")):
        data = grown(real, size)
        start = time.perf_counter()
        exact = exact_nearest(data, args.k)
        exact_s = time.perf_counter() - start
        measured = {"exact": (exact_s, {"knn_recall": 1.0, "pair_recall": 1.0, "score_error": 0.0})}
        for library in args.libraries.split(","):
            start = time.perf_counter()
            found = searched(data, args.k, library)
            measured[library] = (time.perf_counter() - start, scored(exact, found, args.threshold))
        pairs = scored(exact, exact, args.threshold)["pairs"]
        for method, (seconds, score) in measured.items():
            results[f"{size} {method}"] = {"seconds": round(seconds, 2), **score, "pairs": pairs}
            rows.append([str(size), method, f"{seconds:.1f}", f"{exact_s / seconds:.2f}", f"{score['knn_recall']:.4f}",
                         f"{score['pair_recall']:.4f}", str(pairs), f"{score['score_error']:.4f}"])  # fmt: skip
            print(" ".join(rows[-1]), flush=True)
    print(format_table(rows))
    print(json.dumps({"cpu": cpu_name(), "k": args.k, "threshold": args.threshold, "results": results}))
    return 0


if __name__ == "__main__":
    run_cli(main)
