"""Closing the review loop: a manifest that holds the run's own photos, each in its split, beside
the answers; and the commands that convert it and train again from the run.

Answers alone make a dataset of only the reviewed photos (too few to train on, and with no
evaluation split worth the name); answers added to the photos the run was trained on make the
next dataset. The run's photos keep their splits, so the new run's val and test photos are the
ones the earlier run never trained on, and the answers join the training split.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from app.config import TrainConfig
from app.errors import UserError
from app.review.answers import Answers
from app.run_dir import LOCATION_KEYS, RunDir

NOT_CARRIED = {"data", "out", "init_from", *LOCATION_KEYS}  # where things are: the commands name them


def photos_root(source: Path) -> Path:
    """Where a dataset's stored photo paths start: the class-folder tree, or a manifest's folder."""
    return source.parent if source.is_file() else source


def source_of(run: RunDir, given: Path | None) -> Path | None:
    """The folder or manifest the run's dataset was converted from: `given` (--source), else the
    one its dataset.json names, where that still exists; None where neither is known."""
    from app import storage
    from app.data import schema

    if given is not None:
        if not given.exists():
            raise UserError(f"--source {given}: no such folder or manifest")
        return given
    meta = storage.read_json_object(Path(run.read_config().data) / schema.METADATA_FILE)
    recorded = Path(str(meta.get("source", "")))
    return recorded if str(recorded) and recorded.exists() else None


def start_combined(manifest: Path, run: RunDir, source: Path) -> Answers:
    """A new manifest of every photo of the run's dataset, in its split (read from the shards)."""
    from app.data.pipeline import load_dataset_info, photo_index

    info = load_dataset_info(run.read_config().data)
    if info.multi_label:
        raise UserError(f"{run.root}: a multi-label run; review answers single-label questions")
    return Answers.combined(manifest, photos_root(source), photo_index(info))


def next_steps(answers: Answers, run: RunDir | None) -> list[str]:
    """The commands that convert the manifest and train again from `run`; [] where the manifest
    holds only answers (there is nothing to keep the run's evaluation photos apart)."""
    if run is None or not answers.has_splits:
        return []
    config = run.read_config()
    data = Path(config.data)
    new_data = data.with_name(f"{data.name}-reviewed")
    new_run = run.root.with_name(f"{run.root.name}-reviewed")
    train = f"photoclf train --data {shlex.quote(str(new_data))} --init-from {shlex.quote(str(run.root))}"
    return [
        f"photoclf convert {shlex.quote(str(answers.path))} {shlex.quote(str(new_data))}",
        train + f" --out {shlex.quote(str(new_run))}" + "".join(f" --set {s}" for s in _settings_of(config)),
    ]


def _settings_of(config: TrainConfig) -> list[str]:
    """KEY=VALUE for each setting of the earlier run that is not the default (the new run must
    match its image size and backbone, and keeps the rest), quoted for a shell."""
    defaults = TrainConfig()
    return [
        shlex.quote(f"{key}={str(value).lower() if isinstance(value, bool) else value}")
        for key, value in config.to_dict().items()
        if key not in NOT_CARRIED and value != getattr(defaults, key)
    ]
