""""None of these": every out-of-distribution score of app.models.ood, measured on held-out photos.

    python -m benchmarks.ood RUN_DIR [RUN_DIR ...] --train F/train --val F/val --test F/test \\
        --near HELD_OUT_CLASSES --far OTHER_PHOTOS

Each RUN_DIR is a finished run (one per seed) trained on the classes of --train. For every run,
the pooled backbone features, logits and calibrated probabilities of each folder's photos are
computed with the export's own eval decode; the feature statistics (kNN bank, class means,
covariance) are fitted on --train, each method's threshold on --val (95% accepted), and its
scores compared on --test (in distribution) against --near (classes the runs never saw, of the
same kind) and --far (photos of something else). The last row is the score every export ships
(app.models.ood.SHIPPED) with the statistics its run fitted (`ood_score.npz`; fitted here from
--train and --val for a run that has none). Prints a table of mean ± half the spread
over the runs, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

from app.cli import run_cli
from app.errors import UserError
from app.export.rebuild import rebuild_served_model
from app.models import ood
from app.table import format_table

BATCH = 32


def folder_photos(folder: Path) -> tuple[list[Path], np.ndarray]:
    """Every file below `folder`, with its class folder's index (sorted names) as the label."""
    from app.data.sources import class_dirs, list_files

    classes = class_dirs(folder)
    if not classes:
        raise UserError(f"{folder}: no class folders")
    files = [(f, i) for i, c in enumerate(classes) for f in list_files(c)]
    return [f for f, _ in files], np.array([i for _, i in files])


def run_outputs(run_dir: Path):
    """(images bytes → (features, logits, probabilities)), the run's temperature."""
    import keras
    import tensorflow as tf

    from app.data.preprocess import DEFAULT_CROP_FRACTION, decode_batch
    from app.run_dir import RunDir

    finished = RunDir(run_dir).load()
    model = rebuild_served_model(finished)
    probabilities = model.output["probabilities"] if isinstance(model.output, dict) else model.output
    pieces = keras.Model(
        model.inputs, [model.get_layer("pool").output, model.get_layer("logits").output, probabilities]
    )
    size = finished.image_size
    decode = tf.function(lambda b: decode_batch(b, size, DEFAULT_CROP_FRACTION, 100.0), autograph=False)

    def outputs(paths: list[Path]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        parts = []
        for i in range(0, len(paths), BATCH):
            images = decode(tf.constant([p.read_bytes() for p in paths[i : i + BATCH]]))
            parts.append([t.numpy() for t in pieces(tf.cast(images, tf.float32), training=False)])
        return tuple(np.concatenate(column) for column in zip(*parts))

    return outputs, float((finished.metrics.get("calibration") or {}).get("temperature", 1.0))


def measure_run(run_dir: Path, folders: dict[str, Path]) -> dict[str, dict[str, float]]:
    outputs, temperature = run_outputs(run_dir)
    sets = {}
    for name, folder in folders.items():
        paths, labels = folder_photos(folder)
        features, logits, probabilities = outputs(paths)
        sets[name] = {"features": features, "logits": logits, "probabilities": probabilities, "labels": labels}
    stats = ood.fit_feature_stats(sets["train"]["features"], sets["train"]["labels"])
    result = {}
    for method in ood.METHODS:
        score = {
            name: ood.scores(
                method,
                probabilities=s["probabilities"],
                logits=s["logits"],
                features=s["features"],
                stats=stats,
                temperature=temperature,
            )
            for name, s in sets.items()
            if name != "train"
        }
        result[method] = method_figures(score, sets["test"])
    from app.run_dir import RunDir

    shipped = RunDir(run_dir).read_ood_score() or ood.fit_shipped(
        sets["train"]["features"], sets["train"]["labels"], sets["val"]["features"], sets["val"]["probabilities"]
    )  # what the run's export computes, as the run fitted it (or, for an older run, fitted here)
    score = {
        name: shipped(s["probabilities"], s["features"], s["logits"]) for name, s in sets.items() if name != "train"
    }
    result[f"{ood.SHIPPED} (shipped)"] = method_figures(score, sets["test"])
    return result


def method_figures(score: dict[str, np.ndarray], test: dict[str, np.ndarray]) -> dict[str, float]:
    threshold = ood.threshold_for(score["val"])
    accepted = score["test"] <= threshold
    right = test["probabilities"].argmax(axis=1) == test["labels"]
    return {
        "auroc_near": ood.auroc(score["test"], score["near"]),
        "auroc_far": ood.auroc(score["test"], score["far"]),
        "fpr95_near": ood.fpr_at_tpr(score["test"], score["near"]),
        "fpr95_far": ood.fpr_at_tpr(score["test"], score["far"]),
        "test_accepted": float(accepted.mean()),
        "far_unknown": float((score["far"] > threshold).mean()),
        "near_unknown": float((score["near"] > threshold).mean()),
        "accuracy_accepted": float(right[accepted].mean()) if accepted.any() else float("nan"),
        "accuracy_all": float(right.mean()),
    }


FIGURES = ("auroc_near", "auroc_far", "fpr95_near", "fpr95_far", "test_accepted", "near_unknown", "far_unknown",
           "accuracy_accepted")  # fmt: skip


def summarise(per_run: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, list[float]]]:
    """method → figure → [mean, spread (max - min)] over the runs."""
    return {
        method: {
            key: [
                round(statistics.mean(r[method][key] for r in per_run), 4),
                round(max(r[method][key] for r in per_run) - min(r[method][key] for r in per_run), 4),
            ]
            for key in FIGURES
        }
        for method in per_run[0]
    }


def format_summary(summary: dict[str, dict[str, list[float]]], runs: int) -> str:
    rows = [["method", *FIGURES]]
    for method, figures in summary.items():
        rows.append([method, *(f"{mean:.3f} ± {spread / 2:.3f}" for mean, spread in (figures[k] for k in FIGURES))])
    return f"{runs} run(s), mean ± half the spread\n" + format_table(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", type=Path, nargs="+", help="finished runs trained on --train's classes (one per seed)")
    for name, what in (
        ("train", "the runs' training photos (feature statistics)"),
        ("val", "their validation photos (thresholds)"),
        ("test", "their test photos (in distribution)"),
        ("near", "photos of classes the runs never saw, of the same kind"),
        ("far", "photos of something else"),
    ):
        p.add_argument(f"--{name}", type=Path, required=True, help=f"folder of class folders: {what}")
    args = p.parse_args()
    folders = {name: getattr(args, name) for name in ("train", "val", "test", "near", "far")}
    for name, folder in folders.items():
        if not folder.is_dir():
            raise UserError(f"--{name} {folder}: no such folder")
    per_run = [measure_run(run, folders) for run in args.runs]
    summary = summarise(per_run)
    print(format_summary(summary, len(per_run)))
    print(json.dumps({"runs": len(per_run), "methods": summary}))


if __name__ == "__main__":
    run_cli(main)
