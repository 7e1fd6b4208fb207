"""What a phase trains with: its optimizer, its compiled steps and phase 2's rate schedule.

Training and the learning-rate finder build them alike, so a sweep measures the steps the run
will take.
"""

from __future__ import annotations

import keras
import numpy as np

from app.config import TrainConfig
from app.data.pipeline import DatasetInfo
from app.training.context import Context
from app.training.optimizer import FineTuneAdamW, layer_rate_scales
from app.training.steps import CompiledSteps


def class_weights(info: DatasetInfo) -> list[float]:
    """Inverse class frequency, normalised so a balanced dataset gets all 1.0. Multi-label: each
    label's positives are weighed by its negatives / positives (a label on half the photos: 1.0)."""
    counts = np.array([info.counts["train"].get(c, 0) for c in info.classes], dtype=float)
    if info.multi_label:
        photos = info.num_examples("train")
        return ((photos - counts) / np.maximum(counts, 1)).round(6).tolist()
    return (counts.sum() / (len(counts) * np.maximum(counts, 1))).round(6).tolist()


def make_optimizer(ctx: Context, learning_rate, model: keras.Model, phase: int) -> keras.optimizers.Optimizer:
    """AdamW (phase 2 with its per-block rates; the weight average when configured), its slot
    variables built here under the strategy's scope: created lazily inside the first replicated
    step instead, they fail under MirroredStrategy with several devices."""
    rate_scales = layer_rate_scales(ctx.clf, ctx.cfg.unfreeze, ctx.cfg.layer_decay) if phase == 2 else None
    with ctx.strategy.scope():
        opt = FineTuneAdamW(
            learning_rate=learning_rate,
            weight_decay=ctx.cfg.weight_decay,
            rate_scales=rate_scales,
            ema_decay=ctx.cfg.ema_decay,
        )
        opt.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
        if ctx.policy == "mixed_float16":
            opt = keras.optimizers.LossScaleOptimizer(opt)
        opt.build(model.trainable_variables)
    return opt


def make_steps(
    ctx: Context, model: keras.Model, optimizer: keras.optimizers.Optimizer | None, phase: int = 0
) -> CompiledSteps:
    """Training steps use the configured label smoothing, class weights, colour jitter (on the
    device) and XLA choice; plain evaluation (no optimizer) reports the unsmoothed loss."""
    training = optimizer is not None
    return CompiledSteps(
        ctx.strategy,
        model,
        optimizer,
        num_classes=len(ctx.info.classes),
        global_batch_size=ctx.global_batch,
        label_smoothing=ctx.label_smoothing if training else 0.0,
        class_weights=class_weights(ctx.info) if training and ctx.cfg.class_weights else None,
        color_jitter=ctx.augmentation.color_jitter,
        seed=ctx.cfg.seed * 10 + phase,
        jit_compile=training and ctx.jit_compile,
        multi_label=ctx.info.multi_label,
    )


def finetune_schedule(
    cfg: TrainConfig, peak: float, steps_per_epoch: int, epochs: int
) -> keras.optimizers.schedules.LearningRateSchedule:
    """Linear warmup to `peak` (lr_finetune, or its finder's suggestion) over warmup_fraction of
    phase 2's `epochs`, then cosine decay to 0."""
    total = max(1, epochs * steps_per_epoch)
    warmup = int(total * cfg.warmup_fraction)
    return keras.optimizers.schedules.CosineDecay(
        0.0 if warmup else peak,
        decay_steps=max(1, total - warmup),
        warmup_target=peak if warmup else None,
        warmup_steps=warmup,
    )
