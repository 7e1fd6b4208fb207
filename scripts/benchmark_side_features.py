"""Do side features pay? Image-only, side-features-only and fused models, on held-out test photos.

    python scripts/benchmark_side_features.py --weights mobilenet_v2.weights.h5
    python scripts/benchmark_side_features.py --weights W --seeds 0,1,2 --per-class 100 --noise 0.6

The data is generated (app/data/side_demo.py): circles and squares, each row with a numeric
`reading` and a categorical `site`; the label is the shape together with a level that only the
side features carry, so neither the photo nor the side features alone can be right more than
about half the time (with --task threshold the level is exactly the sign of `reading`, and the
table adds the ceiling: the image-only model's accuracy on the shape alone). Prints one line
per run, a table (mean ± sd over seeds) and one JSON line.
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
    p.add_argument("--per-class", type=int, default=100, help="generated photos per class, 4 classes (default 100)")
    p.add_argument("--noise", type=float, default=0.6, help="sd of `reading` around its level's mean of ±1 (default 0.6)")
    p.add_argument("--task", choices=("levels", "threshold"), default="levels",
                   help="levels: `reading` drawn around the level's mean (default); threshold: the level is exactly"
                        " the sign of `reading`, and the table's ceiling is reachable")
    p.add_argument("--image-size", type=int, default=128, help="input size (default 128)")
    p.add_argument("--epochs-head", type=int, default=15, help="phase-1 epochs (default 15)")
    p.add_argument("--epochs-finetune", type=int, default=0, help="phase-2 epochs (default 0: phase 1 only)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="any other fine_tune.py config key for the image-only and fused runs; repeatable")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from app.config import parse_set
    from app.training.side_benchmark import format_summary, run_side_benchmark, summarise

    rows = run_side_benchmark(weights=args.weights, seeds=args.seeds, per_class=args.per_class, noise=args.noise,
                              task=args.task, log=lambda m: print(m, file=sys.stderr),
                              **{"image_size": args.image_size, "epochs_head": args.epochs_head,
                                 "epochs_finetune": args.epochs_finetune, **parse_set(args.set)})
    summary = summarise(rows)
    print(format_summary(summary))
    print(json.dumps({"summary": summary, "runs": rows}))


if __name__ == "__main__":
    run_cli(main)
