"""The run directory, owned here: every path of a run, its guard rails, and loading a finished run.

    RUN_DIR/config.json              the resolved TrainConfig
    RUN_DIR/run_state.json           classes, image size, backbone, weights and dataset the checkpoints belong to
    RUN_DIR/history.csv              one row per epoch, both phases
    RUN_DIR/tensorboard/             TensorBoard event files
    RUN_DIR/learning_curves.png      loss and accuracy over both phases
    RUN_DIR/checkpoints/phaseN/      the last finished epoch of phase N (model, optimizer, state)
    RUN_DIR/checkpoints/phaseN_best_epochEEE.weights.h5   phase N's best weights so far
    RUN_DIR/checkpoints/phaseN_best_epochEEE.val_outputs.npz   their validation logits and labels
                                     (calibration reuses them)
    RUN_DIR/feature_store/           phase 1's backbone features by photo content, with feature_store = run
                                     (by default they are kept outside, shared by runs: app.training.feature_store)
    RUN_DIR/model.weights.h5         the kept weights of the whole run (what export rebuilds from)
    RUN_DIR/metrics.json             written last: its presence means the run is complete
    RUN_DIR/export/NAME/VERSION/     the serving exports (layout: app.export.layout)
    RUN_DIR/reports/                 evaluation reports of this run's exports

A run dir belongs to one config. Starting the same command again resumes it; a different config
is refused unless --overwrite is given, so two runs are never mixed. No other module spells a
run-dir file name.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app import storage
from app.config import TrainConfig, read_saved_config, save_config
from app.errors import UserError

HISTORY_FIELDS = ["phase", "epoch", "phase_epoch", "loss", "accuracy", "val_loss", "val_accuracy", "lr", "seconds"]

# Where things are, not what is trained: a run dir may be named by a relative or an absolute
# path, a resumed run may read its input from a different tf.data service dispatcher, and its
# cached features from another store (they are the same wherever they are kept).
LOCATION_KEYS = ("out", "data_service", "feature_store")


@dataclass(frozen=True)
class RunDir:
    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    config = property(lambda self: self.root / "config.json")
    state = property(lambda self: self.root / "run_state.json", doc="facts a resume must match")
    history = property(lambda self: self.root / "history.csv")
    tensorboard = property(lambda self: self.root / "tensorboard")
    learning_curves = property(lambda self: self.root / "learning_curves.png")
    checkpoints = property(lambda self: self.root / "checkpoints")
    feature_store = property(lambda self: self.root / "feature_store", doc="with feature_store = run")
    final_weights = property(lambda self: self.root / "model.weights.h5")
    ood_score = property(lambda self: self.root / "ood_score.npz", doc="the export's out-of-distribution statistics")
    metrics = property(lambda self: self.root / "metrics.json")
    export_root = property(lambda self: self.root / "export")
    reports = property(lambda self: self.root / "reports")

    @property
    def export_name(self) -> str:
        """The model name exports get by default: the run dir's own name, as a model name may be
        spelt (`runs/my photos` → my_photos; a name with no letter or digit of those → model)."""
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", self.root.resolve().name).lstrip(".")
        return name if re.search(r"[A-Za-z0-9]", name) else "model"

    def phase_checkpoints(self, phase: int) -> Path:
        return self.checkpoints / f"phase{phase}"

    def best_weights(self, phase: int, epoch: int) -> Path:
        return self.checkpoints / f"phase{phase}_best_epoch{epoch:03d}.weights.h5"

    def best_val_outputs(self, phase: int, epoch: int) -> Path:
        return self.checkpoints / f"phase{phase}_best_epoch{epoch:03d}.val_outputs.npz"

    def stale_best_weights(self, phase: int, keep_epoch: int) -> list[Path]:
        """Best-epoch files (weights, validation outputs) of other epochs than `keep_epoch`."""
        keep = {self.best_weights(phase, keep_epoch), self.best_val_outputs(phase, keep_epoch)}
        return [p for p in self.checkpoints.glob(f"phase{phase}_best_epoch*") if p not in keep]

    def is_complete(self) -> bool:
        return self.metrics.exists()

    @classmethod
    def of_export(cls, version_dir: Path) -> RunDir | None:
        """The run dir an export version lives in (RUN_DIR/export/NAME/VERSION), if any."""
        version_dir = Path(version_dir)
        run = cls(version_dir.parent.parent.parent)
        return run if run.export_root == version_dir.parent.parent and run.config.exists() else None

    def write_ood_score(self, score) -> None:
        """An app.models.ood.ShippedScore's arrays, written atomically."""
        with storage.atomic_path(self.ood_score) as tmp, open(tmp, "wb") as f:
            np.savez(f, **score.to_arrays())

    def read_ood_score(self):
        """The app.models.ood.ShippedScore written by write_ood_score, or None (older runs)."""
        from app.models.ood import ShippedScore

        if not self.ood_score.exists():
            return None
        with np.load(self.ood_score) as arrays:
            return ShippedScore.from_arrays(arrays)

    def read_config(self) -> TrainConfig:
        return read_saved_config(self.config)

    def read_state(self) -> dict:
        return storage.read_json_object(self.state)

    def read_metrics(self) -> dict:
        return storage.read_json_object(self.metrics) if self.metrics.exists() else {}

    def write_metrics(self, metrics: dict) -> None:
        storage.write_json_atomic(self.metrics, metrics)

    def _what_to_give(self) -> str:
        """An export inside a run dir (runs/x/export/x/1, given where the run is asked for) names
        the run dir; a run whose training was stopped is told to resume; anything else to train."""
        for folder in Path(self.root).absolute().parents:
            if RunDir(folder).final_weights.is_file():
                return f"it is inside the run dir {folder}: give that"
        if self.config.is_file():
            return "its training has not finished: the same photoclf train command resumes it"
        return "run photoclf train first"

    def load(self, *, need_weights: bool = True) -> FinishedRun:
        """What export and evaluation need of a trained run; a clear error if it is not one."""
        needed = [self.state, self.config] + ([self.final_weights] if need_weights else [])
        missing = [p.name for p in needed if not p.exists()]
        if missing:
            raise UserError(f"{self.root}: not a finished run (needs {', '.join(missing)}); {self._what_to_give()}")
        state = self.read_state()
        return FinishedRun(
            self,
            self.read_config(),
            state,
            self.read_metrics(),
            classes=state["classes"],
            image_size=state["image_size"],
            multi_label=state.get("task") == "multi_label",
            side_features=state.get("side_features", []),
        )


