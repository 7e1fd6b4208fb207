"""Combine the outputs of `photoclf convert --num-writers N --writer-index i` into one dataset.json.

    photoclf merge data/

Fails, writing nothing, unless every writer finished and every planned shard is present.
"""

from __future__ import annotations

import argparse

HELP = "combine the shards of several convert --num-writers N writers into one dataset"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", help="the OUT folder (or gs:// URL) all writers wrote to")


def run(args: argparse.Namespace) -> None:
    from app.data.merge import merge_writers
    from app.data.summary import format_summary

    print(format_summary(merge_writers(args.out), str(args.out)))
