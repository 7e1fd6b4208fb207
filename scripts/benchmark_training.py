"""Measure training throughput (images/s): phase 1 normal vs cached features, and phase 2.

    python scripts/benchmark_training.py                       # demo data, MobileNetV2 at 224
    python scripts/benchmark_training.py --data data/ --epochs 5

Phases run with augmentation off (cached features require it) and random weights unless
--weights is given: speed does not depend on the weights' values. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from app.cli import run_cli


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="", help="TFRecord folder (default: the built-in demo)")
    p.add_argument("--backbone", default="mobilenet_v2", help="backbone (default mobilenet_v2)")
    p.add_argument("--weights", default="none", help="weights (default none: speed does not depend on them)")
    p.add_argument("--image-size", type=int, default=224, help="input size (default 224)")
    p.add_argument("--batch-size", type=int, default=32, help="batch size (default 32)")
    p.add_argument("--epochs", type=int, default=3, help="epochs per phase; the cached speedup approaches this (default 3)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds; medians reported (default 3)")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from app.data.demo import ensure_demo_records
    from app.training.benchmark import run_training_benchmark

    result = run_training_benchmark(
        args.data or str(ensure_demo_records()), backbone=args.backbone, weights=args.weights,
        image_size=args.image_size, batch_size=args.batch_size, epochs=args.epochs, rounds=args.rounds,
        log=lambda m: print(m, file=sys.stderr),
    )
    print(json.dumps(result))


if __name__ == "__main__":
    run_cli(main)
