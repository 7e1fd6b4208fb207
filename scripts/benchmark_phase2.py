"""Does phase 2 pay on your photos? Phase 1 vs kept (after phase 2) validation accuracy and loss.

    python scripts/benchmark_phase2.py SPLIT_FOLDER --weights mobilenet_v2.weights.h5
    python scripts/benchmark_phase2.py SPLIT_FOLDER --weights W --per-class 10,20,50 \\
        --variant defaults --variant ema:ema_decay=0.99 --variant acc:select_by=val_accuracy

SPLIT_FOLDER holds train/ and val/, each with one folder per class. For each size (photos per
class in train/; val/ is used whole) and seed, every variant trains on the same subset, through
fine_tune.py's phases (no export). Up to --test-per-class of the training photos a subset
leaves out are its held-out test split (validation chose the kept epochs; test chose nothing).
Prints one line per run, a table (mean ± sd over seeds; the gain of phase 2 in validation
images; test accuracy after phase 1 and at the end) and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from app.cli import add_weights_and_seeds, int_list, run_cli


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path, help="folder with train/ and val/ class folders")
    add_weights_and_seeds(p)
    p.add_argument("--per-class", type=int_list, default=(10, 20, 50), help="training photos per class (default 10,20,50)")
    p.add_argument("--test-per-class", type=int, default=100,
                   help="training photos left out of a subset that form its held-out test split (default 100; 0 = none)")
    p.add_argument("--variant", action="append", default=None,
                   help="NAME or NAME:key=value,... (config keys, as fine_tune.py --set); repeatable (default: defaults)")
    p.add_argument("--image-size", type=int, default=224, help="input size (default 224)")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from app.training.phase2_benchmark import format_summary, parse_variant, run_phase2_benchmark, summarise

    try:
        variants = [parse_variant(v) for v in args.variant or ["defaults"]]
    except ValueError as err:
        p.error(str(err))
    rows = run_phase2_benchmark(args.folder, weights=args.weights, variants=variants, per_class=args.per_class,
                                seeds=args.seeds, test_per_class=args.test_per_class, image_size=args.image_size, log=lambda m: print(m, file=sys.stderr))
    summary = summarise(rows)
    print(format_summary(summary))
    print(json.dumps({"summary": summary, "runs": rows}))


if __name__ == "__main__":
    run_cli(main)
