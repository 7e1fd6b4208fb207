"""Per-epoch records: history.csv, TensorBoard scalars and the two-phase learning-curve plot."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import tensorflow as tf

FIELDS = ["phase", "epoch", "phase_epoch", "loss", "accuracy", "val_loss", "val_accuracy", "lr", "seconds"]


class History:
    """Appends one row per finished epoch. On resume, rows past the restored epoch are dropped,
    so an epoch interrupted after its row was written is not counted twice."""

    def __init__(self, run_dir: Path, enabled: bool = True) -> None:
        self.path = run_dir / "history.csv"
        self.enabled = enabled
        self.writer = tf.summary.create_file_writer(str(run_dir / "tensorboard")) if enabled else None

    def rows(self) -> list[dict[str, str]]:
        if not self.path.exists():
            return []
        with self.path.open(newline="") as f:
            return list(csv.DictReader(f))

    def truncate(self, phase: int, phase_epochs_done: int) -> None:
        if not self.enabled:
            return
        keep = [r for r in self.rows() if int(r["phase"]) < phase or (int(r["phase"]) == phase and int(r["phase_epoch"]) <= phase_epochs_done)]
        self._write(keep)

    def append(self, row: dict[str, float | int]) -> None:
        if not self.enabled:
            return
        self._write(self.rows() + [{k: str(row[k]) for k in FIELDS}])
        # Plain Summary protos: TensorBoard reads them, and writing them needs no tensorboard package.
        summary = tf.compat.v1.Summary(value=[
            tf.compat.v1.Summary.Value(tag=key, simple_value=float(row[key]))
            for key in ("loss", "accuracy", "val_loss", "val_accuracy", "lr")
        ])
        with self.writer.as_default():
            tf.summary.experimental.write_raw_pb(summary.SerializeToString(), step=int(row["epoch"]))
        self.writer.flush()

    def _write(self, rows: list[dict[str, str]]) -> None:
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS)
            writer.writeheader()
            writer.writerows(rows)
        os.replace(tmp, self.path)


def plot_learning_curves(history_csv: Path, out_png: Path) -> Path | None:
    """Loss and accuracy over both phases on one time axis, with the phase boundary marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with history_csv.open(newline="") as f:
        rows = list(csv.DictReader(f))
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
    fig.tight_layout()
    tmp = out_png.with_name(f".{out_png.stem}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, out_png)
    return out_png
