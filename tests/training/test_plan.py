"""Phase 2's plan: the mode, the epochs and the patience, from the configuration and whether the
run starts from an earlier one; never from how well phase 1 did (no cliff at any threshold)."""

from __future__ import annotations

import pytest

from app.config import TrainConfig
from app.training.plan import plan_phase2

CFG = TrainConfig(epochs_finetune=10, early_stopping_patience=3)


def test_a_cold_start_trains_phase2_on_images_for_its_whole_schedule():
    plan = plan_phase2(CFG, views=None)
    assert (plan.mode, plan.epochs, plan.patience) == ("images", 10, 10)  # no early stop at the peak rate
    assert plan.describe() == (
        "phase 2 on images, freshly augmented each epoch: 10 epochs, its whole schedule, keeping the last"
        " epoch that beats phase 1; phase2_mode = auto, a cold start"
    )


def test_a_run_started_from_an_earlier_one_gets_a_short_phase2_on_the_views():
    """--init-from: the earlier run's weights already had their phase 2."""
    warm = plan_phase2(CFG, None, warm_start=True)
    assert (warm.mode, warm.epochs, warm.patience) == ("views", 10, 3)
    assert warm.reason == "phase2_mode = auto, starting from an earlier run's trained weights (init_from)"
    assert "up to 10 epochs while validation improves (patience 3)" in warm.describe()
    no_views = plan_phase2(CFG, "several workers", warm_start=True)
    assert (no_views.mode, no_views.epochs, no_views.patience) == ("images", 10, 10)
    assert no_views.reason == "phase2_mode = auto; no cached views: several workers"
    assert (warm.keep_last, no_views.keep_last) == (False, True)  # early stopped: its best; a whole schedule: its end


def test_a_forced_mode_runs_as_configured():
    views = plan_phase2(CFG.replace(phase2_mode="views"), None)
    images = plan_phase2(CFG.replace(phase2_mode="images"), None, warm_start=True)
    assert (views.mode, views.epochs, views.patience, views.reason) == ("views", 10, 3, "phase2_mode = views")
    assert (images.mode, images.epochs, images.patience, images.reason) == ("images", 10, 10, "phase2_mode = images")
    forced = plan_phase2(CFG.replace(phase2_mode="views"), "several workers")
    assert (forced.mode, forced.reason) == ("images", "phase2_mode = views; no cached views: several workers")


def test_the_plan_is_recorded_as_plain_values():
    assert plan_phase2(CFG, None).to_dict() == {
        "mode": "images",
        "epochs": 10,
        "patience": 10,
        "keep": "last",
        "reason": "phase2_mode = auto, a cold start",
    }


def test_retired_plan_keys_are_unknown_now():
    from app.config import load_config
    from app.errors import UserError

    for key in ("views_above", "finetune_time_cap"):
        with pytest.raises(UserError, match=f"unknown config key '{key}'"):
            load_config(None, {key: "0.9"})


@pytest.mark.slow  # two whole runs: the fast tier stays under 3 minutes
def test_phase1_landing_either_side_of_a_threshold_gets_the_same_phase2(tiny_config: TrainConfig, monkeypatch):
    """The cliff this plan removes: one more val photo right in phase 1 switched phase 2 to a
    shorter, cheaper path. Here phase 1's kept val accuracy is forced just under and just over
    the old line (0.95), and both runs plan and run the same phase 2."""
    import dataclasses

    from app.training import train as train_module

    real, seen = train_module.run_phase1, []

    def run(accuracy: float) -> dict:
        def forced_phase1(*args, **kwargs):
            return dataclasses.replace(real(*args, **kwargs), val_accuracy=accuracy)

        monkeypatch.setattr(train_module, "run_phase1", forced_phase1)
        out = f"{tiny_config.out}-{accuracy}"
        metrics = train_module.train(tiny_config.replace(out=out, phase2_mode="auto", epochs_finetune=2))
        seen.append(metrics["phase1"]["val_accuracy"])
        return metrics

    under, over = run(0.95 - 1 / 272), run(0.95)
    assert seen == [pytest.approx(0.95 - 1 / 272), 0.95]  # the forced accuracies reached the run
    assert under["phase2_plan"] == over["phase2_plan"] == {
        "mode": "images", "epochs": 2, "patience": 2, "keep": "last", "reason": "phase2_mode = auto, a cold start"
    }  # fmt: skip
    assert under["phase2"]["epochs"] == over["phase2"]["epochs"] == 2
