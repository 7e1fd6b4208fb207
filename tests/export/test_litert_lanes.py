"""LiteRTModel on several cores: several images are split over interpreters of one thread each
where that measured faster, and the answers are the same, to the bit, as one interpreter's."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from app.export import tflite


@pytest.fixture
def litert_file(trained_run: Path) -> Path:
    return trained_run / "export" / "shapes" / "1" / "litert" / "model_float32.tflite"


def _images(count: int) -> np.ndarray:
    return np.random.default_rng(count).uniform(0, 255, (count, 64, 64, 3)).astype(np.float32)


def test_images_split_side_by_side_get_one_interpreters_answers(litert_file: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(tflite.LiteRTModel, "_lanes_faster", lambda self: True)
    split, whole = tflite.LiteRTModel(litert_file, threads=3), tflite.LiteRTModel(litert_file, threads=1)
    assert (split.side_by_side, whole.side_by_side) == (3, 0)
    for count in (7, 2, 1, 0):  # more images than lanes, fewer, a lone one (the whole interpreter), none
        expected, got = whole(_images(count)), split(_images(count))
        assert sorted(got) == sorted(expected) == ["ood_score", "probabilities"]  # the run fitted "none of these"
        for key in expected:
            np.testing.assert_array_equal(got[key], expected[key])
    assert split(_images(7))["probabilities"].shape == (7, 4)


@pytest.mark.parametrize("lane_ms, kept", [(1, 2), (50, 0)])
def test_side_by_side_is_kept_only_where_it_timed_faster(
    litert_file: Path, monkeypatch: pytest.MonkeyPatch, lane_ms: int, kept: int
):
    """Timed as the file loads, on its own input: one interpreter with both threads taking 20 ms
    an image, against two of one thread taking `lane_ms` each, side by side."""
    answer = tflite._Interpreter.__call__

    def slowed(self, images: np.ndarray, side: np.ndarray | None = None) -> dict:
        time.sleep(len(images) * (0.02 if self.threads > 1 else lane_ms / 1000))
        return answer(self, images, side)

    monkeypatch.setattr(tflite._Interpreter, "__call__", slowed)
    model = tflite.LiteRTModel(litert_file, threads=2)
    assert model.side_by_side == kept and (model._pool is None) == (kept == 0)  # slower: their memory let go


def test_at_most_max_lanes_side_by_side_and_none_on_one_core(litert_file: Path, monkeypatch: pytest.MonkeyPatch):
    timed = []
    monkeypatch.setattr(tflite.LiteRTModel, "_lanes_faster", lambda self: timed.append(len(self._lanes)) or True)
    assert tflite.LiteRTModel(litert_file, threads=64).side_by_side == tflite.MAX_LANES == timed[0]
    assert tflite.LiteRTModel(litert_file, threads=1).side_by_side == 0 and len(timed) == 1  # nothing to time
