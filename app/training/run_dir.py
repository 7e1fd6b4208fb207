"""The run directory: one run's config, logs, checkpoints, metrics and export, and its guard rails.

A run dir belongs to one config. Starting the same command again resumes it; a different config
is refused unless --overwrite is given, so two runs are never mixed.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from app.storage import write_text_atomic
from app.config import TrainConfig, read_saved_config, save_config
from app.errors import UserError

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.json"


@dataclass(frozen=True)
class RunDir:
    root: Path

    @property
    def config(self) -> Path:
        return self.root / CONFIG_FILE

    @property
    def metrics(self) -> Path:
        return self.root / METRICS_FILE

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def state(self) -> Path:
        """Facts fixed at the start of a run (classes, image size, weights) that a resume must match."""
        return self.root / "run_state.json"

    def is_complete(self) -> bool:
        return self.metrics.exists()


# Where things are, not what is trained: a run dir may be named by a relative or an absolute
# path, and a resumed run may read its input from a different tf.data service dispatcher.
LOCATION_KEYS = ("out", "data_service")


def config_changes(saved: TrainConfig, cfg: TrainConfig) -> list[str]:
    """Keys that differ, ignoring LOCATION_KEYS."""
    return sorted(k for k, v in cfg.to_dict().items() if k not in LOCATION_KEYS and saved.to_dict().get(k) != v)


def completed_run(cfg: TrainConfig) -> RunDir | None:
    """The run dir, if it already holds a finished run of this config."""
    run = RunDir(Path(cfg.out))
    if run.is_complete() and run.config.exists() and not config_changes(read_saved_config(run.config), cfg):
        return run
    return None


def validate_run_dir(cfg: TrainConfig, overwrite: bool, chief: bool = True) -> RunDir:
    """Refuse a run dir that holds something else, before anything is written. Every worker of
    a multi-worker run checks, so all fail together rather than wait on the chief; the others
    skip the emptiness check, which would race with the chief creating the dir."""
    run = RunDir(Path(cfg.out))
    if run.root.exists() and not run.root.is_dir():
        raise UserError(f"--out: {run.root} exists and is not a folder")
    if run.config.exists() and not overwrite:
        changed = config_changes(read_saved_config(run.config), cfg)
        if changed:
            raise UserError(
                f"{run.root} holds a run with a different config (changed: {', '.join(changed)});"
                " pass --overwrite to replace it, or choose another --out"
            )
    elif chief and run.root.exists() and any(run.root.iterdir()) and not overwrite:
        raise UserError(f"--out: {run.root} is not empty and holds no run; pass --overwrite or choose another --out")
    return run


def prepare_run_dir(cfg: TrainConfig, overwrite: bool) -> RunDir:
    run = validate_run_dir(cfg, overwrite)
    if overwrite and run.root.exists():
        shutil.rmtree(run.root)
    run.checkpoints.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run.config)
    return run


def check_run_state(run: RunDir, facts: dict, write: bool = True) -> None:
    """First start: record `facts` (if `write`). Resume: they must match (e.g. the class count of a checkpoint)."""
    if run.state.exists():
        saved = json.loads(run.state.read_text())
        for key, value in facts.items():
            if key in saved and saved[key] != value:
                raise UserError(
                    f"{run.root}: checkpoint was trained with {key}={saved[key]!r}, the data now gives {value!r};"
                    " pass --overwrite to start over"
                )
        return
    if write:
        write_json_atomic(run.state, facts)


def write_json_atomic(path: Path, data: dict) -> None:
    write_text_atomic(path, json.dumps(data, indent=2) + "\n")
