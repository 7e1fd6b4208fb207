"""The defaults suite: how a shared photo set becomes a suite set (the same cut every time), and
its tables' arithmetic (differences from the defaults per seed, the worst set named)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.errors import UserError
from benchmarks.suite import Cut, cut_folder, prepare, set_table, worst_sets
from benchmarks.training_choices import Run


def _photos(root: Path, counts: dict[str, dict[str, int]]) -> Path:
    for split, classes in counts.items():
        for name, n in classes.items():
            (root / split / name).mkdir(parents=True)
            for i in range(n):
                (root / split / name / f"{i:03d}.jpg").write_bytes(b"x")
    return root


def _count(root: Path) -> dict[str, dict[str, int]]:
    return {s.name: {c.name: len(list(c.iterdir())) for c in sorted(s.iterdir())} for s in sorted(root.iterdir())}


def test_a_share_of_training_photos_keeps_the_imbalance_and_val_gives_a_test_split(tmp_path: Path):
    source = _photos(tmp_path / "src", {"train": {"hat": 30, "shirt": 90}, "val": {"hat": 10, "shirt": 10}})
    cut_folder(source, tmp_path / "a", Cut(train=1 / 3, val=4, test_from_val=5), quick=False)
    assert _count(tmp_path / "a") == {"test": {"hat": 5, "shirt": 5}, "train": {"hat": 10, "shirt": 30},
                                      "val": {"hat": 4, "shirt": 4}}  # fmt: skip
    picked = sorted(p.name for p in (tmp_path / "a" / "train" / "hat").iterdir())
    assert (tmp_path / "a" / "train" / "hat" / picked[0]).is_symlink()  # photos are linked, never copied
    val = {p.name for p in (tmp_path / "a" / "val" / "hat").iterdir()}
    assert not val & {p.name for p in (tmp_path / "a" / "test" / "hat").iterdir()}  # test held out of val
    cut_folder(source, tmp_path / "b", Cut(train=1 / 3, val=4, test_from_val=5), quick=False)
    assert picked == sorted(p.name for p in (tmp_path / "b" / "train" / "hat").iterdir())  # the same cut each time


def test_quick_caps_training_photos_and_keeps_the_sets_own_test_split(tmp_path: Path):
    source = _photos(tmp_path / "src", {"train": {"a": 50, "b": 8}, "val": {"a": 6, "b": 6}, "test": {"a": 7, "b": 7}})
    cut_folder(source, tmp_path / "q", Cut(), quick=True)
    assert _count(tmp_path / "q") == {"test": {"a": 7, "b": 7}, "train": {"a": 20, "b": 8}, "val": {"a": 6, "b": 6}}


def _run(where: str, variant: str, seed: int, accuracy: float, seconds: float) -> Run:
    return Run(where, variant, seed, seconds, 2000.0, {"test": {"accuracy": accuracy}, "phase1": {"val_accuracy": 0.9}})


RUNS = [
    _run("food10 mobilenet_v2", "defaults", 0, 0.80, 100.0),
    _run("food10 mobilenet_v2", "views", 0, 0.77, 50.0),
    _run("food10 mobilenet_v2", "defaults", 1, 0.82, 120.0),
    _run("food10 mobilenet_v2", "views", 1, 0.81, 70.0),
    _run("flowers17 mobilenet_v2", "defaults", 0, 0.95, 90.0),
    _run("flowers17 mobilenet_v2", "views", 0, 0.955, 45.0),
]


def test_converted_sets_are_found_from_the_work_folder_or_from_its_full_folder(tmp_path: Path):
    records = tmp_path / "work" / "full" / "food10"
    records.mkdir(parents=True)
    (records / "dataset.json").write_text("{}")  # a finished conversion: reused, nothing converted
    no_shared = tmp_path / "nowhere"
    assert prepare(no_shared, tmp_path / "work", "food10", quick=False) == records
    assert prepare(no_shared, tmp_path / "work" / "full", "food10", quick=False) == records
    with pytest.raises(UserError, match="has no train/ folder"):  # the quick cut is its own conversion
        prepare(no_shared, tmp_path / "work" / "full", "food10", quick=True)


def test_each_variant_is_compared_with_the_defaults_of_the_same_seed():
    lines = set_table(RUNS, "food10 mobilenet_v2").splitlines()
    assert lines[0] == "food10 mobilenet_v2 (2 seeds)"
    defaults, views = lines[3].split(), lines[4].split()
    assert defaults[:6] == ["defaults", "0.810", "±", "0.014", "0.800", "0.820"]
    assert defaults[-3:] == ["110", "1.00", "-"]
    assert views[-4:] == ["60", "0.55", "-3.0", "-1.0"]  # median 60 s = 0.55 x 110 s; per seed, in points


def test_the_worst_set_is_where_a_variant_loses_most_on_average():
    table = worst_sets(RUNS).splitlines()
    assert table[1].split()[:2] == ["variant", "food10"]
    row = table[-1]
    assert row.split()[:3] == ["views", "-2.0", "+0.5"]  # food10: mean of -3 and -1; flowers17: +0.5
    assert row.endswith("food10 mobilenet_v2 (-2.0)")


def test_previous_reruns_only_where_the_old_plan_chose_the_views(tmp_path: Path, monkeypatch):
    """The plan before the suite ran phase 2 on the views at phase 1 val >= 0.95, else what the
    defaults run now: there the defaults' run stands for it, and nothing runs twice."""
    from benchmarks import suite

    calls = []

    def fake_run_once(records, variant, seed, weights, out, log):
        name, overrides = variant
        calls.append((records.name, name, overrides))
        phase1 = 0.96 if records.name == "easy" else 0.90
        return Run(str(records), name, seed, 10.0, 1.0, {"phase1": {"val_accuracy": phase1}, "test": {"accuracy": 0.9}})

    monkeypatch.setattr(suite, "run_once", fake_run_once)
    sets = {"easy": tmp_path / "easy", "hard": tmp_path / "hard"}
    runs = suite.run_suite(sets, {"mobilenet_v2": "w.h5"}, [("defaults", {}), ("previous", {})], (0,), tmp_path, print)
    assert [(c[0], c[1]) for c in calls] == [("easy", "defaults"), ("easy", "previous"), ("hard", "defaults")]
    assert calls[1][2] == {"backbone": "mobilenet_v2", "phase2_mode": "views", "epochs_finetune": "5"}
    hard_previous = next(r for r in runs if r.data == "hard mobilenet_v2" and r.variant == "previous")
    assert hard_previous.metrics["phase1"]["val_accuracy"] == 0.90  # the defaults' own run, relabelled


def test_a_suite_stopped_early_keeps_the_runs_that_ended(tmp_path: Path, monkeypatch):
    """Hours of runs: Ctrl-C during the second leaves the first with the caller, for its tables."""
    from benchmarks import suite

    def fake_run_once(records, variant, seed, weights, out, log):
        if records.name == "hard":
            raise KeyboardInterrupt
        metrics = {"phase1": {"val_accuracy": 0.9}, "test": {"accuracy": 0.9}}
        return Run(str(records), variant[0], seed, 10.0, 1.0, metrics)

    monkeypatch.setattr(suite, "run_once", fake_run_once)
    ended: list[Run] = []
    with pytest.raises(KeyboardInterrupt):
        suite.run_suite({"easy": tmp_path / "easy", "hard": tmp_path / "hard"}, {"mobilenet_v2": "w.h5"},
                        [("defaults", {})], (0,), tmp_path, print, ended)  # fmt: skip
    assert [(r.data, r.variant) for r in ended] == [("easy mobilenet_v2", "defaults")]
