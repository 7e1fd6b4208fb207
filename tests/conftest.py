"""Shared fixtures: a small synthetic image folder and its TFRecords, built once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@pytest.fixture(scope="session")
def demo_images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from app.data.demo import generate_demo_images

    return generate_demo_images(tmp_path_factory.mktemp("demo") / "images", per_class=12, seed=0)


@pytest.fixture(scope="session")
def demo_records(demo_images: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two shards per split, so interleave and per-worker sharding have something to do."""
    from app.data.writer import write_tfrecords

    out = tmp_path_factory.mktemp("records")
    write_tfrecords(demo_images, out, val_fraction=0.25, test_fraction=0.25, num_shards=2, workers=1)
    return out
