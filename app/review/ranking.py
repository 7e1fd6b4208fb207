"""Which unlabelled photos a label would help most: uncertainty first, one photo of each burst.

A photo the model is unsure of (a small margin between its top two classes, or a high entropy)
teaches it more than one it already gets right with confidence; a photo the model calls
"none of these" has nothing in the training photos to decide by, so it counts as the most
uncertain. A burst of near-identical photos would fill the queue with one question asked many
times: each photo whose picture is nearly the same as one already queued goes to the back.
"""

from __future__ import annotations

import numpy as np

METHODS = ("margin", "entropy")
SIGNATURE_SIDE = 16  # a photo's picture for the near-duplicate test: 16 x 16 grey levels
NEAR_IDENTICAL = 0.95  # correlation of two signatures above which the photos are one burst


def uncertainty(probabilities: np.ndarray, method: str = "margin") -> np.ndarray:
    """[N] in [0, 1], 1 the least sure: 1 - (p1 - p2) for margin, entropy / log(C) for entropy."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    p = np.clip(np.asarray(probabilities, np.float64), 0.0, 1.0)
    if method == "margin":
        top2 = -np.sort(-p, axis=1)[:, :2]
        return 1.0 - (top2[:, 0] - top2[:, 1])
    entropy = -(p * np.log(np.where(p > 0, p, 1.0))).sum(axis=1)
    return entropy / np.log(p.shape[1])


def priority(probabilities: np.ndarray, unknown: np.ndarray | None = None, method: str = "margin") -> np.ndarray:
    """[N] how much a label would help; photos answered "none of these" get the top value, 1."""
    score = uncertainty(probabilities, method)
    if unknown is not None:
        score = np.where(np.asarray(unknown, bool), 1.0, score)
    return score


def signature(pixels: np.ndarray) -> np.ndarray:
    """A photo's small grey picture, zero-mean and unit-length, so a dot product of two is their
    correlation: near 1 for frames of one burst, whatever their brightness."""
    from PIL import Image

    grey = Image.fromarray(pixels).convert("L").resize((SIGNATURE_SIDE, SIGNATURE_SIDE), Image.Resampling.BOX)
    values = np.asarray(grey, np.float32).ravel()
    values -= values.mean()
    norm = np.linalg.norm(values)
    return values / norm if norm > 0 else values


def diverse_order(scores: np.ndarray, signatures: np.ndarray, near: float = NEAR_IDENTICAL) -> np.ndarray:
    """Indices by descending score, except that a photo nearly identical to one already taken
    goes after every photo that is not (in its own score order): one photo of a burst is asked
    first, the rest only when nothing else is left."""
    order = np.argsort(-np.asarray(scores), kind="stable")
    kept = np.empty_like(signatures)  # the taken photos' signatures, filled in order
    taken: list[int] = []
    later: list[int] = []
    for i in order:
        if taken and float(np.max(kept[: len(taken)] @ signatures[i])) > near:
            later.append(int(i))
        else:
            kept[len(taken)] = signatures[i]
            taken.append(int(i))
    return np.array(taken + later, dtype=np.int64)
