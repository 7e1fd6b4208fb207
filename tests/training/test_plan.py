"""Phase 2's plan: from what phase 1 left and whether its views can carry phase 2, the mode,
the epochs, the patience and the time cap; and a phase that stops at its cap."""

from __future__ import annotations

import math

import pytest

from app.config import TrainConfig
from app.training.plan import IMAGES_EPOCHS, plan_phase2

CFG = TrainConfig(epochs_finetune=5, early_stopping_patience=3, finetune_time_cap=2.0)


def test_near_saturation_phase2_trains_on_the_views_as_configured():
    plan = plan_phase2(CFG, phase1_accuracy=0.985, phase1_seconds=20.0, views=None)
    assert (plan.mode, plan.epochs, plan.patience, plan.max_seconds) == ("views", 5, 3, math.inf)
    assert "0.985 (>= 0.95, views_above)" in plan.reason and "phase 1's cached views" in plan.describe()


def test_far_from_saturation_phase2_trains_on_images_longer_within_a_time_cap():
    plan = plan_phase2(CFG, phase1_accuracy=0.80, phase1_seconds=20.0, views=None)
    assert plan.mode == "images" and plan.epochs == 5 * IMAGES_EPOCHS
    assert plan.patience == plan.epochs  # the whole schedule: no early stop while the rate is at its peak
    assert plan.max_seconds == 40.0  # 2 x phase 1's 20 s
    assert "0.800 (< 0.95, views_above)" in plan.reason and "time cap 2 x phase 1's 20 s" in plan.reason
    assert plan.describe().startswith("phase 2 on images, freshly augmented each epoch: 10 epochs, its whole schedule,")
    assert "stopping by 40 s" in plan.describe()


def test_the_threshold_itself_counts_as_saturated():
    assert plan_phase2(CFG, CFG.views_above, 20.0, None).mode == "views"
    assert plan_phase2(CFG, CFG.views_above - 1 / 272, 20.0, None).mode == "images"  # one val photo of 272 fewer
    assert plan_phase2(CFG.replace(views_above=0.90), 0.94, 20.0, None).mode == "views"  # the threshold is a key


def test_without_cached_views_a_saturated_phase1_gets_a_short_phase2_on_images():
    plan = plan_phase2(CFG, 0.99, 20.0, views="phase 1 trained on images")
    assert (plan.mode, plan.epochs, plan.max_seconds) == ("images", 5, math.inf)
    assert plan.reason.endswith("a short phase 2 on images (no cached views: phase 1 trained on images)")
    far = plan_phase2(CFG, 0.5, 20.0, views="phase 1 trained on images")
    assert (far.mode, far.epochs, far.max_seconds) == ("images", 10, 40.0)
    forced = plan_phase2(CFG.replace(phase2_mode="views"), 0.5, 20.0, views="several workers")
    assert (forced.mode, forced.reason) == ("images", "phase2_mode = views; no cached views: several workers")


def test_a_run_started_from_an_earlier_one_gets_a_short_phase2_on_the_views():
    """--init-from: the earlier run's weights already had their phase 2; far from saturation, a
    warm start gets the configured short phase 2 on the views, not a cold start's long one."""
    warm = plan_phase2(CFG, 0.80, 20.0, None, warm_start=True)
    assert (warm.mode, warm.epochs, warm.patience, warm.max_seconds) == ("views", 5, 3, math.inf)
    assert "0.800 (< 0.95, views_above), starting from an earlier run's trained weights (init_from)" in warm.reason
    assert plan_phase2(CFG, 0.99, 20.0, None, warm_start=True).reason.endswith("a short phase 2 on the views")
    no_views = plan_phase2(CFG, 0.80, 20.0, "several workers", warm_start=True)
    assert (no_views.mode, no_views.epochs) == ("images", 5 * IMAGES_EPOCHS)  # no views to train on: as a cold start


def test_without_phase1_phase2_counts_as_far_from_saturation():
    plan = plan_phase2(CFG, None, 0.0, None)
    assert plan.mode == "images" and plan.max_seconds == math.inf and "phase 1 did not run" in plan.reason


def test_a_forced_mode_runs_as_configured():
    views = plan_phase2(CFG.replace(phase2_mode="views"), 0.5, 20.0, None)
    images = plan_phase2(CFG.replace(phase2_mode="images"), 0.99, 20.0, None)
    assert (views.mode, views.epochs, views.patience, views.max_seconds) == ("views", 5, 3, math.inf)
    assert (images.mode, images.epochs, images.patience, images.max_seconds) == ("images", 5, 3, math.inf)
    assert images.reason == "phase2_mode = images"