@dataclass(frozen=True)
class FinishedRun:
    """A trained run as export and evaluation read it; its facts read from run_state.json once."""

    run: RunDir
    config: TrainConfig
    state: dict  # run_state.json: classes, image_size, backbone, weights
    metrics: dict  # metrics.json, {} until the run has written it
    classes: list[str]
    image_size: int
    multi_label: bool  # sigmoid outputs, one per label, and per-label decision thresholds (metrics.json)
    side_features: list[dict]  # the side-feature columns the model takes besides the image ([] for image-only)

    def ood_score(self, metrics: dict | None = None):
        """The run's fitted out-of-distribution score (app.models.ood.ShippedScore), if it has one."""
        metrics = self.metrics if metrics is None else metrics
        return None if self.multi_label or not metrics.get("ood") else self.run.read_ood_score()


def config_changes(saved: TrainConfig, cfg: TrainConfig) -> list[str]:
    """Keys that differ, ignoring LOCATION_KEYS; a data folder named relatively and absolutely is one folder."""
    before, now = _comparable(saved), _comparable(cfg)
    return sorted(k for k, v in now.items() if k not in LOCATION_KEYS and before.get(k) != v)


def _comparable(cfg: TrainConfig) -> dict:
    return cfg.to_dict() | {"data": data_place(cfg.data)}


