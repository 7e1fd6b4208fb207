"""Per-epoch records of a run: history.csv (with TensorBoard beside it) and the learning-curve plot."""

from __future__ import annotations

import csv
from pathlib import Path

from app import storage
from app.run_dir import RunDir
from app.training.tensorboard import TensorBoardLog

FIELDS = ["phase", "epoch", "phase_epoch", "loss", "accuracy", "val_loss", "val_accuracy", "lr", "seconds"]


def read_history(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


class History:
    """Appends one row per finished epoch to history.csv and TensorBoard. On resume, rows past the
    restored epoch are dropped, so an epoch interrupted after its row was written is not counted
    twice. Disabled (writes nothing) on the non-chief workers of a multi-worker run."""

    def __init__(self, run: RunDir, enabled: bool = True) -> None:
        self.path = run.history
        self.board = TensorBoardLog(run.tensorboard) if enabled else None

    @property
    def enabled(self) -> bool:
        return self.board is not None

    def truncate(self, phase: int, phase_epochs_done: int) -> None:
        if self.enabled:
            self._write([r for r in read_history(self.path)
                         if int(r["phase"]) < phase or (int(r["phase"]) == phase and int(r["phase_epoch"]) <= phase_epochs_done)])

    def append(self, row: dict[str, float | int | str]) -> None:
        """`row` holds FIELDS; extra numeric keys (e.g. images_per_s) go to TensorBoard only."""
        if not self.enabled:
            return
        self._write(read_history(self.path) + [{k: str(row[k]) for k in FIELDS}])
        self.board.epoch(row)

    def _write(self, rows: list[dict[str, str]]) -> None:
        with storage.atomic_path(self.path) as tmp, open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS)
            writer.writeheader()
            writer.writerows(rows)


def plot_learning_curves(history_csv: Path, out_png: Path) -> Path | None:
    """Loss and accuracy over both phases on one time axis, with the phase boundary marked."""
    from app.evaluation.figures import plt, save_figure

    rows = read_history(history_csv)
    if not rows:
        return None
    epochs = [int(r["epoch"]) for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key in zip(axes, ("loss", "accuracy")):
        ax.plot(epochs, [float(r[key]) for r in rows], "o-", label=f"train {key}")
        ax.plot(epochs, [float(r[f"val_{key}"]) for r in rows], "s-", label=f"val {key}")
        phase2 = [int(r["epoch"]) for r in rows if r["phase"] == "2"]
        if phase2 and len(phase2) < len(rows):
            ax.axvline(min(phase2) - 0.5, color="gray", linestyle="--", label="phase 2 starts")
        ax.set_xlabel("epoch")
        ax.set_title(key)
        ax.grid(alpha=0.3)
        ax.legend()
    return save_figure(fig, out_png)
