"""One training phase: epochs with progress bar, early stopping, best weights, resumable state.

Everything needed to continue after a kill (model, optimizer, epoch counter, early-stopping
state) is one tf.train.Checkpoint written at the end of every epoch, so a restarted run
continues from the last finished epoch of the phase it was in.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import keras
import tensorflow as tf

from app.training.history import History
from app.training.steps import Steps

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

    def to_dict(self) -> dict:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


@dataclass
class PhaseSpec:
    phase: int  # 1 or 2
    epochs: int
    steps_per_epoch: int
    steps_per_execution: int
    patience: int
    epoch_offset: int  # global epoch number of this phase's epoch 0


@dataclass(frozen=True)
class PhaseFiles:
    """Where a phase keeps its checkpoint and best weights.

    Under multi-worker training every worker saves (saving may involve collective ops), but only
    the chief writes the run dir: the others write to a scratch dir, as TensorFlow documents, and
    read the chief's files when resuming (so the run dir must be on storage all workers see).
    For the chief and for single-worker runs both dirs are the run's checkpoints dir.
    """

    read_dir: Path
    write_dir: Path
    phase: int

    @property
    def checkpoint_dir(self) -> Path:
        return self.write_dir / f"phase{self.phase}"

    def latest_checkpoint(self) -> str | None:
        return tf.train.latest_checkpoint(str(self.read_dir / f"phase{self.phase}"))

    def best(self, epoch: int, phase: int | None = None) -> Path:
        """Where this worker writes the best weights of `epoch`."""
        return self.write_dir / f"phase{phase or self.phase}_best_epoch{epoch:03d}.weights.h5"

    def best_to_load(self, epoch: int, phase: int | None = None) -> Path:
        """This worker's own copy if it wrote one in this process, else the chief's (on resume).
        Replicas hold identical weights, so the two copies are the same."""
        own = self.best(epoch, phase)
        return own if own.exists() else self.read_dir / own.name

    def stale_best(self, keep_epoch: int) -> list[Path]:
        return [p for p in self.write_dir.glob(f"phase{self.phase}_best_epoch*.weights.h5") if p != self.best(keep_epoch)]


def save_weights_atomic(model: keras.Model, path: Path) -> None:
    tmp = path.with_name(path.name.replace(".weights.h5", ".tmp.weights.h5"))
    model.save_weights(str(tmp))
    os.replace(tmp, path)


def current_learning_rate(optimizer: keras.optimizers.Optimizer) -> float:
    """Works for constant rates and schedules, and for distributed (mirrored) variables."""
    lr = optimizer.learning_rate
    if callable(lr):
        lr = lr(tf.convert_to_tensor(optimizer.iterations))
    return float(tf.convert_to_tensor(lr))


def run_phase(
    spec: PhaseSpec,
    steps: Steps,
    make_train_iterator: Callable[[], object],
    make_val_dataset: Callable[[], object],
    weights_model: keras.Model,  # the model whose weights are checkpointed and kept as "best"
    optimizer: keras.optimizers.Optimizer,
    files: PhaseFiles,
    history: History,
    images_per_step: int,
    baseline: PhaseResult | None = None,
) -> PhaseResult:
    """Train up to spec.epochs, keep the weights with the lowest val_loss, return their metrics.

    With a `baseline` (phase 1's result, whose weights are loaded at the start), an epoch must
    beat it to count as best; if none does, the phase ends with the baseline's weights. So
    phase 2 can never leave the model worse on validation than phase 1 did.
    """
    state = {
        "epoch": tf.Variable(0, dtype=tf.int64, trainable=False),
        "best_val_loss": tf.Variable(math.inf, dtype=tf.float64, trainable=False),
        "best_val_accuracy": tf.Variable(0.0, dtype=tf.float64, trainable=False),
        "best_epoch": tf.Variable(0, dtype=tf.int64, trainable=False),
        "wait": tf.Variable(0, dtype=tf.int64, trainable=False),
        "seconds": tf.Variable(0.0, dtype=tf.float64, trainable=False),
    }
    if baseline is not None:
        state["best_val_loss"].assign(baseline.val_loss)
        state["best_val_accuracy"].assign(baseline.val_accuracy)
    checkpoint = tf.train.Checkpoint(model=weights_model, optimizer=optimizer, **state)
    manager = tf.train.CheckpointManager(checkpoint, str(files.checkpoint_dir), max_to_keep=1)
    latest = files.latest_checkpoint()
    if latest:
        checkpoint.restore(latest).assert_existing_objects_matched()
        log.info("resuming phase %d after epoch %d (%s)", spec.phase, int(state["epoch"]), latest)
    history.truncate(spec.phase, int(state["epoch"]))
    stopped = int(state["wait"]) >= spec.patience
    train_iterator = None
    while int(state["epoch"]) < spec.epochs and not stopped:
        if train_iterator is None:  # lazily: a finished phase (seen again on resume) needs no data
            train_iterator = make_train_iterator()
        epoch = int(state["epoch"]) + 1
        print(f"Phase {spec.phase} epoch {epoch}/{spec.epochs}", flush=True)
        start = time.perf_counter()
        train = _train_epoch(steps, train_iterator, spec)
        val = steps.evaluate(make_val_dataset())
        seconds = time.perf_counter() - start
        improved = val["loss"] < float(state["best_val_loss"]) - 1e-7
        if improved:
            save_weights_atomic(weights_model, files.best(epoch))
            state["best_val_loss"].assign(val["loss"])
            state["best_val_accuracy"].assign(val["accuracy"])
            state["best_epoch"].assign(epoch)
            state["wait"].assign(0)
        else:
            state["wait"].assign_add(1)
        state["epoch"].assign(epoch)
        state["seconds"].assign_add(seconds)
        lr = current_learning_rate(optimizer)
        history.append({
            "phase": spec.phase, "epoch": spec.epoch_offset + epoch, "phase_epoch": epoch,
            "loss": round(train["loss"], 6), "accuracy": round(train["accuracy"], 6),
            "val_loss": round(val["loss"], 6), "val_accuracy": round(val["accuracy"], 6),
            "lr": f"{lr:.3g}", "seconds": round(seconds, 2),
        })
        manager.save()  # last: everything this epoch did is on disk before it counts as done
        for stale in files.stale_best(int(state["best_epoch"])):
            stale.unlink()
        print(
            f"  loss {train['loss']:.4f}  accuracy {train['accuracy']:.4f}  val_loss {val['loss']:.4f}"
            f"  val_accuracy {val['accuracy']:.4f}  {seconds:.1f}s{'  *best' if improved else ''}",
            flush=True,
        )
        stopped = int(state["wait"]) >= spec.patience
        if stopped:
            log.info("early stopping: val_loss has not improved for %d epochs", spec.patience)
    if int(state["best_epoch"]):
        weights_model.load_weights(str(files.best_to_load(int(state["best_epoch"]))))
    elif baseline is not None and baseline.best_epoch:  # phase 1's kept weights, reloaded on resume too
        log.info("phase %d did not beat phase %d on val_loss; keeping phase %d's weights", spec.phase, spec.phase - 1, spec.phase - 1)
        weights_model.load_weights(str(files.best_to_load(baseline.best_epoch, spec.phase - 1)))
    epochs = int(state["epoch"])
    total_seconds = float(state["seconds"])
    return PhaseResult(
        val_loss=float(state["best_val_loss"]), val_accuracy=float(state["best_val_accuracy"]),
        epochs=epochs, best_epoch=int(state["best_epoch"]), stopped_early=stopped and epochs < spec.epochs,
        seconds=total_seconds,
        images_per_s=(epochs * spec.steps_per_epoch * images_per_step / total_seconds) if total_seconds else 0.0,
    )


def _train_epoch(steps: Steps, iterator, spec: PhaseSpec) -> dict[str, float]:
    bar = keras.utils.Progbar(spec.steps_per_epoch, stateful_metrics=["loss", "accuracy"])
    totals = tf.zeros([3])
    done = 0
    while done < spec.steps_per_epoch:
        n = min(spec.steps_per_execution, spec.steps_per_epoch - done)
        totals += steps.train(iterator, n)
        done += n
        loss_sum, correct, count = totals.numpy()
        bar.update(done, [("loss", loss_sum / count), ("accuracy", correct / count)])
    loss_sum, correct, count = (float(v) for v in totals.numpy())
    return {"loss": loss_sum / count, "accuracy": correct / count}
