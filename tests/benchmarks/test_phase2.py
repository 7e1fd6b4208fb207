"""The phase-2 benchmark: its variant syntax, its summary arithmetic, its checks, one real run."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.errors import UserError
from benchmarks.phase2 import format_summary, parse_variant, run_phase2_benchmark, summarise


def test_a_variant_is_a_name_with_optional_config_keys():
    assert parse_variant("defaults") == ("defaults", {})
    assert parse_variant("ema:ema_decay=0.99,select-by=val_accuracy") == (
        "ema",
        {"ema_decay": "0.99", "select_by": "val_accuracy"},
    )
    with pytest.raises(ValueError, match="expected key=value"):
        parse_variant("bad:ema_decay")


def _row(variant: str, seed: int, p1: float, p2: float) -> dict:
    return {
        "variant": variant,
        "per_class": 10,
        "seed": seed,
        "p1_accuracy": p1,
        "p2_accuracy": p2,
        "p1_loss": 0.5,
        "p2_loss": 0.4,
        "p2_own_best_accuracy": p2,
        "p2_epochs": 5,
        "p2_seconds": 10.0 + seed,
        "val_images": 200,
        "p1_test_accuracy": p1 - 0.1,
        "p2_test_accuracy": p2 - 0.1,
        "test_images": 50,
    }


def test_summary_gives_mean_spread_and_the_gain_in_validation_images():
    rows = [_row("a", 0, 0.80, 0.85), _row("a", 1, 0.90, 0.90), _row("b", 0, 0.80, 0.79)]
    a, b = summarise(rows)
    assert a["phase1_accuracy"] == "0.850 ± 0.071" and a["phase2_accuracy"] == "0.875 ± 0.035"
    assert a["gain_images"] == 5.0  # (+10 images + 0) / 2 seeds
    assert b["gain_images"] == -2.0 and b["seeds"] == 1 and a["phase2_seconds"] == 10.5
    assert a["phase1_test_accuracy"] == "0.750 ± 0.071" and b["phase2_test_accuracy"] == "0.690"
    assert "0.850 ± 0.071" in format_summary([a, b])


def test_bad_variants_and_weights_fail_before_any_training(tmp_path: Path):
    for split in ("train", "val"):
        (tmp_path / split / "a").mkdir(parents=True)
    with pytest.raises(UserError, match="unknown config key 'nonsense'"):
        run_phase2_benchmark(tmp_path, weights="none", variants=[("x", {"nonsense": "1"})], per_class=(2,), seeds=(0,))
    with pytest.raises(UserError, match="'ema_decay' must be in \\[0, 1\\)"):
        run_phase2_benchmark(tmp_path, weights="none", variants=[("x", {"ema_decay": "2"})], per_class=(2,), seeds=(0,))
    with pytest.raises(UserError, match="--weights: no such file"):
        run_phase2_benchmark(tmp_path, weights="missing.h5", variants=[("x", {})], per_class=(2,), seeds=(0,))


@pytest.mark.slow
def test_every_variant_trains_on_the_same_subset(tmp_path: Path, monkeypatch):
    from app.data.demo import generate_demo_images

    monkeypatch.delenv("PHOTOCLF_WEIGHTS", raising=False)
    for split, seed in (("train", 0), ("val", 1)):
        generate_demo_images(tmp_path / "photos" / split, per_class=6, seed=seed)
    lines: list[str] = []
    rows = run_phase2_benchmark(
        tmp_path / "photos",
        weights="none",
        per_class=(4,),
        seeds=(0,),
        log=lines.append,
        # phase 2 on the views: exactly epochs_finetune epochs (on images, phase 1's low accuracy
        # would plan twice the epochs)
        variants=[("plain", {"phase2_mode": "views"}), ("ema", {"ema_decay": "0.9", "phase2_mode": "views"})],
        image_size=64,
        test_per_class=2,
        epochs_head=1,
        epochs_finetune=1,
    )
    assert [r["variant"] for r in rows] == ["plain", "ema"] and len(lines) == 2
    assert all(
        0 < r["test_images"] <= 8 and 0 <= r["p2_test_accuracy"] <= 1 for r in rows
    )  # 2 left-out photos per class
    assert all(r["val_images"] == rows[0]["val_images"] > 0 for r in rows)  # the whole val split, every variant
    assert all(r["p2_epochs"] == 1 and 0 <= r["p2_accuracy"] <= 1 for r in rows)
