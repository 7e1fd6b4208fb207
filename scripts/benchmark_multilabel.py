"""Multi-label on generated scenes: mAP, exact match and the per-label table on held-out photos.

    python scripts/benchmark_multilabel.py --weights mobilenet_v2.weights.h5
    python scripts/benchmark_multilabel.py --weights W --seeds 0,1,2 --photos 600 --image-size 128

Each generated photo holds any of four shapes (circle 50% of photos, square 40%, star 30%,
triangle 20%; some hold none); the split is 60/20/20. Every seed runs fine_tune.py's whole run
(thresholds chosen on validation) and evaluate.py on the test split. Prints one line per seed,
the tables (mean ± sd over seeds) and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from app.cli import add_weights_and_seeds, run_cli


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_weights_and_seeds(p)
    p.add_argument("--photos", type=int, default=600, help="generated photos (default 600)")
    p.add_argument("--image-size", type=int, default=128, help="generated and input size in pixels (default 128)")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from app.training.multilabel_benchmark import format_summary, run_multilabel_benchmark

    rows = run_multilabel_benchmark(weights=args.weights, seeds=args.seeds, photos=args.photos, photo_size=args.image_size,
                                    image_size=args.image_size, log=lambda m: print(m, file=sys.stderr))
    print(format_summary(rows))
    print(json.dumps({"runs": rows}))


if __name__ == "__main__":
    run_cli(main)
