"""What each phase may and may not change, and that transfer learning really works."""

from __future__ import annotations

import dataclasses

import keras
import numpy as np
import pytest

from app.config import TrainConfig
from app.models.classifier import unfreeze_start
from app.training.context import setup
from app.training.frozen import FrozenBackbone
from app.training.report import print_model_summary
from app.training.train import run_phase1, run_phase2

pytestmark = pytest.mark.start_first  # its tests take over a minute in all


def _backbone_state(ctx) -> dict[str, np.ndarray]:
    return {v.path: v.numpy().copy() for v in ctx.clf.backbone.weights}


def _head_state(ctx) -> dict[str, np.ndarray]:
    return {v.path: v.numpy().copy() for v in ctx.clf.model.get_layer("logits").weights}


def test_phase1_changes_only_the_head(tiny_config: TrainConfig):
    ctx = setup(tiny_config.replace(epochs_finetune=0))
    backbone_before, head_before = _backbone_state(ctx), _head_state(ctx)
    run_phase1(ctx)
    backbone_after, head_after = _backbone_state(ctx), _head_state(ctx)
    assert backbone_before.keys() == backbone_after.keys() and len(backbone_before) >= 20
    for path, value in backbone_before.items():
        assert value.tobytes() == backbone_after[path].tobytes(), f"{path} changed in phase 1"
    assert any(not np.array_equal(head_before[p], head_after[p]) for p in head_before)


def test_each_epoch_reports_its_progress_and_result_in_plain_text(tiny_config: TrainConfig, capsys):
    run_phase1(setup(tiny_config.replace(epochs_head=2, feature_views="0", epochs_finetune=0)))
    out, err = capsys.readouterr()
    assert "\x1b[" not in out + err  # no terminal colour codes where the output is not a terminal
    assert out.count("Phase 1 epoch") == 2 and out.count("val_accuracy") == 2
    assert out.splitlines()[1].endswith("  *best")  # epoch 1 is the best so far, and the log marks it
    assert err.count("Training: 100%") == 2 and "2/2" in err  # the bar reached every step


def test_the_model_table_fits_a_log_and_keeps_its_parameter_counts(tiny_config: TrainConfig, capsys):
    model = setup(tiny_config).clf.model
    print_model_summary(model)
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 80  # a log's width: nothing cut off at its edge
    logits = next(line for line in lines if line.startswith("│ logits"))
    assert f"{model.get_layer('logits').count_params():,}" in logits
    assert any(line.startswith(f" Total params: {model.count_params():,} (") for line in lines)


def test_phase2_changes_only_unfrozen_layers_and_never_batchnorm(tiny_config: TrainConfig):
    cfg = tiny_config.replace(unfreeze="blocks:1", lr_finetune=1e-2, warmup_fraction=0.0, early_stopping_patience=5)
    ctx = setup(cfg)
    phase1 = run_phase1(ctx)
    start = unfreeze_start(ctx.clf, cfg.unfreeze)
    before = _backbone_state(ctx)
    # A baseline nothing can lose to, so phase 2 keeps its own weights rather than phase 1's.
    result = run_phase2(ctx, dataclasses.replace(phase1, val_loss=float("inf"), val_accuracy=0.0))
    assert result.epochs == 1
    after = _backbone_state(ctx)
    changed = {p for p in before if before[p].tobytes() != after[p].tobytes()}
    layers = ctx.clf.backbone.layers
    allowed = {
        w.path
        for layer in layers[start:]
        if not isinstance(layer, keras.layers.BatchNormalization)
        for w in layer.weights
    }
    batchnorm = {
        w.path for layer in layers if isinstance(layer, keras.layers.BatchNormalization) for w in layer.weights
    }
    assert changed, "phase 2 changed nothing"
    assert changed <= allowed, f"frozen weights changed: {sorted(changed - allowed)[:5]}"
    assert not changed & batchnorm
    assert any("moving_mean" in p for p in batchnorm)  # the check above really covered BN statistics


