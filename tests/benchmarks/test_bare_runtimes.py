"""The exported files' benchmark runs where TensorFlow is not installed, and what it reports is
each runtime's own answer set against ONNX Runtime's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.export.file_runners import host_precisions

RUN_WITHOUT_TENSORFLOW = """
import sys
sys.modules["tensorflow"] = None  # importing it now fails, as on a host without it
from benchmarks.bare_runtimes import main
main(sys.argv[1:])
"""


@pytest.fixture(scope="module")
def report(trained_run: Path, demo_images: Path) -> dict:
    version = trained_run / "export" / "shapes" / "1"
    args = [str(version), str(demo_images), "--count", "12", "--batches", "1,4", "--threads", "1", "--rounds", "1"]
    done = subprocess.run([sys.executable, "-c", RUN_WITHOUT_TENSORFLOW, *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_runtime_is_timed_at_every_batch_without_tensorflow(report: dict) -> None:
    runtimes = ["onnxruntime float32", *(f"openvino {p}" for p in host_precisions())]
    assert sorted(report["results"]) == sorted(f"1 {r} {b}" for r in runtimes for b in (1, 4))
    assert report["photos"] == 12
    assert all(r["ms_per_photo"] > 0 for r in report["results"].values())


def test_openvino_float32_gives_onnx_runtimes_answers(report: dict) -> None:
    baseline, float32 = report["results"]["1 onnxruntime float32 4"], report["results"]["1 openvino float32 4"]
    assert baseline == {**baseline, "top1_agreement": 1.0, "max_abs_diff": 0.0}
    assert float32["top1_agreement"] == 1.0
    assert float32["max_abs_diff"] < 1e-4