@pytest.mark.parametrize("cap, seconds, expected", [(0.0, 20.0, math.inf), (2.0, 0.0, math.inf), (1.5, 10.0, 15.0)])
def test_the_cap_is_a_multiple_of_phase1s_time_or_none(cap: float, seconds: float, expected: float):
    plan = plan_phase2(CFG.replace(finetune_time_cap=cap), 0.5, seconds, None)
    assert plan.max_seconds == expected


def test_features_read_from_the_store_count_in_phase1s_cost_at_what_they_took_to_compute():
    """A run that finds its features stored gets the phase 2 of the run that computed them."""
    cold = plan_phase2(CFG, 0.5, 30.0, None)
    warm = plan_phase2(CFG, 0.5, 4.0, None, stored_seconds=26.0)
    assert warm.max_seconds == cold.max_seconds == 60.0 and warm.epochs == cold.epochs
    assert "time cap 2 x phase 1's 30 s (26 s of it the stored features' computing)" in warm.reason


def test_by_default_phase2s_epochs_are_a_count_that_neither_speed_nor_the_store_changes():
    """No time cap unless asked for: the cosine schedule anneals over the epochs planned, and a
    slow machine, a fast one and a run reading stored features all plan the same phase 2."""
    default = TrainConfig()
    assert default.finetune_time_cap == 0
    plans = [plan_phase2(default, 0.9, 12.0, None), plan_phase2(default, 0.9, 40.0, None),
             plan_phase2(default, 0.9, 1.0, None, stored_seconds=11.0)]  # fmt: skip
    assert {(p.mode, p.epochs, p.patience, p.max_seconds) for p in plans} == {
        ("images", default.epochs_finetune * IMAGES_EPOCHS, default.epochs_finetune * IMAGES_EPOCHS, math.inf)
    }
    assert "time cap" not in plans[0].reason and "stopping by" not in plans[0].describe()


def test_the_plan_is_recorded_as_plain_values():
    assert plan_phase2(CFG, 0.5, 20.0, None).to_dict() == {
        "mode": "images",
        "epochs": 10,
        "patience": 10,
        "max_seconds": 40.0,
        "reason": "phase2_mode = auto: phase 1 reached val accuracy 0.500 (< 0.95, views_above), far from"
        " saturation, where fresh augmentation each epoch pays; time cap 2 x phase 1's 20 s (finetune_time_cap)",
    }


def test_a_phase_stops_before_an_epoch_that_would_pass_its_time_cap(tiny_config: TrainConfig, monkeypatch):
    """Epochs of 10 s each (a fake clock) and a 25 s cap: two epochs run; a third would end at 30 s."""
    import dataclasses
    import itertools

    from app.training import phase as phase_module
    from app.training.context import setup
    from app.training.train import build_phase

    now, ticks = [0.0], itertools.count()
    monkeypatch.setattr(phase_module.time, "perf_counter", lambda: now[0] + next(ticks) * 1e-6)
    real_epoch = phase_module._run_epoch

    def ten_second_epoch(*args):
        now[0] += 10.0
        real_epoch(*args)

    monkeypatch.setattr(phase_module, "_run_epoch", ten_second_epoch)
    phase = build_phase(setup(tiny_config.replace(epochs_head=6, early_stopping_patience=10)), 1)
    capped = dataclasses.replace(phase, spec=dataclasses.replace(phase.spec, max_seconds=25.0))
    result = phase_module.run_phase(capped)
    assert result.epochs == 2 and result.stopped_early and result.seconds == pytest.approx(20.0, abs=0.01)


def test_a_run_far_from_saturation_trains_phase2_on_images_and_records_why(tiny_config: TrainConfig, caplog):
    """The random tiny backbone is nowhere near saturation: `auto` picks images, logs the plan, and
    metrics.json records it."""
    import logging

    from app.training.train import train

    with caplog.at_level(logging.INFO, logger="app.training.train"):
        metrics = train(tiny_config.replace(phase2_mode="auto"))
    plan = metrics["phase2_plan"]
    assert plan["mode"] == "images" and plan["epochs"] == IMAGES_EPOCHS and plan["max_seconds"] is None
    accuracy = metrics["phase1"]["val_accuracy"]
    assert plan["reason"].startswith(f"phase2_mode = auto: phase 1 reached val accuracy {accuracy:.3f}")
    assert f"phase 2 on images, freshly augmented each epoch: {IMAGES_EPOCHS} epochs, its whole schedule" in caplog.text
    assert metrics["phase2"]["epochs"] == IMAGES_EPOCHS  # no early stop on the way
