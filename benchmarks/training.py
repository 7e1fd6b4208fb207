"""Measure training throughput (images/s): phase 1 normal vs cached features, and phase 2.

    python -m benchmarks.training                       # demo data, MobileNetV2 at 224
    python -m benchmarks.training --data data/ --epochs 5

Phases run with augmentation off (cached features require it) and random weights unless
--weights is given: speed does not depend on the weights' values. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from app.cli import run_cli
from app.config import TrainConfig
from app.training.train import run_phase2
from benchmarks.common import timed_phase1


def run_training_benchmark(
    data: str,
    *,
    backbone: str = "mobilenet_v2",
    weights: str = "none",
    image_size: int = 224,
    batch_size: int = 32,
    epochs: int = 3,
    rounds: int = 3,
    log: Callable[[str], None] = print,
) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        base = TrainConfig(
            data=data,
            out=str(Path(tmp) / "run"),
            backbone=backbone,
            weights=weights,
            image_size=image_size,
            batch_size=batch_size,
            epochs_head=epochs,
            epochs_finetune=epochs,
            augment=False,
            early_stopping_patience=epochs + 1,
        )
        normal_cfg, cached_cfg = base.replace(feature_views="0"), base.replace(feature_views="2")
        samples: dict[str, list[float]] = {"phase1": [], "phase1_cached": [], "phase2": []}
        for r in range(rounds):
            seconds, (ctx, phase1) = timed_phase1(normal_cfg)
            images = epochs * ctx.steps_per_epoch * ctx.global_batch
            samples["phase1"].append(images / seconds)
            start = time.perf_counter()
            with contextlib.redirect_stdout(sys.stderr):
                run_phase2(ctx, phase1)
            samples["phase2"].append(images / (time.perf_counter() - start))
            seconds, _ = timed_phase1(cached_cfg)
            samples["phase1_cached"].append(images / seconds)
            log(f"round {r + 1}/{rounds}: " + ", ".join(f"{k}={v[-1]:.1f} img/s" for k, v in samples.items()))
    result = {f"{k}_images_per_s": round(statistics.median(v), 1) for k, v in samples.items()}
    result["cached_speedup"] = round(result["phase1_cached_images_per_s"] / result["phase1_images_per_s"], 2)
    result["epochs"] = epochs
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="", help="TFRecord folder (default: the built-in demo)")
    p.add_argument("--backbone", default="mobilenet_v2", help="backbone (default mobilenet_v2)")
    p.add_argument("--weights", default="none", help="weights (default none: speed does not depend on them)")
    p.add_argument("--image-size", type=int, default=224, help="input size (default 224)")
    p.add_argument("--batch-size", type=int, default=32, help="batch size (default 32)")
    p.add_argument(
        "--epochs", type=int, default=3, help="epochs per phase; the cached speedup approaches this (default 3)"
    )
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds; medians reported (default 3)")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from app.data.demo import ensure_demo_records

    result = run_training_benchmark(
        args.data or str(ensure_demo_records()),
        backbone=args.backbone,
        weights=args.weights,
        image_size=args.image_size,
        batch_size=args.batch_size,
        epochs=args.epochs,
        rounds=args.rounds,
        log=lambda m: print(m, file=sys.stderr),
    )
    print(json.dumps(result))


if __name__ == "__main__":
    run_cli(main)
