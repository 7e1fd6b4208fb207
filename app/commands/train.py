"""Fine-tune a pretrained backbone on TFRecords in two phases, then export a SavedModel.

    photoclf train                       # the built-in demo, end to end
    photoclf train --data data/ --out runs/flowers --backbone efficientnet_b0
    TF_CONFIG='{...}' photoclf train --data gs://bucket/data --out /shared/runs/x   # on each worker

Phase 1 trains a new head on the frozen backbone; phase 2 unfreezes the top blocks at a low
learning rate. Re-running the same command resumes an interrupted run. Every config key can be
set in a TOML file (--config, examples in configs/) or with --set key=value; flags override both.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path

from app.cli import lasting_imports
from app.config import FIELDS, TrainConfig, check_paths_exist, load_config, parse_set

FLAG_KEYS = [f.name for f in dataclasses.fields(TrainConfig) if f.metadata["flag"]]


HELP = "fine-tune a pretrained backbone on TFRecords in two phases, then export a SavedModel"


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def add_arguments(p: argparse.ArgumentParser) -> None:
    keys = "\n".join(f"  {f.name} = {f.default!r}: {f.metadata['help']}" for f in dataclasses.fields(TrainConfig))
    p.epilog = f"config keys (for --config and --set) with their defaults:\n{keys}"
    for key in FLAG_KEYS:
        field = FIELDS[key]
        p.add_argument(
            _flag(key),
            type=type(field.default),
            default=None,
            help=f"{field.metadata['help']} (default {field.default!r})",
        )
    p.add_argument(
        "--config", type=Path, default=None, help="TOML file with config keys (flat, or under [train]); see configs/"
    )
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override any config key; repeatable"
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing run dir instead of resuming it")


def run(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    flags = {key: getattr(args, key) for key in FLAG_KEYS if getattr(args, key) is not None}
    cfg = load_config(args.config, parse_set(args.set), flags)  # bad values are said before TensorFlow's import
    check_paths_exist(cfg)
    with lasting_imports():
        from app.training.demo_run import train_main
        from app.training.report import format_result

    metrics = train_main(cfg, overwrite=args.overwrite)
    print(format_result(metrics))
