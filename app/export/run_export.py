"""Export a finished run: rebuild its model from the run dir (or take it in memory), write the
TF Serving SavedModel with its LiteRT file(s) and their parity check. fine_tune.py and
scripts/export.py use it."""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import keras

import app
from app import storage
from app.data.image_header import DEFAULT_MAX_MEGAPIXELS
from app.data.pipeline import dataset_fingerprint, load_dataset_info
from app.errors import UserError
from app.export.frozen import FrozenForward
from app.export.layout import read_metadata
from app.export.model_card import write_model_card
from app.export.onnx_model import write_onnx
from app.export.openvino_ir import write_openvino
from app.export.parity import Reference
from app.export.rebuild import rebuild_served_model
from app.export.saved_model import DEFAULT_TOP_K, check_new_version, export_saved_model
from app.export.tflite import write_litert
from app.models.tta import check_tta
from app.run_dir import DATASET_FACT, FinishedRun, RunDir

TFLITE_MODES = ("none", "float16", "int8")

# what the export's metadata keeps of metrics.json (the model card reads it there)
TRAINING_METRICS = ("phase1", "phase2", "test", "learning_warning", "side_features_warning", "batch_size")


def _thresholds(run: FinishedRun, metrics: dict) -> list[float] | None:
    """A multi-label run's per-label decision thresholds (0.5 each if the run chose none)."""
    if not run.multi_label:
        return None
    return (metrics.get("thresholds") or {}).get("thresholds") or [0.5] * len(run.classes)


def build_metadata(run: FinishedRun, metrics: dict) -> dict:
    return {
        "backbone": run.state["backbone"],
        "input_size": run.image_size,
        "classes": run.classes,
        "weights": run.state.get("weights"),
        "training_metrics": {k: metrics.get(k) for k in TRAINING_METRICS},
        "calibration": metrics.get("calibration"),  # served probabilities are softmax(logits / temperature)
        "dataset_fingerprint": run.state.get(DATASET_FACT) or dataset_fingerprint(run.config.data),  # as trained
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "package_version": app.__version__,
        "input": "0..255 RGB; serving_default takes encoded image bytes",
        **(_side_features(run, metrics) if run.side_features else {}),
        **({"task": "multi_label", "thresholds": _thresholds(run, metrics)} if run.multi_label else {}),
        **({"ood": metrics["ood"]} if metrics.get("ood") and not run.multi_label else {}),
    }


def _side_features(run: FinishedRun, metrics: dict) -> dict:
    """The side-feature columns the model takes, and whether they reach its answers: a run that
    left them out (app/training/side_check.py) answers photo files without them."""
    return {
        "side_features": run.side_features,
        "side_features_used": (metrics.get("side_path") or {}).get("open", True),
    }


@contextlib.contextmanager
def float32_policy() -> Iterator[None]:
    """Build models in float32 inside the block, whatever policy the run trained under."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float32")
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def _files_beside(
    finished: FinishedRun, metadata: dict, name: str, modes: list[str], tta: str, staged: Path, forward: FrozenForward
) -> dict:
    """The LiteRT files, the OpenVINO IR and the ONNX file, each with its parity check; then the
    model card. The ONNX file is converted first: its conversion needs the most memory of the
    three, and the others' runtimes are not loaded yet."""
    reference = Reference(staged, finished.config.data, finished.image_size, tta)  # one SavedModel pass for all
    onnx = write_onnx(forward, staged, reference)
    files = {**write_litert(forward, staged, reference, modes, len(finished.side_features)),
             **write_openvino(forward, staged, reference), **onnx}  # fmt: skip
    write_model_card(staged, {**metadata, **files}, finished.config.to_dict(), name)
    return files


def _check_calibration_photos(finished: FinishedRun) -> None:
    """An int8 file is calibrated on the run's training photos: where they are gone, said before
    the model is rebuilt and the SavedModel written, not after."""
    try:
        info = load_dataset_info(finished.config.data)
    except UserError as err:
        raise UserError(f"--tflite int8 is calibrated on the run's training photos: {err}") from None
    if not info.num_examples("train"):
        raise UserError(f"--tflite int8 is calibrated on the run's training photos, and {info.root} has none")


def _check_flags(tflite: str, top_k: int, tta: str, max_megapixels: float) -> None:
    """Refuse bad flags before a model is loaded."""
    if tflite not in TFLITE_MODES:
        raise UserError(f"--tflite must be one of {TFLITE_MODES}, got '{tflite}'")
    if top_k < 1:
        raise UserError(f"--top-k must be >= 1, got {top_k}")
    check_tta(tta)
    if not max_megapixels > 0:
        raise UserError(f"--max-megapixels must be > 0, got {max_megapixels}")


def export_run(
    run_dir: Path,
    *,
    export_dir: Path | None = None,
    name: str | None = None,
    version: int | None = None,
    tflite: str = "none",
    top_k: int = DEFAULT_TOP_K,
    model: keras.Model | None = None,
    metrics: dict | None = None,
    max_megapixels: float = DEFAULT_MAX_MEGAPIXELS,
    tta: str = "none",
) -> dict:
    """Returns {"saved_model": path, "litert": {mode: {file, passed, top1_agreement, ...}},
    "openvino": {file, precision: {passed, ...}}, "onnx": {file, input, float32: {...}}}: the
    float32 LiteRT file always, plus `tflite` (float16/int8) when asked, the OpenVINO IR checked
    in each precision the host runs, and the ONNX file. With `model` (the
    in-memory model at the end of training) nothing is rebuilt from the run dir's weights, unless
    it computes in reduced precision: the export is rebuilt in float32 from its final weights,
    so a mixed-precision run gets its LiteRT files too."""
    _check_flags(tflite, top_k, tta, max_megapixels)
    run = RunDir(run_dir)
    storage.check_output_folder(export_dir or run.export_root, "--export-dir")
    check_new_version(Path(export_dir) if export_dir else run.export_root, name or run.export_name, version)
    reduced = keras.config.dtype_policy().compute_dtype != "float32"  # mixed precision: the default on GPUs
    finished = run.load(need_weights=model is None or reduced)
    if tflite == "int8":
        _check_calibration_photos(finished)
    if model is None or reduced:
        with float32_policy():  # LiteRT's built-in ops run float32 graphs; the weights are float32 already
            model = rebuild_served_model(finished, metrics)
    export_dir, name = Path(export_dir) if export_dir else run.export_root, name or run.export_name
    metadata = build_metadata(finished, metrics or finished.metrics)
    modes = ["float32"] + ([tflite] if tflite != "none" else [])
    path = export_saved_model(
        model, finished.classes, finished.image_size, export_dir, name, version=version, metadata=metadata,
        top_k=top_k, max_megapixels=max_megapixels, tta=tta, side_features=finished.side_features,
        finish=partial(_files_beside, finished, metadata, name, modes, tta),
        thresholds=metadata.get("thresholds"), unknown_threshold=(metadata.get("ood") or {}).get("threshold"),
    )  # fmt: skip
    metadata = read_metadata(path)
    return {"saved_model": str(path), **{key: metadata[key] for key in ("litert", "openvino", "onnx")}}
