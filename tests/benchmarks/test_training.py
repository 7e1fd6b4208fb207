"""The training benchmark times real phases through fine_tune.py's code and reports medians."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.training import run_training_benchmark


@pytest.mark.slow
def test_training_benchmark_times_both_phases_and_the_cached_mode(demo_records: Path):
    lines: list[str] = []
    result = run_training_benchmark(
        str(demo_records), image_size=32, batch_size=8, epochs=2, rounds=1, log=lines.append
    )
    assert all(result[k] > 0 for k in ("phase1_images_per_s", "phase1_cached_images_per_s", "phase2_images_per_s"))
    assert result["cached_speedup"] == pytest.approx(
        result["phase1_cached_images_per_s"] / result["phase1_images_per_s"], rel=1e-2
    )
    assert result["epochs"] == 2 and len(lines) == 1
