"""Predict labels for unlabelled photos with an exported model: CSV, JSONL or JSON, one row per file.

    photoclf predict runs/demo ~/new_photos                      # → predictions.csv
    photoclf predict runs/demo/export/demo "shots/**/*.jpg" --output out.jsonl
    photoclf predict exports/pets/3 paths.txt --top-k 1          # .txt/.csv list of paths
    photoclf predict runs/demo ~/new_photos --explain why/       # + a Grad-CAM map of each top label

MODEL_DIR is a run dir (its newest export), EXPORT_DIR/<name> (newest version), EXPORT_DIR of one model or a version
folder. INPUT is a folder (searched recursively), a glob (quote it), a .txt/.csv file of
paths or one photo. Rows: path, answer (the top label, or "unknown"), label_1, score_1, ..., unknown,
ood_score ("none of these": the photo is unlike the training photos), error. Files that cannot
be read, are not images or are over the model's pixel limit get their reason in `error` and
never stop the run; they are also listed at the end. The output appears only when complete.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from app.cli import add_export_run_flags, lasting_imports
from app.data.photo_lists import check_input, evaluate_instead
from app.errors import UserError
from app.export.layout import check_takes_photos_alone, resolve_model_dir
from app.run_dir import RunDir

SHOW_FAILED = 10


HELP = "predict labels for unlabelled photos with an exported model: CSV, JSONL or JSON, one row per file"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_export_run_flags(p)
    p.add_argument("input", help="folder of photos, glob pattern, .txt/.csv file of paths, or one photo")
    p.add_argument(
        "--output",
        type=Path,
        default=Path("predictions.csv"),
        help="CSV; JSONL (a row a line) when it ends in .jsonl, a JSON array when in .json (default predictions.csv)",
    )
    p.add_argument(
        "--format", choices=["csv", "jsonl", "json"], default=None, help="override the format the suffix implies"
    )
    p.add_argument("--top-k", type=int, default=5, help="labels per photo (default 5, at most the classes)")
    p.add_argument(
        "--explain",
        type=Path,
        default=None,
        help="folder for a Grad-CAM map of each photo's top label: PATH.overlay.png and PATH.cam.npy"
        " (float32, the photo's height x width, in [0, 1]) under each photo's relative path;"
        " needs the export's run dir",
    )


def run(args: argparse.Namespace) -> None:
    version = resolve_model_dir(args.model_dir)  # no model there: said before TensorFlow's seconds of import
    if args.explain is not None and RunDir.of_export(version) is None:
        raise UserError(f"--explain: {version} is not inside its run dir; Grad-CAM needs the run's weights")
    check_takes_photos_alone(version)  # before the import, too
    check_input(args.input, tfrecords_hint=evaluate_instead(args.model_dir, args.input))
    with lasting_imports():
        from app.inference.batch_predict import predict_files

    summary = predict_files(
        args.model_dir,
        args.input,
        args.output,
        runtime=args.runtime,
        top_k=args.top_k,
        batch_size=args.batch_size,
        fmt=args.format,
        explain=args.explain,
    )
    if summary.warning:
        print(f"WARNING: {summary.warning}")
    print(f"{summary.predicted} photo(s) predicted ({summary.runtime}) → {summary.output}")
    if summary.unknown:
        print(f"{summary.unknown} of them answered unknown: none of the model's classes (answer column 'unknown')")
    if summary.no_label:
        print(f"{summary.no_label} of them with no label at or above its threshold (an empty answer)")
    if args.explain:
        print(f"Grad-CAM maps of the top labels → {args.explain}")
    if summary.failed:
        print(f"{len(summary.failed)} file(s) could not be predicted:")
        for row in summary.failed[:SHOW_FAILED]:
            print(f"  {row['path']}: {row['error']}")
        if len(summary.failed) > SHOW_FAILED:
            print(f"  ... and {len(summary.failed) - SHOW_FAILED} more (see the error column)")