@pytest.mark.slow
def test_pretrained_backbone_transfers_and_phase2_keeps_it(pretrained_weights, demo_images, tmp_path_factory):
    """Real transfer learning: a frozen pretrained backbone + linear head separates the demo
    classes well, and phase 2 (BatchNorm frozen, low LR) does not undo it."""
    from app.data.demo import generate_demo_images
    from app.data.writer import write_tfrecords

    root = tmp_path_factory.mktemp("transfer")
    images = generate_demo_images(root / "images", per_class=40, seed=1)
    data = root / "records"
    write_tfrecords(images, data, val_fraction=0.25, test_fraction=0.0, workers=1)
    cfg = TrainConfig(
        data=str(data),
        out=str(root / "run"),
        weights=str(pretrained_weights),
        image_size=96,
        batch_size=16,
        epochs_head=12,
        feature_views="2",
        augment=False,
        epochs_finetune=2,
        lr_finetune=5e-5,
        early_stopping_patience=8,
    )
    ctx = setup(cfg)
    phase1 = run_phase1(ctx)
    assert phase1.val_accuracy >= 0.8, phase1
    phase2 = run_phase2(ctx, phase1)
    assert phase2.val_loss <= phase1.val_loss
    assert phase2.val_accuracy >= phase1.val_accuracy - 0.05, (phase1, phase2)
    # Cached-features mode is an optimisation, not a different method: a normal phase 1 on
    # images (same settings, augmentation off) lands in the same place.
    normal = run_phase1(setup(cfg.replace(feature_views="0", out=str(root / "normal"), epochs_finetune=0)))
    assert abs(normal.val_accuracy - phase1.val_accuracy) <= 0.1, (normal, phase1)
    assert abs(normal.val_loss - phase1.val_loss) <= 0.1, (normal, phase1)
    # With augmentation too: the head on cached features of K = 2 augmented views lands where
    # augmented training on images does.
    augmented = cfg.replace(augment=True, epochs_finetune=0)
    on_images = run_phase1(setup(augmented.replace(feature_views="0", out=str(root / "aug-images"))))
    on_views = run_phase1(setup(augmented.replace(feature_views="2", out=str(root / "aug-views"))))
    assert on_views.val_accuracy >= 0.8 and abs(on_views.val_accuracy - on_images.val_accuracy) <= 0.1, (
        on_images,
        on_views,
    )


@pytest.mark.slow  # both phases: the fast tier stays under 3 minutes
def test_a_phase2_that_never_wins_ends_with_every_weight_it_started_from(tiny_config: TrainConfig, monkeypatch):
    """Phase 1 on cached features checkpoints only the head; falling back must restore the
    backbone's top too, which phase 2 trained."""
    from app.training import phase as phase_module

    ctx = setup(tiny_config.replace(unfreeze="blocks:1", lr_finetune=1e-2, warmup_fraction=0.0, epochs_finetune=2))
    frozen = FrozenBackbone(ctx)
    phase1 = run_phase1(ctx, frozen)
    assert frozen.decision.phase1_cached
    start = {v.path: v.numpy().copy() for v in ctx.clf.model.weights}
    trained, train_epoch = [], phase_module._train_epoch

    def recording_train_epoch(steps, iterator, spec):
        out = train_epoch(steps, iterator, spec)
        trained.append({v.path: v.numpy().copy() for v in ctx.clf.backbone.trainable_weights})
        return out

    monkeypatch.setattr(phase_module, "_train_epoch", recording_train_epoch)
    unbeatable = dataclasses.replace(phase1, val_loss=-float("inf"))
    result = run_phase2(ctx, unbeatable)
    assert result.best_epoch == 0 and result.epochs == 2
    moved = [p for p in trained[-1] if not np.array_equal(trained[-1][p], start[p])]
    assert moved, "phase 2 trained no backbone weight: the check below would prove nothing"
    final = {v.path: v.numpy() for v in ctx.clf.model.weights}
    for path, value in start.items():
        np.testing.assert_array_equal(final[path], value, err_msg=path)


class _Killed(Exception):
    """Stands for the process dying mid-epoch."""


