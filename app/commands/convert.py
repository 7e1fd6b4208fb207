"""Convert a folder of photos (one subfolder per class) or a CSV manifest into sharded TFRecords.

photoclf convert photos/ data/ --val-fraction 0.1 --test-fraction 0.1
"""

from __future__ import annotations

import argparse
from pathlib import Path

from app.cli import finite_float, lasting_imports
from app.storage import must_exist

HELP = "convert a folder of photos (one subfolder per class) or a CSV manifest into sharded TFRecords"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "src",
        type=Path,
        help="folder of class folders, a folder with train/ val/ [test/], or a CSV 'path,label[,split]'",
    )
    p.add_argument("out", help="output folder (or gs:// URL) for shards, labels.txt and dataset.json")
    p.add_argument(
        "--val-fraction",
        type=finite_float,
        default=0.1,
        help="share of each class for validation when SRC is not pre-split (default 0.1)",
    )
    p.add_argument(
        "--test-fraction",
        type=finite_float,
        default=0.1,
        help="share of each class for test when SRC is not pre-split (default 0.1)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed for the split and the order within shards (default 0)")
    _add_shard_arguments(p)
    _add_manifest_arguments(p)
    p.add_argument(
        "--num-writers",
        type=int,
        default=1,
        help="split the work over N machines (default 1); then run photoclf merge OUT",
    )
    p.add_argument("--writer-index", type=int, default=0, help="this machine's index in [0, N) (default 0)")


def _add_shard_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--num-shards", type=int, default=None, help="shards per split (default: enough for ~150 MB each)")
    p.add_argument(
        "--max-side",
        type=int,
        default=None,
        help="downsize images whose longer side exceeds N pixels (default: keep size)",
    )
    p.add_argument(
        "--workers", type=int, default=None, help="worker processes (default: all cores for >=1000 images, else 1)"
    )
    p.add_argument("--overwrite", action="store_true", help="replace shards already in OUT")
    p.add_argument(
        "--strict",
        action="store_true",
        help="refuse a missing, empty or undecodable file (default: skip it and list it in the summary)",
    )
    p.add_argument(
        "--drop-duplicates",
        action="store_true",
        help="keep one file of each byte-identical group (the train copy if any)",
    )


def _add_manifest_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--feature-columns",
        default=None,
        metavar="COLS",
        help="manifest columns stored as side features, e.g. 'age,site:categorical' (numeric unless"
        " ':categorical'; empty or NA cells are missing, see docs/side-features.md)",
    )
    p.add_argument(
        "--multi-label",
        action="store_true",
        help="a manifest whose label cells list several labels, 'car|person' (an empty cell: none)",
    )


def run(args: argparse.Namespace) -> None:
    must_exist(args.src)  # said before TensorFlow's seconds of import
    with lasting_imports():
        from app.data.summary import format_summary
        from app.data.writer import write_tfrecords

    meta = write_tfrecords(
        args.src,
        args.out,
        val_fraction=args.val_fraction,
        test_fraction=args.test_fraction,
        seed=args.seed,
        num_shards=args.num_shards,
        max_side=args.max_side,
        workers=args.workers,
        overwrite=args.overwrite,
        num_writers=args.num_writers,
        writer_index=args.writer_index,
        drop_duplicates=args.drop_duplicates,
        feature_columns=args.feature_columns,
        multi_label=args.multi_label,
        strict=args.strict,
    )
    if args.num_writers > 1:
        shards = sum(len(v) for v in meta["shards"].values())
        print(
            f"writer {args.writer_index} of {args.num_writers}: wrote {shards} shard(s) to {args.out};"
            f" run photoclf merge {args.out} when all writers have finished"
        )
        return
    print(format_summary(meta, str(args.out)))
