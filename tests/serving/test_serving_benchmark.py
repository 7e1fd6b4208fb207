"""The serving benchmark starts the real server and compares it with direct SavedModel calls."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.serving.benchmark import run_serving_benchmark


@pytest.mark.slow
def test_serving_benchmark_measures_latency_and_throughput(trained_run: Path, demo_images: Path):
    images = [p.read_bytes() for p in sorted(demo_images.glob("*/*_00[0-3].jpg"))]
    result = run_serving_benchmark(trained_run / "export" / "shapes", images, requests=16, clients=4, rounds=1, log=lambda m: None)
    for name in ("direct", "server"):
        assert 0 < result[f"{name}_p50_ms"] <= result[f"{name}_p99_ms"]
        assert result[f"{name}_images_per_s"] > 0
    assert result["server_vs_direct_throughput"] == pytest.approx(
        result["server_images_per_s"] / result["direct_images_per_s"], rel=2e-2)
    assert (result["clients"], result["requests"]) == (4, 16)
