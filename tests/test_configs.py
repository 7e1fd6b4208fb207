"""The example configs in configs/ load as they are and say how to reproduce their result."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.config import TrainConfig, load_config

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.toml"))


def test_there_are_configs_for_the_demo_a_cpu_and_a_gpu():
    assert [p.name for p in CONFIGS] == ["demo.toml", "photos-cpu.toml", "photos-gpu.toml"]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_loads_and_opens_with_its_command_and_result(path: Path):
    cfg = load_config(path)
    assert isinstance(cfg, TrainConfig)
    header = path.read_text().split("[train]")[0]
    assert f"python scripts/fine_tune.py --config configs/{path.name}" in header
    assert "Should give" in header or "Result: not measured" in header


def test_demo_config_is_the_default_run():
    assert load_config(CONFIGS[0]) == TrainConfig()  # so it resumes or reuses the run `fine_tune.py` makes
