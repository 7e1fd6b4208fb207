"""One training phase: epochs with a progress bar, early stopping, best weights, resumable state.

Everything needed to continue after a kill (model, optimizer, epoch counter, early-stopping
state) is one tf.train.Checkpoint written at the end of every epoch, so a restarted run
continues from the last finished epoch of the phase it was in. The same runner serves both
phases; train.py builds a `Phase` for each.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import keras
import numpy as np
import tensorflow as tf

from app import storage
from app.errors import UserError
from app.progress import progress_bar
from app.run_dir import RunDir
from app.training.history import History
from app.training.optimizer import averaged_weights, keeps_average
from app.training.phase_weights import KeptWeights, restore_newest_whole
from app.training.steps import CompiledSteps, Evaluation

log = logging.getLogger(__name__)


@dataclass
class PhaseResult:
    val_loss: float
    val_accuracy: float
    epochs: int  # epochs run in this phase
    best_epoch: int  # 1-based epoch (within the phase) whose weights were kept
    stopped_early: bool
    seconds: float
    images_per_s: float
    val_confusion_matrix: list  # of the kept weights; rows: true class (multi-label: [label][true][predicted])
    still_improving: bool = False  # its last epoch had its lowest val_loss: more epochs would likely help

    def to_dict(self) -> dict:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


KeptPhases = dict[int, "PhaseResult | None"]  # phase number → its result (None: the phase did not run)


@dataclass(frozen=True, kw_only=True)
class PhaseSpec:
    phase: int  # 1 or 2
    epochs: int
    steps_per_epoch: int
    steps_per_execution: int
    patience: int  # epochs without improvement of select_by before stopping
    epoch_offset: int  # global epoch number of this phase's epoch 0
    select_by: str = "val_loss"  # or "val_accuracy", ties broken by val_loss
    keep_last: bool = False  # keep the latest epoch that beats the baseline, not the best: a whole schedule's end


@dataclass(frozen=True, kw_only=True)
class PhaseInputs:
    train_iterator: Callable[[], Iterator]  # called lazily: a finished phase (seen on resume) needs no data
    val_dataset: Callable[[], object]  # a fresh finite (distributed) dataset per epoch


@dataclass(frozen=True, kw_only=True)
class PhaseFiles:
    """Where a phase reads and writes its checkpoint and best weights.

    Under multi-worker training every worker saves (saving may involve collective ops), but only
    the chief writes the run dir: the others write to a scratch run dir, as TensorFlow documents,
    and read the chief's files when resuming (so the run dir must be on storage all workers see).
    For the chief and for single-worker runs both are the run dir.
    """

    read: RunDir
    write: RunDir

    def best_to_load(self, phase: int, epoch: int) -> str:
        """This worker's own copy if it wrote one in this process, else the chief's (on resume).
        Replicas hold identical weights, so the two copies are the same."""
        own = self.write.best_weights(phase, epoch)
        return str(own if own.exists() else self.read.best_weights(phase, epoch))


@dataclass(frozen=True, kw_only=True)
class Phase:
    spec: PhaseSpec
    steps: CompiledSteps  # compiled train/eval steps of the model being trained (logits, or head on features)
    inputs: PhaseInputs
    model: keras.Model  # whose weights are checkpointed and kept as "best" (cached phase 1: the head only)
    files: PhaseFiles
    history: History
    baseline: PhaseResult | None = None  # phase 1's result: phase 2 must beat it to count
    val_steps: CompiledSteps | None = None  # validation on another model than `steps` trains (phase 2: the tail)

    @property
    def validation(self) -> CompiledSteps:
        return self.val_steps or self.steps


def beats(loss: float, accuracy: float, best_loss: float, best_accuracy: float, select_by: str) -> bool:
    """Whether an epoch's validation result beats the best so far (phase 2's first: phase 1's):
    lower loss, or with select_by="val_accuracy" higher accuracy, equal accuracy going to the
    lower loss. One criterion, with no second bar on phase 1's accuracy: on a small validation
    split phase 1's kept accuracy is its luckiest, and such a bar throws away a better phase 2
    (benchmarks/README.md, "Which of phase 2's weights to keep")."""
    lower_loss = loss < best_loss - 1e-7
    if select_by == "val_loss":
        return lower_loss
    return accuracy > best_accuracy + 1e-9 or (abs(accuracy - best_accuracy) <= 1e-9 and lower_loss)


def save_val_outputs(val: Evaluation, path) -> None:
    """The kept epoch's validation logits and labels, so that the temperature (and multi-label
    thresholds) are fitted on them after training without another pass over the split."""
    with storage.atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, logits=val.logits, labels=val.labels)


def current_learning_rate(optimizer: keras.optimizers.Optimizer) -> float:
    """Works for constant rates and schedules, and for distributed (mirrored) variables."""
    lr = optimizer.learning_rate
    if callable(lr):
        lr = lr(tf.convert_to_tensor(optimizer.iterations))
    return float(tf.convert_to_tensor(lr))


class PhaseState:
    """Epoch counter and early-stopping state, checkpointed with the model and optimizer."""

    def __init__(self, phase: Phase) -> None:
        self.phase = phase
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.best_val_loss = tf.Variable(math.inf, dtype=tf.float64, trainable=False)
        self.best_val_accuracy = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        self.best_epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.own_best_val_loss = tf.Variable(math.inf, dtype=tf.float64, trainable=False)  # of this phase's epochs
        self.own_best_epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.wait = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.seconds = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        self.best_confusion = tf.Variable(tf.zeros(phase.steps.confusion_shape, tf.int64), trainable=False)
        self.kept = KeptWeights(phase)
        if phase.baseline is not None:
            self.best_val_loss.assign(phase.baseline.val_loss)
            self.best_val_accuracy.assign(phase.baseline.val_accuracy)
            self.best_confusion.assign(phase.baseline.val_confusion_matrix)
        checkpoint = tf.train.Checkpoint(
            model=phase.model,
            optimizer=phase.steps.optimizer,
            epoch=self.epoch,
            best_val_loss=self.best_val_loss,
            best_val_accuracy=self.best_val_accuracy,
            best_epoch=self.best_epoch,
            own_best_val_loss=self.own_best_val_loss,
            own_best_epoch=self.own_best_epoch,
            wait=self.wait,
            seconds=self.seconds,
            best_confusion=self.best_confusion,
        )
        self._checkpoint = checkpoint
        self._manager = tf.train.CheckpointManager(
            checkpoint,
            str(phase.files.write.phase_checkpoints(phase.spec.phase)),
            max_to_keep=2,  # the one before the newest: what resume falls back to if the newest is damaged
        )

    def restore(self) -> None:
        folder = self.phase.files.read.phase_checkpoints(self.phase.spec.phase)
        restored = restore_newest_whole(self._checkpoint, folder)
        if restored:
            log.info("resuming phase %d after epoch %d (%s)", self.phase.spec.phase, self.epochs_done, restored)

    def save(self) -> None:
        """A checkpoint cut short by a full disk is never the one resume reads: the manager's
        state file still names the previous one."""
        with storage.space_named(self._manager.directory):
            self._manager.save()

    @property
    def epochs_done(self) -> int:
        return int(self.epoch)

    @property
    def stopped(self) -> bool:
        return int(self.wait) >= self.phase.spec.patience

    @property
    def finished(self) -> bool:
        return self.epochs_done >= self.phase.spec.epochs or self.stopped

    def improves(self, val: Evaluation) -> bool:
        """Whether this epoch becomes the kept one: it beats the best so far, or with keep_last
        the baseline alone (phase 1's result; every epoch of a phase without one)."""
        spec, baseline = self.phase.spec, self.phase.baseline
        if spec.keep_last:
            return baseline is None or beats(
                val.loss, val.accuracy, baseline.val_loss, baseline.val_accuracy, spec.select_by
            )
        best_loss, best_accuracy = float(self.best_val_loss), float(self.best_val_accuracy)
        return beats(val.loss, val.accuracy, best_loss, best_accuracy, spec.select_by)

    def stop_reason(self) -> str:
        """Why the phase stopped early, in the terms `improves` decides by."""
        spec, best = self.phase.spec, int(self.best_epoch)
        where = f"epoch {best}" if best else "phase 1's weights"
        epochs = f"{spec.patience} epoch{'s' if spec.patience != 1 else ''}"
        return (
            f"{epochs} without beating the best on {spec.select_by} ({where}: val_loss"
            f" {float(self.best_val_loss):.4f}, val_accuracy {float(self.best_val_accuracy):.4f})"
        )

    def record(self, epoch: int, val: Evaluation, seconds: float, improved: bool) -> None:
        if improved:
            self.best_val_loss.assign(val.loss)
            self.best_val_accuracy.assign(val.accuracy)
            self.best_epoch.assign(epoch)
            self.best_confusion.assign(val.confusion_matrix)
            self.wait.assign(0)
        else:
            self.wait.assign_add(1)
        if val.loss < float(self.own_best_val_loss):
            self.own_best_val_loss.assign(val.loss)
            self.own_best_epoch.assign(epoch)
        self.epoch.assign(epoch)
        self.seconds.assign_add(seconds)

    def result(self) -> PhaseResult:
        spec, seconds = self.phase.spec, float(self.seconds)
        images = self.epochs_done * spec.steps_per_epoch * self.phase.steps.global_batch_size
        return PhaseResult(
            val_loss=float(self.best_val_loss),
            val_accuracy=float(self.best_val_accuracy),
            epochs=self.epochs_done,
            best_epoch=int(self.best_epoch),
            stopped_early=self.stopped and self.epochs_done < spec.epochs,
            seconds=seconds,
            images_per_s=images / seconds if seconds else 0.0,
            val_confusion_matrix=self.best_confusion.numpy().tolist(),
            still_improving=self.epochs_done == spec.epochs and int(self.own_best_epoch) == spec.epochs > 1,
        )


def run_phase(phase: Phase) -> PhaseResult:
    """Train up to spec.epochs and keep the weights that score best on spec.select_by (with
    spec.keep_last: the latest epoch's), return their metrics.

    With a `baseline` (phase 1's result, whose weights are loaded at the start), an epoch must
    beat it on spec.select_by to be kept; if none does, the phase ends with the weights it
    started from, held in memory as its "epoch 0" before training (the whole model: a cached
    phase 1 kept only the head). So phase 2 never leaves the model worse on that figure than
    phase 1 did.
    """
    state = PhaseState(phase)
    if phase.baseline is not None:  # the weights to fall back to, backbone included, before a resume moves them
        state.kept.hold_starting_weights()
    state.restore()
    phase.history.truncate(phase.spec.phase, state.epochs_done)
    iterator = None
    while not state.finished:
        start = time.perf_counter()  # an epoch's seconds include making its input (the feature cache, once)
        if iterator is None:
            iterator = phase.inputs.train_iterator()
        if not _run_epoch(phase, state, iterator, start):
            log.warning("%s", _diverged(phase, state))
        elif state.stopped:
            log.info("early stopping: %s", state.stop_reason())
    if not int(state.best_epoch) and phase.baseline is None:
        raise UserError(f"{_diverged(phase, state)}; nothing was exported")
    _load_kept_weights(phase, state)
    result = state.result()
    if result.still_improving:
        flag = "--epochs-head" if phase.spec.phase == 1 else "--epochs-finetune"
        log.warning(
            "phase %d was still improving val_loss at its last epoch (%d); more epochs may help (%s)",
            phase.spec.phase,
            result.epochs,
            flag,
        )
    return result


def _diverged(phase: Phase, state: PhaseState) -> str:
    """What a phase whose loss became NaN or infinite did, and what to change."""
    number, best = phase.spec.phase, int(state.best_epoch)
    key = "lr_head" if number == 1 else "lr_finetune"
    kept = f"keeping epoch {best}'s weights" if best else "no epoch to keep"
    if not best and phase.baseline is not None:
        kept = f"keeping phase {number - 1}'s weights"
    return (
        f"phase {number} diverged: its loss was not finite at epoch {state.epochs_done}, so it stopped there,"
        f" {kept}; a lower learning rate avoids it (the rate was {current_learning_rate(phase.steps.optimizer):.3g};"
        f" lower {key}, or {key} = auto, then --overwrite)"
    )


def _run_epoch(phase: Phase, state: PhaseState, iterator: Iterator, start: float) -> bool:
    """One epoch trained, validated, checkpointed and logged; False where its loss was not finite
    (the weights are then NaN or past saving, and the epoch is never kept)."""
    spec, epoch = phase.spec, state.epochs_done + 1
    print(f"Phase {spec.phase} epoch {epoch}/{spec.epochs}", flush=True)
    train_start = time.perf_counter()
    loss, accuracy = _train_epoch(phase.steps, iterator, spec)
    train_seconds = time.perf_counter() - train_start
    with averaged_weights(phase.steps.optimizer):  # with ema_decay: the average is validated and kept
        val = phase.validation.evaluate(phase.inputs.val_dataset())
        finite = math.isfinite(loss) and math.isfinite(val.loss)
        improved = finite and state.improves(val)
        if improved:
            state.kept.save(epoch)
            save_val_outputs(val, phase.files.write.best_val_outputs(spec.phase, epoch))
    seconds = time.perf_counter() - start
    state.record(epoch, val, seconds, improved)
    if not finite:  # weights past a non-finite loss never recover: the phase stops, resumed or not
        state.wait.assign(spec.patience)
    phase.history.append(
        {
            "phase": spec.phase,
            "epoch": spec.epoch_offset + epoch,
            "phase_epoch": epoch,
            "loss": round(loss, 6),
            "accuracy": round(accuracy, 6),
            "val_loss": round(val.loss, 6),
            "val_accuracy": round(val.accuracy, 6),
            "lr": f"{current_learning_rate(phase.steps.optimizer):.3g}",
            "seconds": round(seconds, 2),
            "images_per_s": spec.steps_per_epoch * phase.steps.global_batch_size / train_seconds,
        }
    )
    state.save()  # last: everything this epoch did is on disk before it counts as done
    for stale in phase.files.write.stale_best_weights(spec.phase, int(state.best_epoch)):
        stale.unlink()
    print(
        f"  loss {loss:.4f}  accuracy {accuracy:.4f}  val_loss {val.loss:.4f}  val_accuracy {val.accuracy:.4f}"
        f"  {seconds:.1f}s{_kept_mark(spec) if improved else ''}",
        flush=True,
    )
    return finite


def _kept_mark(spec: PhaseSpec) -> str:
    """The log's mark on an epoch that is now the one kept: the best so far, or with keep_last
    the latest to beat phase 1."""
    return "  *kept" if spec.keep_last else "  *best"


def _train_epoch(steps: CompiledSteps, iterator: Iterator, spec: PhaseSpec) -> tuple[float, float]:
    """(mean loss, accuracy) over one epoch of `spec.steps_per_epoch` steps, with a progress bar:
    tqdm's, like every long job here (Keras' Progbar writes colour codes into redirected logs)."""
    totals = tf.zeros([3])
    with progress_bar(spec.steps_per_epoch, "step", "Training") as bar:
        while bar.n < spec.steps_per_epoch:
            n = min(spec.steps_per_execution, spec.steps_per_epoch - bar.n)
            totals += steps.train(iterator, n)
            loss_sum, correct, count = totals.numpy()
            bar.set_postfix(loss=f"{loss_sum / count:.4f}", accuracy=f"{correct / count:.4f}", refresh=False)
            bar.update(n)
            if not math.isfinite(loss_sum):  # diverged: the rest of the epoch would only spread NaN
                break
    loss_sum, correct, count = (float(v) for v in totals.numpy())
    return loss_sum / count, correct / count


def _load_kept_weights(phase: Phase, state: PhaseState) -> None:
    number, baseline, best = phase.spec.phase, phase.baseline, int(state.best_epoch)
    if best and best == state.epochs_done and not keeps_average(phase.steps.optimizer):
        return  # the last epoch is the kept one, and its weights are still (or, resumed, again) in the model
    if best:
        state.kept.restore(best)
    elif baseline is not None:  # back to the weights the phase started from (held as its epoch 0)
        log.info(
            "phase %d did not beat phase %d on %s; keeping phase %d's weights",
            number,
            number - 1,
            phase.spec.select_by,
            number - 1,
        )
        state.kept.restore(0)
