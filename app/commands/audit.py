"""Audit a photo dataset before trusting a number: duplicates, leaks, likely wrong labels, outliers.

    photoclf audit photos/                                  # class folders (or train/ val/ [test/])
    photoclf audit photos.csv --write-manifest reviewed.csv # then edit it and convert it
    photoclf audit data/                                    # a TFRecord folder from photoclf convert

Writes REPORT/audit.json (every finding), REPORT/report.html (one self-contained page) and
REPORT/embeddings.npz (reused by the next audit of the same files), and prints a summary.
--write-manifest writes a CSV that `photoclf convert` accepts: review it (flip labels, set
keep=false), then convert it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from app.cli import finite_float
from app.storage import must_exist

HELP = "audit a photo dataset before trusting a number: duplicates, leaks, likely wrong labels, outliers"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "data", type=Path, help="class folders, a train/val[/test] tree, a CSV manifest, or a TFRecord folder"
    )
    p.add_argument("--report", type=Path, default=None, help="report folder (default: DATA's sibling DATA-audit/)")
    p.add_argument(
        "--write-manifest", type=Path, default=None, metavar="FILE", help="also write a review manifest (CSV)"
    )
    p.add_argument("--backbone", default="mobilenet_v2", help="backbone for the embeddings (default mobilenet_v2)")
    p.add_argument(
        "--weights", default="auto", help="auto | imagenet | PATH (default auto: $PHOTOCLF_WEIGHTS, else ImageNet)"
    )
    p.add_argument(
        "--near-threshold",
        type=finite_float,
        default=0.85,
        help="cosine similarity of embeddings at or above which two images are near duplicates (default 0.85)",
    )


def run(args: argparse.Namespace) -> None:
    must_exist(args.data)  # said before TensorFlow's seconds of import
    from app.audit.audit import run_audit
    from app.audit.report import summary

    result, written = run_audit(
        args.data,
        args.report,
        args.write_manifest,
        backbone=args.backbone,
        weights=args.weights,
        near_threshold=args.near_threshold,
    )
    print(summary(result))
    print("\n" + "\n".join(f"wrote {path}" for path in written))
