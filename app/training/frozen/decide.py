"""What the frozen backbone does in a run, decided once from the context before any photo runs:
whether phase 1 trains on cached features, where phase 2's cut is, which activations there are
kept, whether those rows are held in memory or on disk, phase 2's plan, and whether phase 2 on
images runs the layers below its cut on the host's runtime (below.py). Every size limit is
applied here, and every choice says why.

Rows past ROWS_IN_MEMORY go to files beside the run (`rows.DiskRows`), read a batch at a time, so
what can be cached is bounded by the disk's free space, not by memory.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

from app.config import TrainConfig
from app.models.classifier import FrozenCut, cut_at_trained, unfreeze_start
from app.training.context import Context
from app.training.frozen.below import runs_below_on_host
from app.training.plan import Phase2Plan, plan_phase2
from app.training.strategy import num_workers

log = logging.getLogger(__name__)
ROWS_IN_MEMORY = 2**30  # bytes of cached rows held in memory; more go to disk
DISK_SPARE = 2**30  # bytes of free disk the cached rows leave for checkpoints and the export


@dataclass(frozen=True)
class Decision:
    phase1_cached: bool  # phase 1 trains the head on pooled features computed once per view
    phase1_reason: str  # why, for the log
    cut: FrozenCut | None  # where phase 2's trained layers begin, when working from there pays
    keeps_views: bool  # the training views' activations at the cut are gathered with phase 1's features
    keeps_test: bool  # ... and the test photos' too, so the test split runs only the layers above
    no_views: str | None  # why phase 2 cannot train on the views; None where it can
    plan: Phase2Plan
    rows_on_disk: Path | None = None  # the directory of the cached rows' files, where they are too many for memory
    below_on_host: bool = False  # phase 2 on images runs the layers below the cut on the host's runtime (below.py)

    @property
    def phase2_on_views(self) -> bool:
        return self.cut is not None and self.plan.mode == "views"

    @property
    def phase2_on_activations(self) -> bool:
        """Phase 2 trains the tail above the cut: on the views' activations, or on fresh ones."""
        return self.phase2_on_views or self.below_on_host


def decide(ctx: Context, phase2: bool = True) -> Decision:
    """`phase2=False`: phase 1's inputs alone (a learning-rate sweep), so no cut is built."""
    limit = cache_limit(ctx.run.root)
    cached, reason = phase1_mode(ctx.cfg, ctx.strategy, phase1_bytes(ctx), limit, ctx.views_per_image)
    cut, keeps_views, keeps_test, no_views = (
        _cut(ctx, cached, limit) if phase2 else (None, False, False, "phase 1 alone")
    )
    plan = plan_phase2(ctx.cfg, no_views, warm_start=ctx.start is not None)
    on_disk = _rows_on_disk(ctx, cached, cut, keeps_views, keeps_test)
    below = runs_below_on_host(ctx, cut, plan.mode == "views", plan.epochs)
    return Decision(cached, reason, cut, keeps_views, keeps_test, no_views, plan, on_disk, below)


def cache_limit(directory: Path) -> int:
    """Bytes of rows a run may cache: what memory holds, or the disk beside the run has free."""
    return max(ROWS_IN_MEMORY, shutil.disk_usage(directory).free - DISK_SPARE)


def _rows_on_disk(ctx: Context, cached: bool, cut: FrozenCut | None, views_kept: bool, test_kept: bool) -> Path | None:
    """The run's directory where the rows the run keeps (phase 1's features, the activations at
    the cut) are more than ROWS_IN_MEMORY, else None."""
    held = phase1_bytes(ctx) if cached else 0
    if cut is not None:
        held += _bytes(ctx, cut, "val") + (_bytes(ctx, cut, "train") * ctx.views_per_image if views_kept else 0)
        held += _bytes(ctx, cut, "test") if test_kept else 0
    if held <= ROWS_IN_MEMORY:
        return None
    log.info("the cached rows take %.1f GiB (more than %.0f GiB): they are kept on disk beside the run, read a"
             " batch at a time", held / 2**30, ROWS_IN_MEMORY / 2**30)  # fmt: skip
    return ctx.run.root


