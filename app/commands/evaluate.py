"""Evaluate an exported model on a TFRecord split or an image folder: table, metrics, figures, HTML.

    photoclf evaluate runs/demo --data datasets/demo/tfrecords --split test
    photoclf evaluate exports/shapes/3 --data ~/new_photos --label-map names.json
    photoclf evaluate runs/photos --data data/ --split test --ood ~/photos_of_other_things

MODEL_DIR is a run dir (its newest export), EXPORT_DIR/<name> (newest version), EXPORT_DIR of one model or a version
folder. The model is called on raw image bytes through the runtime --runtime names, as
`photoclf serve` calls it: what is measured is what is deployed.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from app.cli import add_runtime_flag, lasting_imports
from app.errors import UserError
from app.export.layout import resolve_model_dir
from app.run_dir import RunDir

HELP = "evaluate an exported model on a TFRecord split or an image folder: table, metrics, figures, HTML"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model_dir", type=Path, help="run dir, EXPORT_DIR/<name>, or EXPORT_DIR/<name>/<version>")
    p.add_argument(
        "--data",
        default=None,
        help="TFRecord folder or gs:// URL (photoclf convert), or a local folder of class folders (required)",
    )
    p.add_argument("--split", default="val", help="split of a TFRecord folder (default val)")
    p.add_argument(
        "--report",
        type=Path,
        default=None,
        help="report folder (default RUN_DIR/reports/<name>-v<version>-<split> for an export in its run dir,"
        " else EXPORT_DIR/<name>-reports/v<version>-<split>; photos-<folder name> for a folder of photos)",
    )
    p.add_argument("--label-map", type=Path, default=None, help="JSON {dataset class: model class} when names differ")
    p.add_argument("--top-k", type=int, default=5, help="k for top-k accuracy (default 5)")
    add_runtime_flag(p)
    p.add_argument(
        "--tta",
        choices=["none", "flip"],
        default="none",
        help="flip: average each image's probabilities with its mirror's (2x the compute; default none)",
    )
    p.add_argument(
        "--ood",
        default=None,
        help="photos of other things (a folder, or a TFRecord folder's --split): how well the export's"
        ' "unknown" answer separates them from --data (AUROC, counts, a histogram in the report)',
    )


def run(args: argparse.Namespace) -> None:
    version = resolve_model_dir(args.model_dir)  # no model there: said before TensorFlow's seconds of import
    if args.data is None:
        raise UserError(_data_needed(args.model_dir, version))
    with lasting_imports():
        from app.evaluation.evaluate import evaluate

    result = evaluate(
        args.model_dir,
        args.data,
        split=args.split,
        report_dir=args.report,
        label_map=args.label_map,
        top_k=args.top_k,
        runtime=args.runtime,
        tta=args.tta,
        ood=args.ood,
    )
    print(result.summary)
    if result.metrics["skipped"]:
        print(
            f"skipped {len(result.metrics['skipped'])} file(s): unreadable, undecodable or over the model's pixel"
            " limit (metrics.json lists each with why)"
        )
    print(f"\nreport: {result.html}\nmetrics: {result.report_dir / 'metrics.json'}")


def _data_needed(model_dir: Path, version: Path) -> str:
    """--data left out: what to give, and the command for the data the model's run trained on."""
    said = "--data is required: the photos to evaluate on (a TFRecord folder from photoclf convert, or class folders)"
    run = RunDir.of_export(version)
    try:
        data = run.read_config().data if run is not None else ""
    except UserError:  # a config this code cannot read: no command to offer
        data = ""
    if data:
        said += f"; its run trained on {data}, whose test split it never saw: photoclf evaluate {model_dir}"
    return f"{said} --data {data} --split test" if data else said
