"""Compare phase 1 on augmented images with phase 1 on cached features of K augmented views.

    python -m benchmarks.phase1 data/photos --weights PATH --views 1,2,4 --seeds 0,1,2

Runs phase 1 (10 epochs by default, early stopping as configured) for every variant and seed,
variants alternating within each seed; prints one line per run, then one JSON line: per variant
the mean and spread of val accuracy and loss, the median wall time (setup to kept weights,
feature caching included) and the speedup over the images variant.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from app.cli import add_weights_and_seeds, int_list, run_cli
from app.config import TrainConfig
from benchmarks.common import timed_phase1


def _phase1_run(cfg: TrainConfig) -> dict[str, float]:
    """One phase 1 from scratch, timed from setup to the kept weights (feature caching included)."""
    start = time.perf_counter()
    _, (_, result) = timed_phase1(cfg)
    return {"val_accuracy": result.val_accuracy, "val_loss": result.val_loss, "seconds": time.perf_counter() - start}


def _summary(runs: list[dict[str, float]], baseline_seconds: float) -> dict[str, float]:
    acc, loss = [r["val_accuracy"] for r in runs], [r["val_loss"] for r in runs]
    seconds = statistics.median(r["seconds"] for r in runs)
    return {
        "val_accuracy_mean": round(statistics.mean(acc), 4),
        "val_accuracy_sd": round(statistics.pstdev(acc), 4),
        "val_loss_mean": round(statistics.mean(loss), 4),
        "val_loss_sd": round(statistics.pstdev(loss), 4),
        "seconds_median": round(seconds, 1),
        "speedup": round(baseline_seconds / seconds, 2),
    }


def run_phase1_comparison(
    data: str,
    *,
    weights: str,
    views: tuple[int, ...] = (1, 2, 4),
    seeds: tuple[int, ...] = (0, 1, 2),
    image_size: int = 224,
    batch_size: int = 32,
    epochs: int = 10,
    log: Callable[[str], None] = print,
) -> dict[str, dict[str, float]]:
    """Phase 1 on augmented images (one backbone pass per image per epoch) vs on cached features of
    K augmented views, same seeds, variants alternating within each seed. Accuracy is on val."""
    variants = {"images": {"feature_views": "0"}}
    variants.update({f"features_x{k}": {"feature_views": str(k)} for k in views})
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory() as tmp:
        base = TrainConfig(
            data=data,
            out=str(Path(tmp) / "run"),
            weights=weights,
            image_size=image_size,
            batch_size=batch_size,
            epochs_head=epochs,
            epochs_finetune=0,
        )
        for seed in seeds:
            for name, change in variants.items():
                runs[name].append(_phase1_run(base.replace(seed=seed, **change)))
                r = runs[name][-1]
                log(
                    f"seed {seed} {name}: val_accuracy {r['val_accuracy']:.4f},"
                    f" val_loss {r['val_loss']:.4f}, {r['seconds']:.1f}s"
                )
    baseline = statistics.median(r["seconds"] for r in runs["images"])
    return {name: _summary(r, baseline) for name, r in runs.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", help="TFRecord folder with train and val splits")
    add_weights_and_seeds(p)
    p.add_argument("--views", type=int_list, default=(1, 2, 4), help="K values to try, comma-separated (default 1,2,4)")
    p.add_argument("--epochs", type=int, default=10, help="phase-1 epochs (default 10)")
    p.add_argument("--image-size", type=int, default=224, help="input size (default 224)")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)

    result = run_phase1_comparison(
        args.data,
        weights=args.weights,
        views=args.views,
        seeds=args.seeds,
        image_size=args.image_size,
        epochs=args.epochs,
        log=lambda m: print(m, file=sys.stderr),
    )
    print(json.dumps(result))


if __name__ == "__main__":
    run_cli(main)
