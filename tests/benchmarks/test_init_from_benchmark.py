"""The init_from benchmark's smaller datasets: without the last N classes, or the last share of
each class's training photos."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.errors import UserError
from benchmarks.init_from import fewer_classes, fewer_photos


def split_folder(root: Path, classes: list[str], photos: int = 1) -> Path:
    for split in ("train", "val", "test"):
        for name in classes:
            (root / split / name).mkdir(parents=True)
            for i in range(photos):
                (root / split / name / f"{i:02d}.jpg").write_bytes(f"{split} {name} {i}".encode())
    return root


def test_the_earlier_folder_holds_every_split_of_all_but_the_last_classes(tmp_path: Path):
    folder = split_folder(tmp_path / "photos", ["daisy", "iris", "rose", "tulip"])
    out, held = fewer_classes(folder, tmp_path / "earlier", 2)
    assert held == ["rose", "tulip"]
    for split in ("train", "val", "test"):
        assert sorted(p.name for p in (out / split).iterdir()) == ["daisy", "iris"]
        assert (out / split / "iris" / "00.jpg").read_bytes() == f"{split} iris 0".encode()


@pytest.mark.parametrize("hold_out", [0, 3])
def test_a_hold_out_that_leaves_fewer_than_two_classes_is_refused(tmp_path: Path, hold_out: int):
    folder = split_folder(tmp_path / "photos", ["daisy", "iris", "rose", "tulip"])
    with pytest.raises(UserError, match="--hold-out must leave at least 2 of the 4 classes"):
        fewer_classes(folder, tmp_path / f"earlier{hold_out}", hold_out)


def test_the_first_folder_lacks_the_last_tenth_of_each_class_s_training_photos_only(tmp_path: Path):
    folder = split_folder(tmp_path / "photos", ["daisy", "iris"], photos=20)
    out = fewer_photos(folder, tmp_path / "first", 0.1)
    for name in ("daisy", "iris"):
        assert sorted(p.name for p in (out / "train" / name).iterdir()) == [f"{i:02d}.jpg" for i in range(18)]
        assert len(list((out / "val" / name).iterdir())) == len(list((out / "test" / name).iterdir())) == 20
    with pytest.raises(UserError, match="--grow must be a fraction"):
        fewer_photos(folder, tmp_path / "none", 1.0)


def test_set_changes_every_run_and_warm_set_only_the_two_init_from_runs(tmp_path: Path, monkeypatch):
    from benchmarks import init_from

    seen = {}

    def fake_run(data, variant, seed, weights, out, log_file):
        name, overrides = variant
        seen[name] = overrides
        return init_from.Run(str(data), name, seed, 1.0, 1.0, {"test": {"accuracy": 0.5}})

    monkeypatch.setattr(init_from, "run_once", fake_run)
    data = {name: tmp_path / name for name in ("fewer_classes", "fewer_photos", "all")}
    every, warm = {"backbone": "efficientnet_lite0"}, {"phase2_mode": "images"}
    init_from.run_seed(data, 0, "w.npz", tmp_path, lambda _: None, every, warm)
    assert all(overrides["backbone"] == "efficientnet_lite0" for overrides in seen.values())
    assert {name for name, overrides in seen.items() if overrides.get("phase2_mode") == "images"} == {
        "init_from", "grown_init_from"
    }  # fmt: skip
    assert seen["init_from"]["init_from"] == str(tmp_path / "earlier")


@pytest.mark.parametrize(
    "flag, items, message",
    [("--set", ["seed"], "--set: expected key=value, got 'seed'"), ("--warm-set", ["nope=1"], "--warm-set: unknown")],
)
def test_overrides_are_checked_before_any_run(flag: str, items: list[str], message: str):
    from benchmarks.init_from import _overrides

    with pytest.raises(UserError, match=message):
        _overrides(flag, items)


def test_other_warm_runs_each_warm_run_again_on_the_store_as_the_first_found_it(tmp_path: Path, monkeypatch):
    from benchmarks import init_from

    seen, stores_seen = {}, {}

    def fake_run(data, variant, seed, weights, out, log_file):
        name, overrides = variant
        seen[name] = overrides
        store = Path(overrides.get("feature_store", tmp_path / "none"))
        stores_seen[name] = sorted(p.name for p in store.iterdir()) if store.is_dir() else None
        if store.is_dir() or name in ("earlier", "first"):
            store.mkdir(exist_ok=True)
            (store / f"rows-of-{name}").touch()  # what each run adds to the store it shares
        return init_from.Run(str(data), name, seed, 1.0, 1.0, {"test": {"accuracy": 0.5}})

    monkeypatch.setattr(init_from, "run_once", fake_run)
    data = {name: tmp_path / name for name in ("fewer_classes", "fewer_photos", "all")}
    runs = init_from.run_seed(data, 0, "w.npz", tmp_path, lambda _: None, None, {}, {"epochs_finetune": "5"}, "classes")
    assert list(runs) == ["earlier", "scratch", "init_from", "init_from_other"]
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+", name) for name in runs)  # each names a run dir and its export
    assert seen["init_from_other"]["epochs_finetune"] == "5" and "epochs_finetune" not in seen["init_from"]
    assert seen["init_from_other"]["init_from"] == seen["init_from"]["init_from"]
    assert stores_seen["init_from"] == stores_seen["init_from_other"] == ["rows-of-earlier"]  # not the first warm run's
    summary = init_from.summary([runs], ["c"], 0.1)
    assert "init_from_other" in summary and "1.00x scratch" in summary
