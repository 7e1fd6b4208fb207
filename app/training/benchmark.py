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
        normal_cfg, cached_cfg = base, base.replace(cache_features=True)
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
