"""What the frozen backbone hands a phase, held in memory row for row: phase 1's pooled features
of each view, and the activations at phase 2's cut."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ActivationRows:
    """Activations at phase 2's cut, with their side features (if any) and labels, row for row;
    `keys`: each row's photo content key, where the rows came from the gather."""

    activations: np.ndarray
    side: np.ndarray | None
    labels: np.ndarray
    keys: np.ndarray | None = None

    def arrays(self) -> tuple:
        """(inputs, labels) as a phase reads them, row for row."""
        features = {"activations": self.activations, "side": self.side} if self.side is not None else self.activations
        return features, self.labels


@dataclass(frozen=True)
class Phase1Features:
    """Phase 1's input: the pooled backbone features of K views of every training photo, and of
    each val photo once."""

    train_features: np.ndarray  # [K * N, D] float32: K views of each training image
    train_labels: np.ndarray  # [K * N] int32
    val_features: np.ndarray  # [M, D] float32
    val_labels: np.ndarray  # [M] int32
    train_side: np.ndarray | None = None  # [K * N, F] the side features of each row, when the dataset has them
    val_side: np.ndarray | None = None  # [M, F]

    def arrays(self, split: str) -> tuple:
        """(inputs, labels) of "train" or "val" as phase 1 reads them, row for row."""
        x, y, side = (self.train_features, self.train_labels, self.train_side) if split == "train" else (
            self.val_features, self.val_labels, self.val_side)  # fmt: skip
        return ({"features": x, "side": side} if side is not None else x), y
