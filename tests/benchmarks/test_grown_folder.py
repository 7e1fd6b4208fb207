"""benchmarks.grown_folder: the photos of a grown folder's val and test that were training photos
before, under convert's split and under a whole-class shuffle."""

from __future__ import annotations

from pathlib import Path

from benchmarks.grown_folder import main, measure, photos_by_class


def _tree(root: Path) -> Path:
    """Two classes of 100 photos, kept in train/val/test folders as the shared sets are."""
    for i in range(200):
        split = ("train", "train", "train", "val", "test")[i % 5]
        folder = root / split / ("cat" if i % 2 else "dog")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"IMG_{i:04d}.jpg").write_bytes(b"x")
    return root


def test_the_split_folders_merge_into_classes_and_the_shuffle_sends_many_training_photos_to_evaluation(
    tmp_path: Path, capsys
):
    by_class = photos_by_class(_tree(tmp_path))
    assert sorted(by_class) == ["cat", "dog"] and [len(v) for v in by_class.values()] == [100, 100]
    rows = measure(by_class, grow=0.1, seed=0, fractions=(0.1, 0.1))
    assert rows["grown val+test"] == 40  # 10 + 10 of each class
    convert, shuffle = rows["convert"], rows["shuffle"]
    assert convert[1] == shuffle[1] == 40
    assert convert[0] <= 2 and shuffle[0] >= 15  # 2 and 19 of the 40 here
    main([str(tmp_path), "--seeds", "0"])
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"{tmp_path.name}: 200 photos in 2 classes; the last 10% of each added"
    assert out.splitlines()[2].split() == ["0", "40", str(convert[0]), str(shuffle[0])]
