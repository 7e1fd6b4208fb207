"""The shortcuts benchmark: the work each shortcut skips is timed on a real run's door, and the
report gives each saving against the runs' wall times."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.config import TrainConfig
from app.errors import UserError
from benchmarks import shortcuts
from benchmarks.training_choices import Run


@pytest.mark.slow  # two runs: the fast tier stays under 3 minutes
def test_each_skipped_piece_of_work_is_timed(tiny_config: TrainConfig, demo_records: Path):
    seconds = shortcuts.skipped_work(tiny_config.replace(feature_views="2"), demo_records)
    assert set(seconds) == {"test split on images", "test split above the cut", "all rows above the cut",
                            "earlier photos' rows above the cut"}  # fmt: skip
    assert all(s > 0 for s in seconds.values())


@pytest.mark.slow  # a run: the fast tier stays under 3 minutes
def test_a_run_that_keeps_no_activations_is_refused(tiny_config: TrainConfig, demo_records: Path):
    with pytest.raises(UserError, match="keeps no views' or test photos' activations"):
        shortcuts.skipped_work(tiny_config.replace(feature_views="0"), demo_records)


def test_the_report_gives_each_saving_as_a_share_of_both_runs():
    metrics = {"test": {"accuracy": 0.9}, "phase1": {"val_accuracy": 0.9}}
    cold, warm = Run("d", "cold", 0, 200.0, 1.0, metrics), Run("d", "warm", 0, 50.0, 1.0, metrics)
    seconds = {"test split on images": 6.0, "test split above the cut": 1.0, "all rows above the cut": 4.0,
               "earlier photos' rows above the cut": 3.0}  # fmt: skip
    lines = shortcuts.report(cold, warm, seconds).splitlines()
    assert any(line.split()[-3:] == ["5.0", "2.5%", "10.0%"] and line.startswith("test split") for line in lines)
    assert any(line.split()[-3:] == ["4.0", "2.0%", "8.0%"] and "phase 1's features" in line for line in lines)
    assert any(line.split()[-3:] == ["3.0", "1.5%", "6.0%"] and line.startswith("kept weights'") for line in lines)
