"""Fine-tune a pretrained backbone on TFRecords in two phases, then export a SavedModel.

    python scripts/fine_tune.py                       # the built-in demo, end to end
    python scripts/fine_tune.py --data data/ --out runs/flowers --backbone efficientnet_b0
    TF_CONFIG='{...}' python scripts/fine_tune.py --data gs://bucket/data --out /shared/runs/x   # on each worker

Phase 1 trains a new head on the frozen backbone; phase 2 unfreezes the top blocks at a low
learning rate. Re-running the same command resumes an interrupted run. Every config key can be
set in a TOML file (--config) or with --set key=value; flags override both.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path

from app.cli import run_cli
from app.config import TrainConfig

FLAGS = {  # flag → (config key, type, help)
    "--data": ("data", str, "TFRecord folder or gs:// URL from make_tfrecords.py (default: the built-in demo, built if missing)"),
    "--out": ("out", str, "run directory (default runs/demo)"),
    "--backbone": ("backbone", str, "backbone registry key (default mobilenet_v2; see README for the list)"),
    "--weights": ("weights", str, "auto | imagenet | none | PATH to .h5/.weights.h5 (default auto)"),
    "--image-size": ("image_size", int, "input size in pixels (default: the backbone's own)"),
    "--batch-size": ("batch_size", int, "per-replica batch size (default 32)"),
    "--epochs-head": ("epochs_head", int, "phase-1 epochs, frozen backbone (default 10; early stopping may end sooner)"),
    "--epochs-finetune": ("epochs_finetune", int, "phase-2 epochs, top of backbone unfrozen (default 5)"),
    "--data-service": ("data_service", str, "grpc://HOST:PORT of a tf.data service dispatcher (scripts/data_service.py)"
                       " that decodes and augments the training input; default: this machine does"),
}


def parse_args() -> argparse.Namespace:
    keys = "\n".join(f"  {f.name} = {f.default!r}" for f in dataclasses.fields(TrainConfig))
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"config keys (for --config and --set), with defaults; comments in app/config.py:\n{keys}",
    )
    for flag, (_, kind, help_text) in FLAGS.items():
        p.add_argument(flag, type=kind, default=None, help=help_text)
    p.add_argument("--config", type=Path, default=None, help="TOML file with config keys (flat, or under [train])")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override any config key; repeatable")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run dir instead of resuming it")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from app.config import load_config, parse_set
    from app.training.report import format_result
    from app.training.train import train_main

    overrides = parse_set(args.set)
    overrides.update({key: getattr(args, flag[2:].replace("-", "_")) for flag, (key, _, _) in FLAGS.items()
                      if getattr(args, flag[2:].replace("-", "_")) is not None})
    cfg = load_config(args.config, overrides)
    metrics = train_main(cfg, overwrite=args.overwrite)
    print(format_result(metrics))


if __name__ == "__main__":
    run_cli(main)
