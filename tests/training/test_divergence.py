"""A run whose loss becomes NaN or infinite: the phase stops at once, keeps what it had, says why;
a run that learnt nothing says so beside its result."""

from __future__ import annotations

import math

import numpy as np
import pytest

from app.config import TrainConfig
from app.errors import UserError
from app.training.context import setup
from app.training.report import format_result, majority_warning
from app.training.train import run_phase1


def test_a_phase_whose_loss_is_not_finite_stops_there_keeping_the_epoch_before(
    tiny_config: TrainConfig, monkeypatch, caplog
):
    """Epoch 2's loss is NaN: no epoch 3 runs (its weights could not recover), epoch 1 is kept, and
    the log says which rate to lower."""
    from app.training import phase as phase_module

    ctx = setup(tiny_config.replace(epochs_head=4, epochs_finetune=0, feature_views="0"))
    train_epoch, epochs, kept_weights = phase_module._train_epoch, [], []

    def nan_in_epoch_2(steps, iterator, spec):
        loss, accuracy = train_epoch(steps, iterator, spec)
        epochs.append(len(epochs) + 1)
        if len(epochs) == 1:
            kept_weights.append([w.numpy().copy() for w in ctx.clf.model.weights])
        return (math.nan if len(epochs) == 2 else loss), accuracy

    monkeypatch.setattr(phase_module, "_train_epoch", nan_in_epoch_2)
    with caplog.at_level("WARNING", logger="app.training.phase"):
        result = run_phase1(ctx)
    assert epochs == [1, 2] and (result.epochs, result.best_epoch) == (2, 1)
    for kept, now in zip(kept_weights[0], ctx.clf.model.weights):
        np.testing.assert_array_equal(now.numpy(), kept)
    (said,) = [r.getMessage() for r in caplog.records if "diverged" in r.getMessage()]
    assert said.startswith("phase 1 diverged: its loss was not finite at epoch 2, so it stopped there,")
    assert "keeping epoch 1's weights" in said and "lower lr_head, or lr_head = auto, then --overwrite" in said


def test_a_phase_that_diverges_before_any_epoch_is_kept_is_an_error_naming_the_rate(tiny_config: TrainConfig):
    """A rate no model survives: the head's weights overflow in the first epoch. Nothing is
    exported from NaN weights; the error says what to change, and the same command says it again."""
    cfg = tiny_config.replace(lr_head=1e38, epochs_head=3, epochs_finetune=0)
    with pytest.raises(UserError, match=r"^phase 1 diverged: its loss was not finite at epoch 1, .* no epoch to keep"):
        run_phase1(setup(cfg))
    with pytest.raises(UserError, match="lower lr_head, or lr_head = auto, then --overwrite\\); nothing was exported"):
        run_phase1(setup(cfg))  # resumed: the phase is over, with nothing to keep


def test_a_result_no_better_than_the_most_common_class_is_called_what_it_is():
    counts = {"daisy": 20, "rose": 30, "tulip": 50}
    said = majority_warning(counts, 0.5)
    assert said == (
        "val accuracy 0.5000 is no better than always answering 'tulip' (50 of 100 val photos, 0.5000):"
        " the model has learnt nothing usable; check that the labels match the photos, and the learning rates"
        " (lr_head, lr_finetune; auto finds them)"
    )
    assert majority_warning(counts, 0.51) is None
    assert majority_warning({}, 0.0) is None
    metrics = {"weights": "none", "learning_warning": said, "export": "runs/x/export/x/1"}
    assert f"WARNING: {said}" in format_result(metrics).splitlines()


def test_the_result_table_keeps_the_smoothed_val_loss_apart_from_the_test_log_loss():
    """val_loss is the training loss (label smoothing included); test's is a plain log loss. One
    column holding both read as a test loss half the val loss."""
    phase = {"epochs": 3, "val_accuracy": 0.9, "val_loss": 0.5157, "seconds": 12.0, "images_per_s": 80.0}
    test = {"accuracy": 0.9487, "loss": 0.2599, "count": 39, "accuracy_interval": [0.831, 0.986]}
    lines = format_result({"weights": "none", "phase1": phase, "test": test, "export": "x/1"}).splitlines()
    assert lines[3].split() == ["phase1", "3", "0.9000", "0.5157", "12", "80.0"]
    assert lines[4].split() == ["test", "0.9487"]
    assert "test accuracy: 0.9487 on 39 photos (95% interval 0.831-0.986); log loss 0.260" in lines


def test_a_multi_label_runs_table_and_test_line_say_its_accuracy_is_the_exact_match_ratio():
    test = {"accuracy": 0.75, "loss": 0.3026, "count": 20}
    phase = {"epochs": 3, "val_accuracy": 0.7, "val_loss": 0.31, "seconds": 12.0, "images_per_s": 80.0}
    metrics = {"weights": "none", "phase1": phase, "test": test, "thresholds": {"chicken": 0.45, "rice": 0.21},
               "export": "x/1"}  # fmt: skip
    lines = format_result(metrics).splitlines()
    assert lines[1].split() == ["epochs", "val_exact_match", "val_loss", "seconds", "images/s"]
    assert (
        "test exact match (every label right): 0.7500 on 20 photos; binary log loss 0.303;"
        " each label's figures and mAP: photoclf evaluate"
    ) in lines
    assert not any(line.startswith("test accuracy") for line in lines)