def phase1_bytes(ctx: Context) -> int:
    """Host memory of phase 1's float32 features: K views of the train split, one of val."""
    rows = ctx.views_per_image * ctx.info.num_examples("train") + ctx.info.num_examples("val")
    return rows * (ctx.clf.features_model.output.shape[-1] + ctx.info.side_width) * 4


def phase1_mode(
    cfg: TrainConfig, strategy: tf.distribute.Strategy, cache_bytes: int, limit: int, views: int
) -> tuple[bool, str]:
    """(train phase 1 on cached features?, why). `auto` caches on a single worker: every image is
    decoded, augmented and run through the frozen backbone K times in all instead of once per
    epoch (and the val split once instead of every epoch). On a CPU the backbone is nearly all of
    phase 1's time; on a GPU the CPU's decoding is (it feeds a fraction of the GPU's rate).
    `limit`: the bytes the cache may take (`cache_limit`); `views`: the context's views per image."""
    shown = f"{views} augmented view(s) per training image" if cfg.augment else "unaugmented images (augment = false)"
    if cfg.feature_views == "0":
        return False, "feature_views = 0: phase 1 on images"
    if cfg.feature_views != "auto":
        return True, f"feature_views = {cfg.feature_views}; {shown}"
    if num_workers(strategy) > 1 or cfg.data_service:
        return False, "feature_views = auto: several workers or a tf.data service decode every epoch"
    if cache_bytes > limit:
        return False, (
            f"feature_views = auto: the cache would take {cache_bytes / 2**30:.1f} GiB, more than the"
            f" {limit / 2**30:.1f} GiB free beside the run; set a number of views to cache anyway"
        )
    if tf.config.list_physical_devices("GPU"):
        return True, (
            "feature_views = auto: on a GPU the CPU's decoding is the bottleneck; each image is decoded once"
            f" per view, not once per epoch; {shown}"
        )
    return True, f"feature_views = auto: on a CPU the frozen backbone runs once per view, not once per epoch; {shown}"


def _cut(ctx: Context, phase1_cached: bool, limit: int) -> tuple[FrozenCut | None, bool, bool, str | None]:
    """(phase 2's cut, keep the views' activations, keep the test photos', why no views). A cut
    where working from it is possible and worth it: one worker (several would each hold every
    activation), a val split, a single tensor at the cut, and the activations within `limit`."""
    has_val = ctx.info.num_examples("val")
    if num_workers(ctx.strategy) > 1 or not has_val or not ctx.cfg.epochs_finetune:
        return None, False, False, "several workers" if has_val else "no val"
    start = unfreeze_start(ctx.clf, ctx.cfg.unfreeze)
    cut = cut_at_trained(ctx.clf, start)
    if cut is None:
        why = (
            "it trains the whole backbone"
            if start <= 1
            else "no single activation separates its frozen layers from the trained ones"
        )
        log.info("phase 2 validates on images: %s", why)
        return None, False, False, why
    val_bytes, train_bytes = _bytes(ctx, cut, "val"), _bytes(ctx, cut, "train") * ctx.views_per_image
    if val_bytes > limit:
        why = f"the val activations at {cut.layer} would take {val_bytes / 2**30:.1f} GiB"
        log.info("phase 2 validates on images: %s", why)
        return None, False, False, why
    keeps_views, why = _keeps_views(ctx, phase1_cached, val_bytes + train_bytes, limit)
    test_bytes = _bytes(ctx, cut, "test")
    keeps_test = 0 < test_bytes <= limit - val_bytes - (train_bytes if keeps_views else 0)
    return cut, keeps_views, keeps_test, (None if keeps_views else why)


def _keeps_views(ctx: Context, phase1_cached: bool, total_bytes: int, limit: int) -> tuple[bool, str]:
    if not phase1_cached:
        return False, "phase 1 trained on images, so there are no cached views (feature_views)"
    if ctx.cfg.phase2_mode == "images":
        return False, "phase2_mode = images"
    if total_bytes > limit:
        return False, (
            f"the views' activations would take {total_bytes / 2**30:.1f} GiB"
            f" (more than the {limit / 2**30:.1f} GiB free beside the run)"
        )
    return True, ""


def _bytes(ctx: Context, cut: FrozenCut, split: str) -> int:
    return ctx.info.num_examples(split) * int(np.prod(cut.lower.output.shape[1:])) * 4
