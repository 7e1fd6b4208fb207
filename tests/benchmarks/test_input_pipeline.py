"""The input benchmark runs every variant on the same shards and reports medians and ratios."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.input_pipeline import run_input_benchmark


def test_input_benchmark_reports_each_variant_and_consistent_ratios(demo_records: Path):
    lines: list[str] = []
    result = run_input_benchmark(demo_records, image_size=32, batch_size=4, num_images=16, rounds=2, log=lines.append)
    variants = ("images_per_s", "pipeline_images_per_s", "baseline_images_per_s", "decode_images_per_s")
    assert all(result[k] > 0 for k in variants)
    assert result["ratio_vs_baseline"] == pytest.approx(
        result["images_per_s"] / result["baseline_images_per_s"], rel=1e-2
    )
    assert result["ratio_vs_decode"] == pytest.approx(result["images_per_s"] / result["decode_images_per_s"], rel=1e-2)
    assert [line.split(":")[0] for line in lines] == ["round 1/2", "round 2/2"]  # variants alternate per round


def test_the_profile_adds_ours_with_one_part_out_and_the_jitter_alone(demo_records: Path):
    result = run_input_benchmark(
        demo_records, image_size=32, batch_size=4, num_images=8, rounds=1, profile=True, log=lambda _: None
    )
    parts = ("assert_not_skip_images_per_s", "without_flip_images_per_s", "centre_crop_images_per_s")
    assert all(result[k] > 0 for k in parts)
    assert result["jitter_ms_per_batch"] > 0
