"""Phase 2's fine-tuning tools: per-block learning rates, the weight average, the selection metric."""

from __future__ import annotations

import dataclasses

import keras
import numpy as np
import pytest

from app.config import TrainConfig
from app.models.backbones import get_backbone
from app.models.classifier import build_classifier, unfreeze_top
from app.models.pretrained import load_backbone
from app.training import phase as phase_module
from app.training.context import setup
from app.training.optimizer import FineTuneAdamW, averaged_weights, layer_rate_scales
from app.training.phase import PhaseSpec, _kept_mark, beats
from app.training.steps import CompiledSteps
from app.training.train import run_phase1, run_phase2

LR = 1e-3


def _mobilenet(rule: str):
    spec = get_backbone("mobilenet_v2")
    clf = build_classifier(spec, load_backbone(spec, 64, "none")[0], 2, 64, 0.0)
    unfreeze_top(clf, rule)
    return clf


def _block(path: str) -> str:
    layer = path.split("/")[-2]
    return layer.split("_")[0] + "_" + layer.split("_")[1] if layer.startswith("block_") else "top"


def test_layer_decay_trains_each_block_below_the_top_at_the_rate_above_times_decay():
    clf = _mobilenet("blocks:3")  # block_14, block_15, block_16 (+ Conv_1 above it)
    model = clf.logits_model
    opt = FineTuneAdamW(learning_rate=LR, weight_decay=0.0, rate_scales=layer_rate_scales(clf, "blocks:3", 0.5))
    opt.build(model.trainable_variables)
    before = {v.path: v.numpy().copy() for v in model.trainable_variables}
    # Adam's first step moves every weight by lr x its scale when the gradient is far above epsilon.
    opt.apply_gradients([(np.full(v.shape, 10.0, np.float32), v) for v in model.trainable_variables])
    expected = {"top": LR, "block_16": LR, "block_15": LR * 0.5, "block_14": LR * 0.25}
    seen = set()
    for v in model.trainable_variables:
        block = "top" if v.path.startswith("logits") else _block(v.path)
        moved = before[v.path] - v.numpy()
        np.testing.assert_allclose(moved, expected[block], rtol=1e-4, err_msg=v.path)
        seen.add(block)
    assert seen == set(expected)


def test_weight_decay_follows_each_variables_own_rate():
    clf = _mobilenet("blocks:2")
    model = clf.logits_model
    opt = FineTuneAdamW(learning_rate=LR, weight_decay=0.1, rate_scales=layer_rate_scales(clf, "blocks:2", 0.5))
    opt.exclude_from_weight_decay(var_names=["bias"])
    opt.build(model.trainable_variables)
    before = {v.path: v.numpy().copy() for v in model.trainable_variables}
    opt.apply_gradients([(np.zeros(v.shape, np.float32), v) for v in model.trainable_variables])  # Adam step 0
    for v in model.trainable_variables:
        scale = 0.5 if "block_15" in v.path else 1.0
        decay = 0.0 if "bias" in v.path else 0.1 * LR * scale
        np.testing.assert_allclose(v.numpy(), before[v.path] * (1 - decay), rtol=1e-6, err_msg=v.path)


def test_no_decay_means_one_rate_for_every_variable():
    assert layer_rate_scales(_mobilenet("blocks:3"), "blocks:3", 1.0) == {}


def test_weight_average_warms_up_and_is_swapped_in_only_inside_the_context():
    dense = keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")
    dense.build((None, 1))
    opt = FineTuneAdamW(learning_rate=0.1, weight_decay=0.0, ema_decay=0.5)
    opt.build(dense.trainable_variables)
    trained, average = [], None
    for step in range(4):
        opt.apply_gradients([(np.array([[1.0]], np.float32), dense.kernel)])
        w = float(dense.kernel.numpy()[0, 0])
        decay = 0.0 if step == 0 else min(0.5, (1 + step) / (10 + step))
        average = w if average is None else decay * average + (1 - decay) * w
        trained.append(w)
    assert average != pytest.approx(trained[-1])  # the check below can tell the two apart
    with averaged_weights(opt):
        assert float(dense.kernel.numpy()[0, 0]) == pytest.approx(average, rel=1e-5)
    assert float(dense.kernel.numpy()[0, 0]) == pytest.approx(trained[-1], rel=1e-6)


def test_selection_by_accuracy_prefers_accuracy_and_breaks_ties_by_loss():
    assert beats(0.40, 0.90, 0.30, 0.85, "val_accuracy")  # more accurate, though its loss is higher
    assert not beats(0.40, 0.90, 0.30, 0.85, "val_loss")
    assert beats(0.29, 0.85, 0.30, 0.85, "val_accuracy") and not beats(0.31, 0.85, 0.30, 0.85, "val_accuracy")
    assert not beats(0.10, 0.80, 0.30, 0.85, "val_accuracy")


def test_phase2_is_judged_on_its_loss_alone_whatever_phase_1s_accuracy():
    """No second bar on phase 1's val accuracy: a phase 1 that got one more val photo right by
    luck would otherwise throw away a phase 2 that beat it on loss (a cliff)."""
    assert beats(0.20, 0.84, 0.30, 0.85, "val_loss")  # a lower loss with one photo fewer right still counts
    for phase1_accuracy in (0.80, 0.84, 0.85, 0.90):  # where phase 1's accuracy landed changes nothing
        assert beats(0.20, 0.84, 0.30, phase1_accuracy, "val_loss")
        assert not beats(0.40, 0.90, 0.30, phase1_accuracy, "val_loss")  # still needs the lower loss


