"""Which backbone for your photos? Ranks candidates by a linear probe on their frozen features.

    photoclf compare-backbones data/ --backbones mobilenet_v2,efficientnet_b0,convnext_tiny
    photoclf compare-backbones data/ --backbones mobilenet_v2,mobilenet_v2@none   # is pretraining paying?

DATA is a TFRecord folder from `photoclf convert`. Each backbone runs once over every split (evaluation
preprocessing, no augmentation); a logistic regression on its pooled features is fitted on
train and scored on val (and test). Ranked by val accuracy: what phase 1 of a run can get out
of that backbone, in minutes per backbone on a CPU instead of a fine-tune each. A candidate
takes its weights after '@' (auto | imagenet | none | PATH; default auto, as fine_tune.py).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from app.cli import lasting_imports
from app.storage import must_exist

HELP = "which backbone for your photos? Ranks candidates by a linear probe on their frozen features"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("data", type=Path, help="TFRecord folder from photoclf convert (train and val splits)")
    p.add_argument(
        "--backbones", required=True, help="comma-separated NAME[@WEIGHTS], e.g. mobilenet_v2,efficientnet_b0"
    )
    p.add_argument("--image-size", type=int, default=0, help="input size; 0 = each backbone's own (default)")


def run(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    must_exist(args.data)  # said before TensorFlow's seconds of import
    with lasting_imports():
        from app.training.backbone_probe import compare_backbones, format_ranking, parse_candidates

    candidates = parse_candidates(args.backbones)
    print(format_ranking(compare_backbones(str(args.data), candidates, args.image_size)))
