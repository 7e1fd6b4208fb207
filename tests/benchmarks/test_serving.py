"""The serving benchmark drives real servers through its three scenarios (tiny workloads here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.serving import run_serving_benchmark


@pytest.mark.slow
def test_serving_benchmark_speed_bombs_and_overload(trained_run: Path, demo_images: Path):
    images = [p.read_bytes() for p in sorted(demo_images.glob("*/*_00[0-3].jpg"))]
    result = run_serving_benchmark(
        trained_run / "export" / "shapes",
        images,
        requests=16,
        clients=4,
        rounds=1,
        overload_seconds=2,
        log=lambda m: None,
    )
    speed = result["speed"]
    for name in ("tf", "litert", "openvino", "auto"):
        assert 0 < speed[f"{name}_p50_ms"] <= speed[f"{name}_p99_ms"] and speed[f"{name}_images_per_s"] > 0
    assert speed["auto_runs"] in ("tf", "litert", "openvino", "onnx")  # what the auto server chose, as it said
    assert speed["openvino_vs_tf_throughput"] == pytest.approx(
        speed["openvino_images_per_s"] / speed["tf_images_per_s"], rel=2e-2
    )
    bombs = result["bombs"]
    assert bombs["bombs_sent"] == 4 and bombs["bombs_refused_413"] == 4  # every bomb refused, from its header
    assert bombs["mixed_normal_failed"] == bombs["normal_only_normal_failed"] == 0
    overload = result["overload"]
    assert overload["server_alive"] and overload["other_answers"] == 0  # only 200, 503 or 504
    assert sum(overload["answers"].values()) == overload["sent"] > 0  # every request answered
