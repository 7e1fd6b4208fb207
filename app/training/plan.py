"""What phase 2 does, decided after phase 1 from what phase 1 left: train on phase 1's cached
views, or on images with a fresh augmentation every epoch; for how long.

Phase 2 on the views costs a fraction of an epoch on images (the frozen layers ran once, when
phase 1's cache was built), but it sees the same K crops of each photo every epoch: where
phase 1 is near saturation that is all it needs, and far from it the unfrozen layers memorise
the crops (training accuracy climbs, validation stays put). There phase 2 on images, with more
epochs, is what pays. `phase2_mode = auto` chooses between them by phase 1's kept validation
accuracy, and gives phase 2 on images more epochs, run to the end; `views` and `images` force
one mode with the configured epochs and patience. Other phases stop early when validation stops
improving. The threshold is `views_above` (0.95); the measurements behind it are in
benchmarks/README.md ("Training choices").

Phase 2's epochs are a count, not a time: its cosine schedule anneals over exactly the epochs
planned, and the same data and seed get the same phase 2 on any machine, whatever its speed
or the feature store holds. The long phase 2 on images runs its whole schedule and keeps its
best epoch: with early stopping (patience 4), first epochs at the peak learning rate that did
not beat phase 1 ended it before the rate came down, in 2 of 30 such runs measured. A time
cap (`finetune_time_cap` times phase 1's seconds) is there for who needs a bound, off by
default: it stopped phase 2 at 4 to 8 of 15 epochs, before the learning rate came down, and
where it stopped followed the machine's speed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from app.config import TrainConfig

IMAGES_EPOCHS = 2  # the long phase 2 on images runs this many times epochs_finetune epochs


@dataclass(frozen=True)
class Phase2Plan:
    mode: str  # "views" (phase 1's cached views' activations) or "images" (decoded and augmented each epoch)
    epochs: int  # at most
    patience: int  # epochs without improvement before it stops
    max_seconds: float  # its time cap (math.inf: none)
    reason: str  # why, for the log and metrics.json

    def describe(self) -> str:
        cap = "" if math.isinf(self.max_seconds) else f", stopping by {self.max_seconds:.0f} s"
        where = "phase 1's cached views" if self.mode == "views" else "images, freshly augmented each epoch"
        length = (
            f"{self.epochs} epochs, its whole schedule, keeping the best"
            if self.patience >= self.epochs
            else f"up to {self.epochs} epochs while validation improves (patience {self.patience})"
        )
        return f"phase 2 on {where}: {length}{cap}; {self.reason}"

    def to_dict(self) -> dict:
        return {
            "mode": self.mode,
            "epochs": self.epochs,
            "patience": self.patience,
            "max_seconds": None if math.isinf(self.max_seconds) else round(self.max_seconds, 1),
            "reason": self.reason,
        }


def plan_phase2(
    cfg: TrainConfig,
    phase1_accuracy: float | None,
    phase1_seconds: float,
    views: str | None,
    stored_seconds: float = 0.0,
    warm_start: bool = False,
) -> Phase2Plan:
    """The plan for phase 2. `views`: None when phase 1's views can carry phase 2, else why not
    (phase 1 on images, no cut, memory); `phase1_accuracy` is None when phase 1 did not run;
    `stored_seconds`: what phase 1's features read from the feature store took to compute, counted
    in phase 1's cost, so that a run that finds them gets the phase 2 a run that computes them gets
    (with a time cap); `warm_start`: the run started from an earlier run's weights (`init_from`)."""
    if cfg.phase2_mode != "auto":  # asked for: as configured, on images when there are no views
        mode = "views" if cfg.phase2_mode == "views" and views is None else "images"
        reason = f"phase2_mode = {cfg.phase2_mode}" + ("" if mode == cfg.phase2_mode else f"; no cached views: {views}")
        return _configured(cfg, mode, reason)
    saturated = cfg.views_above
    if phase1_accuracy is not None and phase1_accuracy >= saturated:
        where = "on the views" if views is None else f"on images (no cached views: {views})"
        reason = (
            f"phase2_mode = auto: phase 1 reached val accuracy {phase1_accuracy:.3f} (>= {saturated:.2f}, views_above),"
            f" near saturation: a short phase 2 {where}"
        )
        return _configured(cfg, "views" if views is None else "images", reason)
    left = (
        "phase 1 did not run"
        if phase1_accuracy is None
        else f"phase 1 reached val accuracy {phase1_accuracy:.3f} (< {saturated:.2f}, views_above)"
    )
    if warm_start and views is None:
        reason = (
            f"phase2_mode = auto: {left}, starting from an earlier run's trained weights (init_from):"
            " a short phase 2 on the views, where a cold start gets a long one on images"
        )
        return _configured(cfg, "views", reason)
    reason = f"phase2_mode = auto: {left}, far from saturation, where fresh augmentation each epoch pays"
    cost = phase1_seconds + stored_seconds
    cap = cfg.finetune_time_cap * cost if cfg.finetune_time_cap and phase1_seconds > 0 else math.inf
    if not math.isinf(cap):
        stored = f" ({stored_seconds:.0f} s of it the stored features' computing)" if stored_seconds else ""
        reason += f"; time cap {cfg.finetune_time_cap:g} x phase 1's {cost:.0f} s{stored} (finetune_time_cap)"
    epochs = cfg.epochs_finetune * IMAGES_EPOCHS
    return Phase2Plan("images", epochs, epochs, cap, reason)  # no early stop: its first epochs run at the peak rate


def _configured(cfg: TrainConfig, mode: str, reason: str) -> Phase2Plan:
    """A phase 2 of the configured epochs and patience, uncapped: forced modes and the short ones."""
    return Phase2Plan(mode, cfg.epochs_finetune, cfg.early_stopping_patience, math.inf, reason)
