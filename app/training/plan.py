"""What phase 2 does: train on images with a fresh augmentation every epoch, or on phase 1's
cached views; for how long. Decided before phase 2 from the configuration and whether the run
starts from an earlier one, never from how well phase 1 did.

Phase 2 on the views costs a fraction of an epoch on images (the frozen layers ran once, when
phase 1's cache was built), but it sees the same K crops of each photo every epoch, and on every
photo set measured it ended below phase 2 on images. A rule that chose the views only when
phase 1 was near saturation made a cliff: one more val photo right in phase 1 switched to the
cheap path and gave a worse final model. So a cold start always trains phase 2 on images, for
`epochs_finetune` epochs: its whole cosine schedule (early stopping would end it while the rate
is still at its peak), keeping its end, the last epoch, where its val_loss beats phase 1's: the
epoch a small validation split likes best is a noisy pick among nearly equal losses. A warm
start (`init_from`, whose weights already had their phase 2) takes the short path on the views
with early stopping, where they exist. `phase2_mode = views | images` forces one. The
measurements are in benchmarks/README.md ("Suite", "Which of phase 2's weights to keep").

Phase 2's epochs are a count, not a time: the same data and seed get the same phase 2 on any
machine, whatever its speed or the feature store holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.config import TrainConfig


@dataclass(frozen=True)
class Phase2Plan:
    mode: str  # "views" (phase 1's cached views' activations) or "images" (decoded and augmented each epoch)
    epochs: int  # at most
    patience: int  # epochs without improvement before it stops
    reason: str  # why, for the log and metrics.json
    keep_last: bool = False  # keep the latest epoch that beats phase 1, not the best

    def describe(self) -> str:
        where = "phase 1's cached views" if self.mode == "views" else "images, freshly augmented each epoch"
        length = (
            f"{self.epochs} epochs, its whole schedule, keeping the last epoch that beats phase 1"
            if self.keep_last
            else f"up to {self.epochs} epochs while validation improves (patience {self.patience})"
        )
        return f"phase 2 on {where}: {length}; {self.reason}"

    def to_dict(self) -> dict:
        keep = "last" if self.keep_last else "best"
        return {
            "mode": self.mode,
            "epochs": self.epochs,
            "patience": self.patience,
            "keep": keep,
            "reason": self.reason,
        }


def plan_phase2(cfg: TrainConfig, views: str | None, warm_start: bool = False) -> Phase2Plan:
    """The plan for phase 2. `views`: None when phase 1's views can carry phase 2, else why not
    (phase 1 on images, no cut, memory); `warm_start`: the run started from an earlier run's
    weights (`init_from`)."""
    mode = cfg.phase2_mode
    if mode == "auto":
        mode = "views" if warm_start and views is None else "images"
        why = (
            "phase2_mode = auto, starting from an earlier run's trained weights (init_from)"
            if mode == "views"
            else "phase2_mode = auto" + (", a cold start" if not warm_start else f"; no cached views: {views}")
        )
    elif mode == "views" and views is not None:
        mode, why = "images", f"phase2_mode = views; no cached views: {views}"
    else:
        why = f"phase2_mode = {mode}"
    if mode == "views":  # cheap epochs on fixed crops: stop when validation stops improving
        return Phase2Plan("views", cfg.epochs_finetune, cfg.early_stopping_patience, why)
    return Phase2Plan("images", cfg.epochs_finetune, cfg.epochs_finetune, why, keep_last=True)  # no early stop