def _kept_by(tmp_path, val_losses: list[float], keep_last: bool, phase1_loss: float = 1.0):
    """Phase 2's state fed these validation losses, epoch by epoch, against phase 1's: which
    epoch it keeps (0: phase 1's weights) and whether it says it was still improving."""
    from types import SimpleNamespace

    from app.run_dir import RunDir
    from app.training.phase import PhaseFiles, PhaseResult, PhaseSpec, PhaseState
    from app.training.steps import Evaluation

    n = len(val_losses)
    baseline = PhaseResult(phase1_loss, 0.8, 3, 3, False, 1.0, 1.0, [[0, 0], [0, 0]])
    phase = SimpleNamespace(
        spec=PhaseSpec(
            phase=2, epochs=n, steps_per_epoch=1, steps_per_execution=1, patience=n, epoch_offset=3, keep_last=keep_last
        ),  # fmt: skip
        steps=SimpleNamespace(confusion_shape=(2, 2), optimizer=keras.optimizers.SGD(), global_batch_size=8),
        model=keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)]),
        files=PhaseFiles(read=RunDir(tmp_path), write=RunDir(tmp_path)),
        baseline=baseline,
    )
    state = PhaseState(phase)
    for epoch, loss in enumerate(val_losses, 1):
        val = Evaluation(loss, 0.8, 10, np.zeros((2, 2), np.int64))
        state.record(epoch, val, 1.0, state.improves(val))
    result = state.result()
    return result.best_epoch, result.still_improving


def test_a_whole_schedule_keeps_its_last_epoch_where_it_beats_phase_1(tmp_path):
    """Phase 2 on images runs its whole cosine schedule and keeps its end, not the epoch a small
    validation split happened to like best; where the end is worse than phase 1 on val_loss, the
    latest epoch that beat phase 1 is kept, and phase 1's weights where none did."""
    dip = [0.9, 0.7, 0.8, 0.75]  # epoch 2 is the lowest; the last still beats phase 1 (1.0)
    assert _kept_by(tmp_path / "a", dip, keep_last=True) == (4, False)
    assert _kept_by(tmp_path / "b", dip, keep_last=False) == (2, False)  # early-stopped phases keep the best
    assert _kept_by(tmp_path / "c", [0.9, 0.8, 1.1, 1.2], keep_last=True) == (2, False)
    assert _kept_by(tmp_path / "d", [1.2, 1.1, 1.05], keep_last=True) == (0, True)  # still falling, none beat phase 1
    assert _kept_by(tmp_path / "e", [0.9, 0.8, 0.7], keep_last=True) == (3, True)
    spec = PhaseSpec(phase=2, epochs=3, steps_per_epoch=1, steps_per_execution=1, patience=3, epoch_offset=0)
    assert (_kept_mark(spec), _kept_mark(dataclasses.replace(spec, keep_last=True))) == ("  *best", "  *kept")


@pytest.mark.slow  # a real phase 2 (8 s); the swap itself is checked above in the fast tier
def test_phase2_validates_and_keeps_the_averaged_weights(tiny_config: TrainConfig, monkeypatch):
    cfg = tiny_config.replace(
        unfreeze="blocks:1",
        lr_finetune=1e-2,
        warmup_fraction=0.0,
        ema_decay=0.9,
        epochs_finetune=2,
        max_steps_per_epoch=1,
    )
    ctx = setup(cfg)
    phase1 = run_phase1(ctx)
    snapshots = {"trained": [], "validated": []}
    train_epoch, evaluate = phase_module._train_epoch, CompiledSteps.evaluate

    def snapshot(model) -> dict[str, np.ndarray]:
        return {v.path: v.numpy().copy() for v in model.trainable_variables}

    def recording_train_epoch(steps, iterator, spec):
        out = train_epoch(steps, iterator, spec)
        snapshots["trained"].append(snapshot(steps.model))
        return out

    def recording_evaluate(self, dataset):  # run_phase2 evaluates nothing but its own validation
        snapshots["validated"].append(snapshot(self.model))
        return evaluate(self, dataset)

    monkeypatch.setattr(phase_module, "_train_epoch", recording_train_epoch)
    monkeypatch.setattr(CompiledSteps, "evaluate", recording_evaluate)
    result = run_phase2(ctx, dataclasses.replace(phase1, val_loss=float("inf"), val_accuracy=0.0))
    (w1, w2), (v1, v2) = snapshots["trained"], snapshots["validated"]
    decay = min(0.9, 2 / 11)  # step 1 copies the weights; step 2 is warmed up
    path = max(w2, key=lambda p: np.abs(w2[p] - w1[p]).max())  # the weight step 2 moved most
    np.testing.assert_allclose(v1[path], w1[path], rtol=1e-6)
    np.testing.assert_allclose(v2[path], decay * w1[path] + (1 - decay) * w2[path], rtol=1e-4, atol=1e-7)
    assert not np.allclose(v2[path], w2[path])
    kept = snapshot(ctx.clf.logits_model)
    np.testing.assert_array_equal(kept[path], (v1, v2)[result.best_epoch - 1][path])
