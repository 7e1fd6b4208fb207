"""The built-in demo as a run: `photoclf train` without --data, and the notebook's defaults."""

from __future__ import annotations

from pathlib import Path

from app.config import TrainConfig
from app.data.demo import demo_run_dir, ensure_demo_records
from app.run_dir import RunDir
from app.training.train import train


def train_main(cfg: TrainConfig, overwrite: bool = False) -> dict:
    """`train`, with `data=""` meaning the built-in demo (generated on first use)."""
    if not cfg.data:
        cfg = cfg.replace(data=str(ensure_demo_records()))
    return train(cfg, overwrite)


def demo_model_and_data() -> tuple[Path, Path]:
    """(demo run dir, demo TFRecords) for the notebook's defaults; trains the demo model first
    (as `photoclf train` does) if it is missing."""
    run = RunDir(demo_run_dir())
    if not run.is_complete():
        print(f"No demo model at {run.root}: training it first (photoclf train)", flush=True)
        train_main(TrainConfig(out=str(run.root)))
    return run.root, ensure_demo_records()