@pytest.mark.slow  # a run and its resume: the fast tier stays under 3 minutes
def test_a_phase2_that_never_wins_falls_back_after_a_resume_too(tiny_config: TrainConfig, monkeypatch):
    """Its fallback is held in memory, not written: a resumed process holds the same weights
    again (phase 1's kept ones) before phase 2's checkpoint moves them to its last epoch's."""
    from app.training import phase as phase_module

    config = tiny_config.replace(unfreeze="blocks:1", lr_finetune=1e-2, warmup_fraction=0.0, epochs_finetune=2)
    ctx = setup(config)
    phase1 = run_phase1(ctx)
    start = {v.path: v.numpy().copy() for v in ctx.clf.model.weights}
    epochs, train_epoch = [], phase_module._train_epoch

    def dying_in_epoch_2(steps, iterator, spec):
        epochs.append(spec.phase)
        if len(epochs) == 2:
            raise _Killed
        return train_epoch(steps, iterator, spec)

    monkeypatch.setattr(phase_module, "_train_epoch", dying_in_epoch_2)
    with pytest.raises(_Killed):
        run_phase2(ctx, dataclasses.replace(phase1, val_loss=-float("inf")))
    monkeypatch.setattr(phase_module, "_train_epoch", train_epoch)

    resumed = setup(config)  # the same command again
    phase1_again = run_phase1(resumed)  # finished: it puts back its kept weights
    moved = [v.path for v in resumed.clf.model.weights if not np.array_equal(v.numpy(), start[v.path])]
    assert moved == [], "what phase 2 falls back to: the same weights in a new process"
    result = run_phase2(resumed, dataclasses.replace(phase1_again, val_loss=-float("inf")))
    assert result.best_epoch == 0 and result.epochs == 2
    for v in resumed.clf.model.weights:
        np.testing.assert_array_equal(v.numpy(), start[v.path], err_msg=v.path)
    assert not list(resumed.run.checkpoints.glob("phase2_best_epoch*")), "no fallback file is needed"


@pytest.mark.slow  # several epochs: the fast tier stays under 3 minutes
def test_early_stopping_says_what_no_epoch_beat(tiny_config: TrainConfig, caplog):
    """Phase 2 stopped early names the figure it went by and the result no epoch beat (phase 1's
    here), then that it keeps phase 1's weights."""
    ctx = setup(tiny_config.replace(epochs_finetune=3, early_stopping_patience=1))
    phase1 = run_phase1(ctx)
    out_of_reach = dataclasses.replace(phase1, val_loss=-float("inf"), val_accuracy=0.25)
    with caplog.at_level("INFO", logger="app.training.phase"):
        assert run_phase2(ctx, out_of_reach).epochs == 1
    messages = [r.getMessage() for r in caplog.records]
    (stop,) = [m for m in messages if m.startswith("early stopping")]
    assert stop == (
        "early stopping: 1 epoch without beating the best on val_loss (phase 1's weights: val_loss -inf,"
        " val_accuracy 0.2500)"
    )
    assert "phase 2 did not beat phase 1 on val_loss; keeping phase 1's weights" in messages


@pytest.mark.parametrize("kept", [1, pytest.param(2, marks=pytest.mark.slow)])  # 2: the fast tier stays under 3 minutes
def test_a_phase_ends_holding_its_kept_epochs_weights_without_reading_them_back(
    tiny_config: TrainConfig, monkeypatch, kept: int
):
    from app.training import phase as phase_module

    ctx = setup(
        tiny_config.replace(
            unfreeze="blocks:1", lr_finetune=1e-2, warmup_fraction=0.0, epochs_finetune=2, early_stopping_patience=5
        )
    )
    phase1 = run_phase1(ctx)
    trained, train_epoch, loads = [], phase_module._train_epoch, []
    load_weights = keras.Model.load_weights

    def recording_train_epoch(steps, iterator, spec):
        out = train_epoch(steps, iterator, spec)
        trained.append({v.path: v.numpy().copy() for v in ctx.clf.model.weights})
        return out

    monkeypatch.setattr(phase_module, "_train_epoch", recording_train_epoch)
    monkeypatch.setattr(phase_module.PhaseState, "improves", lambda self, val: self.epochs_done < kept)
    monkeypatch.setattr(
        keras.Model, "load_weights", lambda self, path, *a, **k: (loads.append(path), load_weights(self, path, *a, **k))
    )
    result = run_phase2(ctx, phase1)
    assert (result.epochs, result.best_epoch) == (2, kept)
    assert loads == []  # the kept epoch's weights come back from memory (KeptWeights), not from its file
    moved = [p for p in trained[1] if not np.array_equal(trained[1][p], trained[0][p])]
    assert moved, "epoch 2 moved no weight: the check below would prove nothing"
    final = {v.path: v.numpy() for v in ctx.clf.model.weights}
    for path, value in trained[kept - 1].items():
        np.testing.assert_array_equal(final[path], value, err_msg=path)


