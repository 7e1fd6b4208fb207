"""The init_from benchmark's smaller datasets: without the last N classes, or the last share of
each class's training photos."""

from __future__ import annotations

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
