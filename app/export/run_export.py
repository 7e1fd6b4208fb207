"""Export a finished run: rebuild its model from the run dir (or take it in memory), write the
TF Serving SavedModel, and optionally TFLite files. fine_tune.py and scripts/export.py use it."""

from __future__ import annotations

import datetime
import hashlib
import json
from pathlib import Path

import keras

import app
from app import storage
from app.config import read_saved_config
from app.data import schema
from app.errors import UserError
from app.export.saved_model import DEFAULT_TOP_K, export_saved_model
from app.models.backbones import get_backbone, load_backbone
from app.models.classifier import build_classifier

FINAL_WEIGHTS = "model.weights.h5"
TFLITE_MODES = ("none", "float16", "int8")


def dataset_fingerprint(data_dir: str | Path) -> str:
    """sha256 of dataset.json: names the exact shards, counts and split a model was trained on."""
    path = storage.join(data_dir, schema.METADATA_FILE)
    return hashlib.sha256(storage.read_bytes(path)).hexdigest() if storage.exists(path) else "unknown"


def build_metadata(state: dict, metrics: dict, data_dir: str) -> dict:
    return {
        "backbone": state["backbone"], "input_size": state["image_size"], "classes": state["classes"],
        "weights": state.get("weights"), "training_metrics": {k: metrics.get(k) for k in ("phase1", "phase2", "test")},
        "dataset_fingerprint": dataset_fingerprint(data_dir),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "package_version": app.__version__, "input": "0..255 RGB; serving_default takes encoded image bytes",
    }


def load_run(run_dir: Path) -> tuple[keras.Model, dict, dict, str]:
    """(model with the run's final weights, run_state, metrics, data dir) from a finished run dir."""
    run_dir = Path(run_dir)
    state_path, weights_path = run_dir / "run_state.json", run_dir / FINAL_WEIGHTS
    if not state_path.exists() or not weights_path.exists():
        raise UserError(f"{run_dir}: not a finished run (needs run_state.json and {FINAL_WEIGHTS}); run fine_tune.py first")
    state = json.loads(state_path.read_text())
    cfg = read_saved_config(run_dir / "config.json")
    spec = get_backbone(state["backbone"])
    backbone, _ = load_backbone(spec, state["image_size"], "auto" if spec.hub_handle else "none")
    clf = build_classifier(spec, backbone, len(state["classes"]), state["image_size"], cfg.dropout)
    clf.model.load_weights(str(weights_path))
    metrics_path = run_dir / "metrics.json"
    metrics = json.loads(metrics_path.read_text()) if metrics_path.exists() else {}
    return clf.model, state, metrics, cfg.data


def export_run(
    run_dir: Path, *, export_dir: Path | None = None, name: str | None = None, version: int | None = None,
    tflite: str = "none", top_k: int = DEFAULT_TOP_K, model: keras.Model | None = None, metrics: dict | None = None,
) -> dict[str, str]:
    """Returns {"saved_model": path, ["tflite": path, "tflite_parity": path]}."""
    if tflite not in TFLITE_MODES:
        raise UserError(f"--tflite must be one of {TFLITE_MODES}, got '{tflite}'")
    if top_k < 1:
        raise UserError(f"--top-k must be >= 1, got {top_k}")
    run_dir = Path(run_dir)
    if model is None:
        model, state, saved_metrics, data_dir = load_run(run_dir)
        metrics = metrics or saved_metrics
    else:
        state = json.loads((run_dir / "run_state.json").read_text())
        data_dir = read_saved_config(run_dir / "config.json").data
    export_dir = Path(export_dir) if export_dir else run_dir / "export"
    name = name or (run_dir.resolve().name or "model")
    metadata = build_metadata(state, metrics or {}, data_dir)
    path = export_saved_model(model, state["classes"], state["image_size"], export_dir, name, version=version,
                              metadata=metadata, top_k=top_k)
    result = {"saved_model": str(path)}
    if tflite != "none":
        from app.export.tflite import export_tflite

        result.update(export_tflite(model, path, state["classes"], state["image_size"], data_dir, tflite,
                                    export_dir / f"{name}-tflite" / path.name))
    return result
