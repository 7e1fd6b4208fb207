"""Injection benchmark for scripts/audit.py: plant known problems in a real photo folder, audit it, score it.

    python scripts/benchmark_audit.py ../shared/data/cats-dogs --weights mobilenet_v2.weights.h5

Plants 20 near duplicates in train (half size, JPEG quality 30, 90% crop, mirror, brighter and
more saturated; 4 of each), 10 copies of train photos in val (leaks), 20 flipped labels and
5 non-photos, in a temporary manifest (the folder is not touched). Prints precision and recall
per kind, the share of flipped labels among the 2x20 lowest-confidence images, how many
non-photos were flagged, and images/s of the whole audit, as one JSON line.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from app.cli import run_cli


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path, help="class folders or a train/val[/test] tree of real photos")
    p.add_argument("--weights", default="auto", help="auto | imagenet | PATH (default auto)")
    p.add_argument("--seed", type=int, default=0, help="which photos are copied and flipped (default 0)")
    args = p.parse_args()
    from app.audit.benchmark import run_audit_benchmark

    print(json.dumps(run_audit_benchmark(args.folder, seed=args.seed, weights=args.weights)))


if __name__ == "__main__":
    run_cli(main)
