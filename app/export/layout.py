"""The export layout, owned here; every reader and writer of an export asks this module.

    EXPORT_DIR/NAME/VERSION/                 TF Serving's layout: numbered versions, newest served
        saved_model.pb, variables/
        assets/labels.txt                    app.labels format
        assets/metadata.json                 backbone, input size, classes, training metrics, LiteRT parity, ...
        litert/model_<mode>.tflite           float32 always (the CPU runtime); float16/int8 on request
    EXPORT_DIR/NAME-reports/                 evaluation reports of an export outside any run dir
    EXPORT_DIR/NAME/.incomplete-*            an export being written (servers skip it)

A run dir keeps its exports in RUN_DIR/export (see app.run_dir).
"""

from __future__ import annotations

import json
from pathlib import Path

from app.errors import UserError
from app.labels import LABELS_FILE, read_labels

SAVED_MODEL_FILE = "saved_model.pb"
ASSETS = "assets"
METADATA_FILE = "metadata.json"
STAGING_PREFIX = ".incomplete-"


def is_version_dir(path: Path) -> bool:
    return (Path(path) / SAVED_MODEL_FILE).is_file()


def versions(model_dir: Path) -> list[int]:
    """Complete versions under EXPORT_DIR/NAME, oldest first."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        return []
    return sorted(int(p.name) for p in model_dir.iterdir() if p.name.isdigit() and is_version_dir(p))


def served_versions(model_dir: Path) -> list[int]:
    """`versions`, or a UserError saying why a server could not start on `model_dir`. Needs no
    TensorFlow, so serve.py says it before spending seconds importing it."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise UserError(f"{model_dir}: no such model folder (expected EXPORT_DIR/<name> with version subfolders)")
    found = versions(model_dir)
    if not found:
        raise UserError(f"{model_dir}: no version folders holding a {SAVED_MODEL_FILE}")
    return found


def latest_version(model_dir: Path) -> Path | None:
    found = versions(model_dir)
    return Path(model_dir) / str(found[-1]) if found else None


def next_version(model_dir: Path) -> int:
    """One above every numbered folder, complete or not: a version number is never reused."""
    model_dir = Path(model_dir)
    taken = [int(p.name) for p in model_dir.iterdir() if p.name.isdigit()] if model_dir.is_dir() else []
    return max(taken, default=0) + 1


def version_dir(export_root: Path, name: str, version: int) -> Path:
    return Path(export_root) / name / str(version)


def reports_dir(version: Path) -> Path:
    """Where evaluation reports of an export go when it is not inside a run dir (beside the model
    folder: TF Serving only looks inside EXPORT_DIR/NAME)."""
    version = Path(version)
    return version.parent.parent / f"{version.parent.name}-reports"


def tflite_model_path(version: Path, mode: str) -> Path:
    """Inside the version folder, so a version's LiteRT files appear and disappear with it
    (TF Serving ignores the extra folder)."""
    return Path(version) / "litert" / f"model_{mode}.tflite"


def labels_path(version: Path) -> Path:
    return Path(version) / ASSETS / LABELS_FILE


def metadata_path(version: Path) -> Path:
    return Path(version) / ASSETS / METADATA_FILE


def read_classes(version: Path) -> list[str]:
    if not labels_path(version).exists():
        raise UserError(f"{version}: no {ASSETS}/{LABELS_FILE}; export it with photoclf export")
    return read_labels(labels_path(version))


def read_metadata(version: Path) -> dict:
    path = metadata_path(version)
    return json.loads(path.read_text()) if path.exists() else {}


def resolve_model_dir(path: str | Path) -> Path:
    """A version folder as is; a model folder → its newest version; a run dir → the newest
    version of its first exported model."""
    from app.run_dir import RunDir

    path = Path(path)
    if is_version_dir(path):
        return path
    export_root = RunDir(path).export_root
    models = sorted(p for p in export_root.iterdir() if p.is_dir()) if export_root.is_dir() else []
    for model_dir in [path, *models]:
        newest = latest_version(model_dir)
        if newest is not None:
            return newest
    raise UserError(f"{path}: no SavedModel found (give EXPORT_DIR/<name>[/<version>] or a run dir with export/)")
