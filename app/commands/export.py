"""Export a finished run as a TF Serving SavedModel (image bytes in), with its CPU runtimes' files.

    photoclf export runs/demo                        # → runs/demo/export/demo/<next version>
    photoclf export runs/demo --export-dir /models --name shapes --tflite int8

TF Serving layout: EXPORT_DIR/NAME/VERSION/{saved_model.pb, variables/, assets/}, beside them
the float32 LiteRT file (litert/), the OpenVINO IR (openvino/), the ONNX file (onnx/) and the
model card. Each file is checked against the SavedModel on the validation split, and the result
stored in assets/metadata.json: a runtime refuses a file whose check failed. Written to a hidden
temp dir and renamed when complete; an existing version is never overwritten.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from app.cli import finite_float, lasting_imports
from app.run_dir import RunDir

HELP = "export a finished run as a TF Serving SavedModel (image bytes in) with its LiteRT file(s)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, help="run directory written by photoclf train")
    p.add_argument("--export-dir", type=Path, default=None, help="base folder (default RUN_DIR/export)")
    p.add_argument(
        "--name",
        default=None,
        help="model name (default: the run dir's name, each character other than a letter, digit, _ - . made _)",
    )
    p.add_argument("--version", type=int, default=None, help="version number (default: the next free one)")
    p.add_argument("--top-k", type=int, default=5, help="classes returned per image (default 5)")
    p.add_argument(
        "--tflite",
        choices=["none", "float16", "int8"],
        default="none",
        help="also write this smaller LiteRT file for phones (the float32 one is always written; default none)",
    )
    p.add_argument(
        "--tta",
        choices=["none", "flip"],
        default="none",
        help="flip: every signature averages each image with its mirror (2x the compute; default none)",
    )
    p.add_argument(
        "--max-megapixels",
        type=finite_float,
        default=70.0,
        help="the serving signature refuses images larger than this, from the header (default 70)",
    )


def run(args: argparse.Namespace) -> None:
    RunDir(args.run_dir).load()  # not a finished run: said before TensorFlow's seconds of import
    with lasting_imports():
        from app.export.run_export import export_run

    paths = export_run(
        args.run_dir,
        export_dir=args.export_dir,
        name=args.name,
        version=args.version,
        tflite=args.tflite,
        top_k=args.top_k,
        max_megapixels=args.max_megapixels,
        tta=args.tta,
    )
    from app.export import layout
    from app.export.parity import parity_lines

    print(f"model: {paths['saved_model']}")
    print("\n".join(parity_lines(paths)))
    print(f"every check's figures: {layout.metadata_path(Path(paths['saved_model']))}")
