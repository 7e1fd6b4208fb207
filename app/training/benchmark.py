"""Training throughput on this machine: phase 1 (normal vs cached features) and phase 2.

Each variant is a real phase run through the same code as fine_tune.py (validation included),
timed end to end; cached-features time includes computing the features. Variants alternate
over rounds and medians are reported, since machine speed drifts.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from app.config import TrainConfig
from app.training.context import setup
from app.training.train import run_phase1, run_phase2


def _timed_phase1(cfg: TrainConfig) -> tuple[float, object]:
    ctx = setup(cfg, overwrite=True)
    start = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):  # progress bars; stdout is for the JSON result
        result = run_phase1(ctx)
    return time.perf_counter() - start, (ctx, result)


def run_training_benchmark(
    data: str, *, backbone: str = "mobilenet_v2", weights: str = "none", image_size: int = 224, batch_size: int = 32,
    epochs: int = 3, rounds: int = 3, log: Callable[[str], None] = print,
) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        base = TrainConfig(
            data=data, out=str(Path(tmp) / "run"), backbone=backbone, weights=weights, image_size=image_size,
            batch_size=batch_size, epochs_head=epochs, epochs_finetune=epochs, augment=False,
            early_stopping_patience=epochs + 1,
        )
        normal_cfg, cached_cfg = base.replace(cache_features="false"), base.replace(cache_features="true")
        samples: dict[str, list[float]] = {"phase1": [], "phase1_cached": [], "phase2": []}
        for r in range(rounds):
            seconds, (ctx, phase1) = _timed_phase1(normal_cfg)
            images = epochs * ctx.steps_per_epoch * ctx.global_batch
            samples["phase1"].append(images / seconds)
            start = time.perf_counter()
            with contextlib.redirect_stdout(sys.stderr):
                run_phase2(ctx, phase1)
            samples["phase2"].append(images / (time.perf_counter() - start))
            seconds, _ = _timed_phase1(cached_cfg)
            samples["phase1_cached"].append(images / seconds)
            log(f"round {r + 1}/{rounds}: " + ", ".join(f"{k}={v[-1]:.1f} img/s" for k, v in samples.items()))
    result = {f"{k}_images_per_s": round(statistics.median(v), 1) for k, v in samples.items()}
    result["cached_speedup"] = round(result["phase1_cached_images_per_s"] / result["phase1_images_per_s"], 2)
    result["epochs"] = epochs
    return result


def _phase1_run(cfg: TrainConfig) -> dict[str, float]:
    """One phase 1 from scratch, timed from setup to the kept weights (feature caching included)."""
    start = time.perf_counter()
    _, (_, result) = _timed_phase1(cfg)
    return {"val_accuracy": result.val_accuracy, "val_loss": result.val_loss, "seconds": time.perf_counter() - start}


def _summary(runs: list[dict[str, float]], baseline_seconds: float) -> dict[str, float]:
    acc, loss = [r["val_accuracy"] for r in runs], [r["val_loss"] for r in runs]
    seconds = statistics.median(r["seconds"] for r in runs)
    return {"val_accuracy_mean": round(statistics.mean(acc), 4), "val_accuracy_sd": round(statistics.pstdev(acc), 4),
            "val_loss_mean": round(statistics.mean(loss), 4), "val_loss_sd": round(statistics.pstdev(loss), 4),
            "seconds_median": round(seconds, 1), "speedup": round(baseline_seconds / seconds, 2)}


def run_phase1_comparison(
    data: str, *, weights: str, views: tuple[int, ...] = (1, 2, 4), seeds: tuple[int, ...] = (0, 1, 2),
    image_size: int = 224, batch_size: int = 32, epochs: int = 10, log: Callable[[str], None] = print,
) -> dict[str, dict[str, float]]:
    """Phase 1 on augmented images (one backbone pass per image per epoch) vs on cached features of
    K augmented views, same seeds, variants alternating within each seed. Accuracy is on val."""
    variants = {"images": {"cache_features": "false"}}
    variants.update({f"features_x{k}": {"cache_features": "true", "feature_views": k} for k in views})
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory() as tmp:
        base = TrainConfig(data=data, out=str(Path(tmp) / "run"), weights=weights, image_size=image_size,
                           batch_size=batch_size, epochs_head=epochs, epochs_finetune=0)
        for seed in seeds:
            for name, change in variants.items():
                runs[name].append(_phase1_run(base.replace(seed=seed, **change)))
                r = runs[name][-1]
                log(f"seed {seed} {name}: val_accuracy {r['val_accuracy']:.4f}, val_loss {r['val_loss']:.4f}, {r['seconds']:.1f}s")
    baseline = statistics.median(r["seconds"] for r in runs["images"])
    return {name: _summary(r, baseline) for name, r in runs.items()}
