"""Per-epoch records of a run as it trains: history.csv (its layout is app/run_dir.py's) and TensorBoard."""

from __future__ import annotations

import csv

from app import storage
from app.run_dir import HISTORY_FIELDS as FIELDS
from app.run_dir import RunDir, read_history
from app.training.tensorboard import TensorBoardLog


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
            self._write(
                [
                    r
                    for r in read_history(self.path)
                    if int(r["phase"]) < phase
                    or (int(r["phase"]) == phase and int(r["phase_epoch"]) <= phase_epochs_done)
                ]
            )

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
