"""The usual Keras transfer-learning recipe vs fine_tune.py's defaults, on your photos.

    python scripts/benchmark_recipes.py SPLIT_FOLDER --weights mobilenet_v2.weights.h5
    python scripts/benchmark_recipes.py SPLIT_FOLDER --weights W --train-per-class 20   # little data

SPLIT_FOLDER holds train/ and val/, each with one folder per class. The usual recipe is
TensorFlow's "Transfer learning and fine-tuning" tutorial (app/training/recipe.py); both use
MobileNetV2 with the same weights file and image size. Prints per round, then a table (wall
time, time to reach the usual recipe's final val accuracy, final val accuracy, ratios) and one
JSON line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.cli import run_cli


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path, help="folder with train/ and val/ class folders")
    p.add_argument("--weights", required=True, help="MobileNetV2 (no top) weights file both recipes start from")
    p.add_argument("--image-size", type=int, default=224, help="input size for both (default 224)")
    p.add_argument("--train-per-class", type=int, default=None, help="train on this many photos per class (default all)")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds; medians reported (default 2)")
    p.add_argument("--seed", type=int, default=0, help="seed for both recipes and the subset (default 0)")
    args = p.parse_args()
    from app.training.recipe_benchmark import format_result, run_recipe_benchmark

    result = run_recipe_benchmark(args.folder, weights=args.weights, image_size=args.image_size,
                                  train_per_class=args.train_per_class, rounds=args.rounds, seed=args.seed,
                                  log=lambda m: print(m, file=sys.stderr, flush=True))
    print(format_result(result))


if __name__ == "__main__":
    run_cli(main)
