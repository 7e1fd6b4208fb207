"""evaluate(): an export on a TFRecord split or an image folder → metrics, figures, HTML report.

The model is called through its serving signature on raw image bytes (app.evaluation.predictions),
so what is measured is what will be deployed.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from app import storage
from app.data import schema
from app.data.display import MISTAKE_SIDE
from app.data.pipeline import load_dataset_info
from app.data.sources import check_out_beside_src
from app.errors import UserError
from app.evaluation.figures import (
    plot_confusion_matrix,
    plot_learning_curves,
    plot_mistakes,
    plot_per_class,
    plot_reliability,
)
from app.evaluation.leaks import without_leaks
from app.evaluation.metrics import calibration_effect, compute_metrics
from app.evaluation.ood import check_ood_source, ood_metrics, ood_scores, plot_ood_histogram
from app.evaluation.predictions import (
    Predictions,
    folder_examples,
    label_mapping,
    load_label_map,
    predict,
    tfrecord_examples,
)
from app.evaluation.report import summary_table, write_html, write_metrics
from app.export.layout import read_classes, read_metadata, reports_dir, resolve_model_dir
from app.inference.runtime import HostRuntime, TFRuntime, load_runtime
from app.models.tta import check_tta
from app.run_dir import RunDir

log = logging.getLogger(__name__)


@dataclass
class EvaluationResult:
    metrics: dict
    figures: dict[str, Path]
    report_dir: Path
    html: Path
    predictions: Predictions

    @property
    def summary(self) -> str:
        return summary_table(self.metrics)


def default_report_dir(version_dir: Path, split: str) -> Path:
    """Independent of the working directory: RUN_DIR/reports/NAME-vVERSION-SPLIT for an export
    inside its run dir, else EXPORT_DIR/NAME-reports/vVERSION-SPLIT beside the model folder."""
    name, version = version_dir.parent.name, version_dir.name
    run = RunDir.of_export(version_dir)
    if run is not None:
        return run.reports / f"{name}-v{version}-{split}"
    return reports_dir(version_dir) / f"v{version}-{split}"


def _is_records(data: str) -> bool:
    return storage.exists(storage.join(data, schema.METADATA_FILE))


def _evaluated_on(data: str, split: str) -> str:
    """What a report is named after: a TFRecord folder's split, or a folder of photos' own name
    (as photos-NAME, so that it never takes the place of a split's report)."""
    return split if _is_records(data) else f"photos-{Path(data).resolve().name}"


def _examples(data: str, split: str):
    storage.check_url(data, "--data")
    if _is_records(data):
        return tfrecord_examples(data, split)
    if not storage.is_url(data) and Path(data).is_dir():
        return folder_examples(data)
    raise UserError(f"--data {data}: neither a TFRecord folder (dataset.json) nor a folder of class folders")


def _check_report(report: Path, data: str) -> None:
    """A folder that can hold the report, and not inside a --data folder of photos, whose next
    convert would read its files as photos."""
    storage.check_output_folder(report, "--report")
    if not storage.is_url(data) and not _is_records(data):
        check_out_beside_src(Path(data), report, "--report", "--data")


def _check_task(version_dir: Path, data: str) -> None:
    """A multi-label model needs multi-label data (TFRecords written with --multi-label), and
    a single-label model single-label data: their labels mean different things."""
    model_task = read_metadata(version_dir).get("task", "single_label")
    data_task = load_dataset_info(data).task if _is_records(data) else "single_label"
    if model_task != data_task:
        raise UserError(
            f"--data {data}: {data_task.replace('_', '-')} data for a {model_task.replace('_', '-')} model"
            " (a multi-label model is evaluated on TFRecords written with --multi-label)"
        )


def _figures(metrics: dict, predictions: Predictions, explainer: Future, out: Path) -> dict[str, Path]:
    figures = {
        "Confusion matrix": plot_confusion_matrix(
            metrics["confusion_matrix"], predictions.classes, out / "confusion_matrix.png"
        ),
        "Per-class precision, recall, F1": plot_per_class(metrics, out / "per_class.png"),
        "Reliability diagram": plot_reliability(metrics, out / "reliability.png"),
    }
    mistakes = plot_mistakes(predictions.mistakes, out / "mistakes.jpg")
    if mistakes:
        figures["Most confident mistakes"] = mistakes
        why = _mistakes_explained(predictions, explainer, out / "mistakes_gradcam.jpg")
        if why:
            figures["Most confident mistakes: where the model looked (Grad-CAM of the predicted class)"] = why
    run = RunDir.of_export(Path(metrics["model"]))
    if run is not None and run.history.exists():
        figures["Learning curves"] = plot_learning_curves(run.history, out / "learning_curves.png")
    return figures


def _explainer_in_background(version_dir: Path, executor: ThreadPoolExecutor) -> Future:
    """The Grad-CAM explainer of the mistakes figure, built and traced while the photos are
    predicted: model building and tracing are mostly one thread of Python, so beside the
    prediction they cost the report little of its wall time."""

    def build():
        from app.inference.explain import PhotoExplainer

        explainer = PhotoExplainer(version_dir)
        explainer.warm_up()
        return explainer

    return executor.submit(build)


def _mistakes_explained(predictions: Predictions, explainer: Future, path: Path) -> Path | None:
    """The mistakes again, each with the Grad-CAM map of the class it was taken for; None (and
    why, in the log) where the export is not in its run dir or its model cannot be explained."""
    from app.models.gradcam import overlay

    try:
        explainer = explainer.result()
    except UserError as err:
        log.info("no Grad-CAM of the mistakes: %s", err)
        return None
    mistakes = predictions.mistakes
    ids = [predictions.classes.index(m["predicted"]) for m in mistakes]
    heatmaps = explainer.heatmaps([m["image"] for m in mistakes], ids, max_side=MISTAKE_SIDE)
    shown = [overlay(photo, heat) for photo, heat in heatmaps]
    return plot_mistakes(mistakes, path, shown=shown, title="Where the model looked for the class it chose")


def _check_ood(version_dir: Path, ood: str) -> None:
    if "ood" not in read_metadata(version_dir):
        raise UserError(
            f"--ood: {version_dir} has no out-of-distribution score (a multi-label model, or one exported"
            " before it existed: train it again to get one)"
        )
    check_ood_source(ood)


def _ood_metrics(
    version_dir: Path, ood: str, split: str, predictions: Predictions, runtime: TFRuntime | HostRuntime, tta: str
) -> dict:
    known = predictions.ood_scores
    correct = predictions.probabilities.argmax(axis=1) == predictions.labels
    other, skipped = ood_scores(runtime, ood, split, tta)
    return ood_metrics(known, other, float(read_metadata(version_dir)["ood"]["threshold"]), correct, skipped)


def _multilabel_result(
    predictions: Predictions, version_dir: Path, data: str, split: str, report_dir: Path
) -> EvaluationResult:
    """Per-label figures at the export's own thresholds, mAP and exact match (app.evaluation.multilabel)."""
    from app.evaluation.multilabel import compute_multilabel_metrics
    from app.evaluation.multilabel_report import plot_label_confusion, plot_per_label

    thresholds = read_metadata(version_dir)["thresholds"]
    metrics = compute_multilabel_metrics(predictions.labels, predictions.probabilities, thresholds, predictions.classes)
    metrics.update(_what_was_evaluated(predictions, version_dir, data, split))
    out = _report_folder(report_dir)
    figures = {
        "Per label: precision, recall, F1, AP": plot_per_label(metrics, out / "per_label.png"),
        "Per label: true (rows) vs predicted (columns)": plot_label_confusion(metrics, out / "label_confusion.png"),
    }
    return _written(metrics, figures, out, predictions, version_dir, data, split)


def temperature_effect(predictions: Predictions, calibration: dict | None) -> dict | None:
    """The model serves softmax(logits / T): the figures without T, beside the served ones. None
    where the run fitted no temperature (T = 1 changes nothing)."""
    if not calibration or "not_fitted" in calibration:
        return None
    return calibration_effect(predictions.labels, predictions.probabilities, calibration["temperature"])


def _what_was_evaluated(predictions: Predictions, version_dir: Path, data: str, split: str) -> dict:
    """The fields every metrics.json starts with: which model, on what, and how it ran."""
    return {
        "model": str(version_dir),
        "data": str(data),
        "split": split if _is_records(data) else None,  # a folder of photos is not a split
        "skipped": predictions.skipped,
        "runtime": predictions.runtime,
    }


def _report_folder(report_dir: Path) -> Path:
    report_dir.mkdir(parents=True, exist_ok=True)
    return report_dir


def _written(
    metrics: dict, figures: dict, out: Path, predictions: Predictions, version_dir: Path, data: str, split: str
) -> EvaluationResult:
    """metrics.json and report.html in `out`, the figures already there."""
    write_metrics(metrics, out / "metrics.json")
    where = data.rstrip("/").split("/")[-1] + (f"/{split}" if metrics["split"] else "")
    title = f"{version_dir.parent.name} v{version_dir.name} on {where}"
    return EvaluationResult(
        metrics, figures, out, write_html(metrics, figures, out / "report.html", title), predictions
    )


def _check_request(
    version_dir: Path, metadata: dict, data: str, report_dir: Path, tta: str, ood: str | Path | None
) -> None:
    """What can be refused before the photos are read or the model loaded."""
    baked = metadata.get("tta", "none")
    if check_tta(tta) != "none" and baked != "none":
        raise UserError(f"--tta {tta}: {version_dir} already applies '{baked}' test-time augmentation in its graph")
    _check_report(report_dir, data)
    _check_task(version_dir, data)
    if ood is not None:
        _check_ood(version_dir, str(ood))


def evaluate(
    model: str | Path,
    data: str | Path,
    *,
    split: str = "val",
    report_dir: str | Path | None = None,
    label_map: str | Path | dict | None = None,
    top_k: int = 5,
    batch_size: int = 32,
    runtime: str = "auto",
    tta: str = "none",
    ood: str | Path | None = None,
) -> EvaluationResult:
    """`ood`: photos of other things (a folder, or a TFRecord folder's `split`), to measure the
    export's "none of these" against the evaluation photos (app.evaluation.ood). `runtime`: as
    app.inference.runtime.load_runtime; `auto` measures what `photoclf serve` runs on this host."""
    version_dir = resolve_model_dir(model)
    metadata = read_metadata(version_dir)
    data = str(data)
    report_dir = Path(report_dir) if report_dir else default_report_dir(version_dir, _evaluated_on(data, split))
    _check_request(version_dir, metadata, data, report_dir, tta, ood)
    data_classes, total, examples = _examples(data, split)
    mapping = label_map if isinstance(label_map, dict) or label_map is None else load_label_map(label_map)
    if total == 0:
        raise UserError("the evaluation data is empty")
    label_mapping(data_classes, read_classes(version_dir), mapping)  # a class the model lacks: said before it loads
    loaded = load_runtime(version_dir, runtime, batch=min(batch_size, total))
    with ThreadPoolExecutor(1) as background:
        multi_label = metadata.get("task") == "multi_label"
        explainer = None if multi_label else _explainer_in_background(version_dir, background)
        predictions = predict(
            version_dir,
            data_classes,
            total,
            examples,
            label_map=mapping,
            batch_size=batch_size,
            runtime=loaded,
            tta=tta,
        )
        if multi_label:
            return _multilabel_result(predictions, version_dir, data, split, report_dir)
        return _single_label_result(
            predictions, version_dir, metadata, data, split, report_dir, top_k, ood, loaded, tta, explainer
        )


def _single_label_result(
    predictions: Predictions,
    version_dir: Path,
    metadata: dict,
    data: str,
    split: str,
    report_dir: Path,
    top_k: int,
    ood: str | Path | None,
    runtime: TFRuntime | HostRuntime,
    tta: str,
    explainer: Future,
) -> EvaluationResult:
    baked = metadata.get("tta", "none")
    metrics = compute_metrics(predictions.labels, predictions.probabilities, predictions.classes, top_k)
    effect = temperature_effect(predictions, metadata.get("calibration"))
    if effect:
        metrics["calibration"] = effect
    metrics.update(_what_was_evaluated(predictions, version_dir, data, split))
    metrics["tta"] = baked if baked != "none" else tta  # baked into the export, or added here
    leaks = without_leaks(predictions, data, split) if _is_records(data) else None
    if leaks:
        metrics["without_leaks"] = leaks
    out = _report_folder(report_dir)
    figures = _figures(metrics, predictions, explainer, out)
    if ood is not None:
        metrics["ood"] = _ood_metrics(version_dir, str(ood), split, predictions, runtime, tta)
        figures["None of these: scores of the evaluation photos and the other photos"] = plot_ood_histogram(
            metrics["ood"], out / "ood_scores.png"
        )
    return _written(metrics, figures, out, predictions, version_dir, data, split)
