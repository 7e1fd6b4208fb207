"""The init_from benchmark's earlier dataset: the split folder without its last N classes."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.errors import UserError
from benchmarks.init_from import earlier_folder


def split_folder(root: Path, classes: list[str]) -> Path:
    for split in ("train", "val", "test"):
        for name in classes:
            (root / split / name).mkdir(parents=True)
            (root / split / name / "a.jpg").write_bytes(b"x")
    return root


def test_the_earlier_folder_holds_every_split_of_all_but_the_last_classes(tmp_path: Path):
    folder = split_folder(tmp_path / "photos", ["daisy", "iris", "rose", "tulip"])
    out, held = earlier_folder(folder, tmp_path / "earlier", 2)
    assert held == ["rose", "tulip"]
    for split in ("train", "val", "test"):
        assert sorted(p.name for p in (out / split).iterdir()) == ["daisy", "iris"]
        assert (out / split / "iris" / "a.jpg").read_bytes() == b"x"


@pytest.mark.parametrize("hold_out", [0, 3])
def test_a_hold_out_that_leaves_fewer_than_two_classes_is_refused(tmp_path: Path, hold_out: int):
    folder = split_folder(tmp_path / "photos", ["daisy", "iris", "rose", "tulip"])
    with pytest.raises(UserError, match="--hold-out must leave at least 2 of the 4 classes"):
        earlier_folder(folder, tmp_path / f"earlier{hold_out}", hold_out)
