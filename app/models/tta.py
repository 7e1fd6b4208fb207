"""Test-time augmentation: the average of the model's probabilities over simple transforms.

One implementation for every place it runs: inside the exported serving graph (TF tensors, when
the export bakes it in) and around a runtime's `predict_images` (NumPy arrays, for evaluate.py
--tta). `images[:, :, ::-1]` mirrors the width axis of both.
"""

from __future__ import annotations

from collections.abc import Callable

from app.errors import UserError

TTA_MODES = ("none", "flip")


def check_tta(mode: str) -> str:
    """A --tta value, or a one-line error naming the flag."""
    if mode not in TTA_MODES:
        raise UserError(f"--tta must be one of {TTA_MODES}, got '{mode}'")
    return mode


def with_tta(predict: Callable, images, mode: str):
    """`predict(images)` (probabilities [N, C], or a dict of per-image outputs such as
    {"probabilities", "ood_score"}) averaged over the views `mode` names."""
    if mode == "none":
        return predict(images)
    if mode == "flip":
        plain, mirrored = predict(images), predict(images[:, :, ::-1])
        if isinstance(plain, dict):
            return {name: (plain[name] + mirrored[name]) / 2 for name in plain}
        return (plain + mirrored) / 2
    raise ValueError(f"unknown TTA mode '{mode}' (choose from {TTA_MODES})")