def test_kept_weights_are_put_back_from_memory_and_after_a_resume_from_their_file(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from app.run_dir import RunDir
    from app.training.phase import PhaseFiles
    from app.training.phase_weights import KeptWeights

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    RunDir(tmp_path).checkpoints.mkdir()  # as the phase's checkpoint manager leaves it
    phase = SimpleNamespace(
        model=model, spec=SimpleNamespace(phase=2), files=PhaseFiles(read=RunDir(tmp_path), write=RunDir(tmp_path))
    )
    loads, load_weights = [], keras.Model.load_weights
    monkeypatch.setattr(
        keras.Model, "load_weights", lambda self, path, *a, **k: (loads.append(path), load_weights(self, path, *a, **k))
    )

    def scramble() -> None:
        model.set_weights([w + 1.0 for w in model.get_weights()])

    kept = KeptWeights(phase)
    kept.save(3)
    saved = model.get_weights()
    assert RunDir(tmp_path).best_weights(2, 3).is_file()
    scramble()
    kept.restore(3)
    assert loads == []
    for got, want in zip(model.get_weights(), saved):
        np.testing.assert_array_equal(got, want)
    scramble()
    KeptWeights(phase).restore(3)  # a resumed process holds nothing in memory
    assert loads == [str(RunDir(tmp_path).best_weights(2, 3))]
    for got, want in zip(model.get_weights(), saved):
        np.testing.assert_array_equal(got, want)


def _sorted_outputs(logits: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """By label, then logits: the saved pass and a fresh one may read the split in another order."""
    order = np.lexsort((*logits.T[::-1], labels))
    return logits[order], labels[order]


@pytest.mark.slow  # both phases: the fast tier stays under 3 minutes
@pytest.mark.parametrize(
    ("phase1_val_loss", "kept_phase"),
    [(-float("inf"), 1), (float("inf"), 2)],
    ids=["no loss beats phase 1", "any loss beats phase 1"],
)
def test_phase2_counts_by_its_loss_alone_and_the_kept_logits_are_saved(
    tiny_config: TrainConfig, phase1_val_loss: float, kept_phase: int
):
    """No accuracy of phase 2 reaches phase 1's (1.01) here; whether it counts is decided by the
    loss alone. Either way the kept epoch's validation logits, which calibration fits T on, are
    saved and equal one more pass with the kept weights."""
    from app.training.calibration import saved_validation_outputs, validation_logits

    ctx = setup(tiny_config)
    phase1 = run_phase1(ctx)
    baseline = dataclasses.replace(phase1, val_loss=phase1_val_loss, val_accuracy=1.01)
    result = run_phase2(ctx, baseline)
    assert result.epochs == 1
    assert result.best_epoch == (1 if kept_phase == 2 else 0)  # 0: phase 1's weights stay the result
    kept_epoch = result.best_epoch if kept_phase == 2 else phase1.best_epoch
    assert ctx.run.best_val_outputs(kept_phase, kept_epoch).exists()
    saved = saved_validation_outputs(ctx, {1: phase1, 2: result})
    fresh = validation_logits(ctx)  # no phases given: one more pass with the weights the run kept
    assert saved is not None and saved[0].shape == fresh[0].shape == (
        ctx.info.num_examples("val"),
        len(ctx.info.classes),
    )
    (saved_logits, saved_labels), (fresh_logits, fresh_labels) = _sorted_outputs(*saved), _sorted_outputs(*fresh)
    np.testing.assert_array_equal(saved_labels, fresh_labels)
    np.testing.assert_allclose(saved_logits, fresh_logits, rtol=1e-4, atol=1e-4)
