"""Measure input-pipeline throughput (images/s): ours vs the naive recipe vs JPEG decode alone.

    python scripts/benchmark_input.py --data data/      # your shards (the train split)
    python scripts/benchmark_input.py                   # synthetic 500x375 photos

Prints progress per round, then one JSON line with the medians and ratios.
"""

from __future__ import annotations

import argparse
import json
import sys

from app.cli import run_cli


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=None, help="TFRecord folder or gs:// URL from make_tfrecords.py (default: synthetic)")
    p.add_argument("--image-size", type=int, default=224, help="output size (default 224)")
    p.add_argument("--batch-size", type=int, default=32, help="batch size (default 32)")
    p.add_argument("--num-images", type=int, default=2048, help="images timed per variant per round (default 2048)")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds; medians are reported (default 5)")
    p.add_argument("--synthetic-images", type=int, default=1024, help="images to generate without --data (default 1024)")
    args = p.parse_args()
    from app.data.benchmark import run_input_benchmark

    result = run_input_benchmark(
        args.data, image_size=args.image_size, batch_size=args.batch_size, num_images=args.num_images,
        rounds=args.rounds, synthetic_images=args.synthetic_images, log=lambda m: print(m, file=sys.stderr),
    )
    print(json.dumps(result))


if __name__ == "__main__":
    run_cli(main)
