"""Combine the outputs of `make_tfrecords.py --num-writers N --writer-index i` into one dataset.json.

    python scripts/merge_tfrecords.py data/

Fails, writing nothing, unless every writer finished and every planned shard is present.
"""

from __future__ import annotations

import argparse

from app.cli import run_cli


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="the OUT folder (or gs:// URL) all writers wrote to")
    args = p.parse_args()
    from app.data.merge import merge_writers
    from app.data.summary import format_summary

    print(format_summary(merge_writers(args.out), str(args.out)))


if __name__ == "__main__":
    run_cli(main)