def data_place(data: str) -> str:
    """A local data folder as an absolute path, so that a run dir read from another folder (by
    export, evaluate or review) still finds its photos; a URL or "" as it is."""
    return data if not data or storage.is_url(data) else os.path.abspath(data)


def completed_run(cfg: TrainConfig) -> RunDir | None:
    """The run dir, if it already holds a finished run of this config."""
    run = RunDir(Path(cfg.out))
    if run.is_complete() and run.config.exists() and not config_changes(run.read_config(), cfg):
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
        changed = config_changes(run.read_config(), cfg)
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
    held = hold_run_dir(run.root)  # before --overwrite deletes it: another process's run is never cleared
    if overwrite and run.root.exists():
        shutil.rmtree(run.root)
        _let_go(held)  # its inode may be reused by the folder made next
    run.checkpoints.mkdir(parents=True, exist_ok=True)
    hold_run_dir(run.root)  # the folder made now, where --overwrite replaced it
    save_config(cfg.replace(data=data_place(cfg.data)), run.config)
    return run


_HELD: dict[tuple[int, int], int] = {}  # (device, inode) of each run dir this process trains in → its open fd


def hold_run_dir(root: Path) -> tuple[int, int] | None:
    """Claim the run dir for this process until `release_run_dirs` (an exclusive flock on the
    folder, let go at exit too, however it ends): a second `photoclf train` on the same --out is refused, where
    the two wrote one history, checkpoints and exports over each other."""
    if not root.is_dir():
        return None
    key = (root.stat().st_dev, root.stat().st_ino)
    if key in _HELD:
        return key
    try:
        fd = storage.flock_folder(root)
    except BlockingIOError:
        raise UserError(
            f"--out {root}: another process is training in this run dir; wait for it to end, or choose another --out"
        ) from None
    if fd is None:  # not a POSIX system: no claim, as before
        return None
    _HELD[key] = fd
    return key


def release_run_dirs() -> None:
    """Let go of every run dir this process claimed: its training has ended (a library caller
    may hand the run dir to another process next, to resume or export it)."""
    for key in list(_HELD):
        _let_go(key)


def _let_go(key: tuple[int, int] | None) -> None:
    if key in _HELD:
        os.close(_HELD.pop(key))


DATASET_FACT = "dataset"  # run_state.json's key for the sha256 of the dataset.json a run trained on


def check_trained_on(run: RunDir, fingerprint: str) -> None:
    """A run is finished (or resumable) only for the data it was trained on: one on a dataset whose
    dataset.json changed since must not hand back its old metrics as if it were today's."""
    saved = run.read_state().get(DATASET_FACT) if run.state.exists() else None
    if saved is not None and saved != fingerprint:
        raise UserError(
            f"{run.root} was trained on another version of its data (dataset.json changed since);"
            " pass --overwrite to train again on today's data, or choose another --out"
        )


def check_run_state(run: RunDir, facts: dict, write: bool = True) -> None:
    """First start: record `facts` (if `write`). Resume: they must match (e.g. the class count of a checkpoint)."""
    if run.state.exists():
        saved = run.read_state()
        for key, value in facts.items():
            if key != DATASET_FACT and key in saved and saved[key] != value:
                raise UserError(
                    f"{run.root}: checkpoint was trained with {key}={saved[key]!r}, the data now gives {value!r};"
                    " pass --overwrite to start over"
                )
        if DATASET_FACT in facts:  # after the specific ones: which fact changed says more
            check_trained_on(run, facts[DATASET_FACT])
        return
    if write:
        storage.write_json_atomic(run.state, facts)


def read_history(path: Path) -> list[dict[str, str]]:
    """history.csv's rows (HISTORY_FIELDS, as strings), one per finished epoch; none before the first."""
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))
