"""A phase's weights on disk: written whole or not at all, the newest checkpoint that reads back
whole restored, and the epoch a phase keeps (`KeptWeights`)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import keras
import numpy as np
import tensorflow as tf

from app import storage
from app.errors import UserError

if TYPE_CHECKING:
    from app.training.phase import Phase

log = logging.getLogger(__name__)


def save_weights_atomic(model: keras.Model, path) -> None:
    with storage.atomic_path(path) as tmp:
        model.save_weights(tmp)


def restore_newest_whole(checkpoint: tf.train.Checkpoint, folder) -> str | None:
    """Restore the newest checkpoint in `folder` that reads back whole and return its path (None:
    there is none yet). A damaged one (a flipped byte fails its checksum, a cut-short file its
    read) is named in the log and the one before it is used; when none reads, one line says so.
    One that reads but lacks state this version keeps (written by another version) is not called
    damaged."""
    state = tf.train.get_checkpoint_state(str(folder))
    paths = list(state.all_model_checkpoint_paths) if state else []
    other_layout = 0
    for path in reversed(paths):
        try:
            checkpoint.restore(path).assert_existing_objects_matched()
        except (tf.errors.OpError, ValueError, AssertionError) as err:
            mismatched = isinstance(err, AssertionError)  # it read back, into other variables than ours
            other_layout += mismatched
            what = "holds other state than this version saves" if mismatched else "is damaged"
            reason = str(getattr(err, "message", err)).strip().splitlines()[0][:200]
            log.warning("checkpoint %s %s (%s); trying the one before it", path, what, reason)
            continue
        return path
    if paths and other_layout == len(paths):
        raise UserError(
            f"{folder}: its checkpoints hold other state than this version of photoclf saves (written by"
            " another version?); pass --overwrite to start over"
        )
    if paths:
        raise UserError(
            f"{folder}: no checkpoint reads back whole ({len(paths)} damaged); pass --overwrite to start over"
        )
    return None


class KeptWeights:
    """The weights a phase keeps (its best epoch's, or phase 2's fallback "epoch 0", see `hold`):
    written to the run dir, for resuming, and the last written held in memory too, so that the
    phase's end puts them back without reading the file (set_weights is far quicker than Keras'
    load_weights; the cost is one host copy of the weights)."""

    def __init__(self, phase: Phase) -> None:
        self.phase = phase
        self._epoch: int | None = None
        self._values: list[np.ndarray] = []

    def save(self, epoch: int) -> None:
        save_weights_atomic(self.phase.model, self.phase.files.write.best_weights(self.phase.spec.phase, epoch))
        self.hold(epoch)

    def hold_starting_weights(self) -> None:
        """Phase 2's fallback: the weights phase 1 left, held as its "epoch 0" (see `hold`)."""
        self.hold(0)

    def hold(self, epoch: int) -> None:
        """In memory only. Phase 2's "epoch 0", the weights phase 1 left, needs no file: a resumed
        process holds them again before it restores phase 2's checkpoint (the same weights source,
        which the run state checks, and phase 1's kept weights), and writing the whole model
        would delay every run's first phase-2 epoch."""
        self._epoch, self._values = epoch, self.phase.model.get_weights()

    def restore(self, epoch: int) -> None:
        if epoch == self._epoch:
            self.phase.model.set_weights(self._values)
        else:  # written by an earlier process (this run was resumed)
            self.phase.model.load_weights(self.phase.files.best_to_load(self.phase.spec.phase, epoch))
