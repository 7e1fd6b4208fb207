"""Compare phase 1 on augmented images with phase 1 on cached features of K augmented views.

    python scripts/benchmark_phase1.py data/photos --weights PATH --views 1,2,4 --seeds 0,1,2

Runs phase 1 (10 epochs by default, early stopping as configured) for every variant and seed,
variants alternating within each seed; prints one line per run, then one JSON line: per variant
the mean and spread of val accuracy and loss, the median wall time (setup to kept weights,
feature caching included) and the speedup over the images variant.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from app.cli import add_weights_and_seeds, int_list, run_cli


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", help="TFRecord folder with train and val splits")
    add_weights_and_seeds(p)
    p.add_argument("--views", type=int_list, default=(1, 2, 4), help="K values to try, comma-separated (default 1,2,4)")
    p.add_argument("--epochs", type=int, default=10, help="phase-1 epochs (default 10)")
    p.add_argument("--image-size", type=int, default=224, help="input size (default 224)")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from app.training.benchmark import run_phase1_comparison

    result = run_phase1_comparison(args.data, weights=args.weights, views=args.views, seeds=args.seeds,
                                   image_size=args.image_size, epochs=args.epochs, log=lambda m: print(m, file=sys.stderr))
    print(json.dumps(result))


if __name__ == "__main__":
    run_cli(main)
