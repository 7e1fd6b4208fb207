"""Unlabelled photos through the export, in the order a label would help most (ranking.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.data.display import open_photo
from app.data.image_header import DEFAULT_MAX_MEGAPIXELS
from app.export import layout
from app.inference.batch_predict import read_batches
from app.inference.runtime import answers_or_reasons, load_runtime
from app.progress import progress_bar
from app.review.model import check_reviewable
from app.review.ranking import SIGNATURE_SIDE, diverse_order, priority, signature

GUESSES = 3  # classes shown with each photo


@dataclass(frozen=True)
class Candidate:
    path: Path
    guesses: tuple[tuple[str, float], ...]  # the model's top classes and probabilities
    priority: float  # 1 = the least sure
    unknown: bool | None  # "none of these", where the export says it


@dataclass(frozen=True)
class Queue:
    classes: list[str]
    candidates: list[Candidate]  # the order to ask in
    failed: list[dict]  # {path, error}: files that are no photo the model reads
    runtime: str


def _signature(data: bytes) -> np.ndarray:
    try:
        return signature(open_photo(data, max_side=4 * SIGNATURE_SIDE))
    except Exception:  # a photo TensorFlow reads and Pillow does not: it is simply never a near-duplicate
        return np.zeros(SIGNATURE_SIDE * SIGNATURE_SIDE, np.float32)


def rank_photos(
    version: Path, paths: list[Path], *, runtime: str = "auto", method: str = "margin", batch_size: int = 32
) -> Queue:
    """Every photo predicted once (read ahead on a thread), then ordered by `priority`, one
    photo of each burst of near-identical ones first (`diverse_order`)."""
    metadata = check_reviewable(version)
    classes = layout.read_classes(version)
    model = load_runtime(version, runtime, batch=min(batch_size, max(len(paths), 1)))
    limit = float(metadata.get("max_megapixels", DEFAULT_MAX_MEGAPIXELS))
    kept: list[tuple[Path, dict]] = []
    signatures: list[np.ndarray] = []
    failed: list[dict] = []
    with progress_bar(len(paths), "img", "Ranking") as bar:
        for batch in read_batches(paths, batch_size):
            for (path, data), answer in zip(batch, answers_or_reasons(model, [d for _, d in batch], limit)):
                if isinstance(answer, str):
                    failed.append({"path": str(path), "error": answer})
                    continue
                kept.append((path, answer))
                signatures.append(_signature(data))
            bar.update(len(batch))
    return Queue(classes, _ordered(kept, signatures, classes, method), failed, model.name)


def _ordered(kept: list[tuple[Path, dict]], signatures: list[np.ndarray], classes: list[str], method: str):
    if not kept:
        return []
    probabilities = np.stack([answer["probabilities"] for _, answer in kept])
    unknown = np.array([bool(answer.get("unknown", False)) for _, answer in kept])
    has_unknown = "unknown" in kept[0][1]
    scores = priority(probabilities, unknown if has_unknown else None, method)
    candidates = []
    for i in diverse_order(scores, np.stack(signatures)):
        top = np.argsort(-probabilities[i], kind="stable")[:GUESSES]
        guesses = tuple((classes[c], round(float(probabilities[i][c]), 4)) for c in top)
        candidates.append(Candidate(kept[i][0], guesses, float(scores[i]), bool(unknown[i]) if has_unknown else None))
    return candidates
