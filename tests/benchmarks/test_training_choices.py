"""The training-choices benchmark: the command it runs per variant, what it reads back, and its
table's arithmetic (means over seeds, median times as a ratio to the first variant)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from app.errors import UserError
from benchmarks.training_choices import Run, command, run_benchmark, summary_table


def test_each_run_is_the_users_command_with_the_seed_and_the_variants_keys():
    cmd = command(Path("data"), Path("out"), 2, "w.h5", {"feature_views": "4", "phase2_mode": "images"})
    assert cmd[0] == sys.executable and cmd[1].endswith("scripts/fine_tune.py")
    assert cmd[2:] == [
        "--data",
        "data",
        "--out",
        "out",
        "--weights",
        "w.h5",
        "--overwrite",
        "--set=seed=2",
        "--set=feature_store=run",  # timed cold: its own features, none from the run before
        "--set=feature_views=4",
        "--set=phase2_mode=images",
    ]
    shared = command(Path("data"), Path("out"), 2, "w.h5", {"feature_store": "store"})
    assert shared[-1] == "--set=feature_store=store"  # a variant may share one (benchmarks.init_from)


def _run(variant: str, seed: int, seconds: float, test: float | None, mode: str = "views") -> Run:
    metrics = {
        "phase1": {"val_accuracy": 0.9},
        "phase2": {"val_accuracy": 0.92, "epochs": 5, "best_epoch": seed},
        "phase2_plan": {"mode": mode},
        "test": {"accuracy": test} if test is not None else None,
    }
    return Run("/d/flowers", variant, seed, seconds, 2000.0 + seed, metrics)


def test_the_table_averages_seeds_and_compares_median_times_with_the_first_variant():
    runs = [
        _run("defaults", 0, 40.0, 0.93),
        _run("k4", 0, 80.0, 0.95, "images"),
        _run("defaults", 1, 50.0, 0.95),
        _run("k4", 1, 100.0, 0.97, "images"),
    ]
    lines = summary_table(runs, "/d/flowers").splitlines()
    assert lines[0] == "flowers (2 seeds)"
    defaults, k4 = lines[3].split(), lines[4].split()
    assert defaults[:5] == ["defaults", "0.940", "±", "0.014", "0.920"]  # test mean ± sd, kept val
    assert k4[-3:] == ["90.0", "2.00", "2000"]  # median seconds, x the first variant's 45.0, median peak MB
    assert "images 5ep (phase 1 kept), images 5ep" in lines[4]  # seed 0's phase 2 beat nothing: best_epoch 0


def test_a_run_without_a_test_split_shows_no_test_accuracy():
    lines = summary_table([_run("defaults", 0, 40.0, None)], "/d/flowers").splitlines()
    assert lines[3].split()[1] == "-"


def test_a_bad_variant_key_fails_before_any_run(tmp_path: Path):
    with pytest.raises(UserError, match="unknown config key 'nonsense'"):
        run_benchmark([tmp_path], [("x", {"nonsense": "1"})], (0,), "none", tmp_path)
