"""The learning-rate finder: the sweep's rates, its suggestion rule, and that it leaves the model alone."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from app.training.lr_find_job import find_lr
from app.training.lr_finder import Sweep, read_suggestions, report_dir, smooth, suggest


def test_smoothing_is_bias_corrected_and_the_rule_is_halfway_down_the_longest_valley():
    assert smooth([2.0, 2.0, 2.0]) == pytest.approx([2.0, 2.0, 2.0])  # no pull towards 0 at the start
    rates = list(np.geomspace(1e-5, 1.0, 13))
    # noise at the start, then the valley from step 2 (4.0) down to step 9 (0.8), then divergence
    curve = [3.0, 3.1, 4.0, 3.5, 3.0, 2.5, 2.0, 1.5, 1.0, 0.8, 0.9, 2.0, 9.0]
    # longest falling run: steps 0 or 1 could start it, but 2..9 is the longest (8 steps, via 4.0)
    assert suggest(rates, curve) == pytest.approx(rates[2 + 2 + 1])  # start + a third + a sixth of 7


def test_a_sweep_whose_loss_only_rose_says_its_suggestion_is_weak():
    rates = list(np.geomspace(1e-7, 1e-2, 40))
    rising = [1.0 + 0.01 * i + 0.02 * (i % 3) for i in range(40)]  # a little noise, no fall anywhere
    flat = Sweep(2, rates, rising, smooth(rising), suggest(rates, smooth(rising)))
    assert "WEAK: the loss was lowest at the sweep's start" in flat.summary()
    valley = [3.0 - 0.07 * i for i in range(30)] + [0.9 + 0.5 * i for i in range(10)]
    found = Sweep(1, rates, valley, smooth(valley), suggest(rates, smooth(valley)))
    assert "WEAK" not in found.summary() and found.summary().startswith("phase 1: suggested learning rate")
    # a sweep stops at its first loss that is not finite: that NaN was taken for the minimum,
    # which named the last rate and hid the WEAK warning
    diverged = rising[:20] + [float("nan")]
    ended = Sweep(2, rates[:21], diverged, smooth(diverged), suggest(rates[:21], smooth(diverged)))
    assert f"minimum at {rates[0]:.2g}," in ended.summary() and "WEAK" in ended.summary()


def test_a_sweep_leaves_the_weights_as_it_found_them(tiny_config):
    from app.training.context import setup
    from app.training.lr_finder import head_sweep

    ctx = setup(tiny_config, overwrite=True)
    before = [w.copy() for w in ctx.clf.model.get_weights()]
    sweep = head_sweep(ctx, steps=12, lr_min=1e-3, lr_max=100.0)
    assert max(sweep.losses) > min(sweep.losses)  # it did train, at rates up to 100
    for old, new in zip(before, ctx.clf.model.get_weights()):
        np.testing.assert_array_equal(old, new)


@pytest.mark.slow  # trains phase 1 between two sweeps
def test_a_sweep_of_both_phases_writes_its_plot_beside_the_run_dir(tiny_config, tmp_path: Path):
    cfg = tiny_config.replace(out=str(tmp_path / "runs" / "shapes"), max_steps_per_epoch=2, epochs_head=1)
    sweeps = find_lr(cfg, steps=12, lr_min=1e-5, lr_max=10.0)
    assert [s.phase for s in sweeps] == [1, 2]
    for s in sweeps:
        rates = np.array(s.learning_rates)
        assert rates[0] == pytest.approx(1e-5) and np.allclose(rates[1:] / rates[:-1], 10 ** (6 / 11))
        assert len(s.losses) == len(rates) <= 12 and all(np.isfinite(s.losses[:3]))
        assert s.suggestion == pytest.approx(suggest(s.learning_rates, s.smoothed)) and s.suggestion in s.learning_rates
    folder = report_dir(cfg.out)
    assert folder == tmp_path / "runs" / "shapes-lr-find"
    assert (folder / "lr_find.png").stat().st_size > 10_000
    saved = json.loads((folder / "lr_find.json").read_text())
    assert saved["phase1"]["suggestion"] == sweeps[0].suggestion and saved["phase2"]["rule"] == sweeps[1].rule
    assert not Path(cfg.out).exists()  # nothing written into the run dir the user will train into


@pytest.mark.slow  # a whole run with two sweeps
def test_auto_rates_are_swept_in_the_run_used_and_recorded(tiny_config):
    from app.config import load_config
    from app.training.train import train

    cfg = load_config(
        None, {**{k: v for k, v in tiny_config.to_dict().items()}, "lr_head": "auto", "lr_finetune": "AUTO"}
    )
    assert (cfg.lr_head, cfg.lr_finetune) == ("auto", "auto")
    metrics = train(cfg)
    found = metrics["lr_find"]
    assert found["used"] == {"lr_head": found["phase1"], "lr_finetune": found["phase2"]}
    assert found["phase1"] > 0 and found["phase2"] > 0 and found["rule"].startswith("fastai's valley")
    run = Path(cfg.out)
    assert (run / "lr_find.png").exists() and json.loads((run / "config.json").read_text())["lr_head"] == "auto"
    assert read_suggestions(run) == {"phase1": found["phase1"], "phase2": found["phase2"]}


def test_only_positive_numbers_or_auto_are_learning_rates():
    from app.config import load_config
    from app.errors import UserError

    with pytest.raises(UserError, match="^--set: 'lr_head' must be > 0 or auto, got 0.0$"):
        load_config(None, {"lr_head": "0"})
    with pytest.raises(UserError, match="'lr_finetune' must be float, got 'fast'"):
        load_config(None, {"lr_finetune": "fast"})
