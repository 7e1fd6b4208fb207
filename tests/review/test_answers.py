"""The review's manifest: each answer a row the converter reads, an existing manifest kept as it is."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from PIL import Image

from app.data.sources import scan_source
from app.errors import UserError
from app.review.answers import NOT_ANY_CLASS, Answers


def _photos(folder: Path, names: list[str]) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, name in enumerate(names):
        path = folder / name
        Image.new("RGB", (40, 30), (40 * i, 90, 200 - 30 * i)).save(path)
        paths.append(path)
    return paths


def _rows(path: Path) -> list[list[str]]:
    with path.open(newline="") as f:
        return list(csv.reader(f))


def test_answers_round_trip_through_the_converters_reader(tmp_path: Path):
    photos = _photos(tmp_path / "new", [f"p{i}.png" for i in range(6)])
    manifest = tmp_path / "labels" / "review.csv"
    manifest.parent.mkdir()
    answers = Answers.open(manifest)
    for photo, label in zip(photos, ["cat", "dog", "cat", None, "dog", "cat"]):
        answers.record(photo, label)
    assert _rows(manifest)[:2] == [["path", "label", "keep"], ["../new/p0.png", "cat", "true"]]
    assert _rows(manifest)[4] == ["../new/p3.png", NOT_ANY_CLASS, "false"]
    source = scan_source(manifest, val_fraction=0.34, test_fraction=0.0, seed=0)
    assert source.classes == ["cat", "dog"]  # "not any class" is never made a class
    assert sorted(i.path for i in source.images) == sorted(p.resolve() for i, p in enumerate(photos) if i != 3)
    assert [s["path"] for s in source.skipped] == ["../new/p3.png"]
    assert Answers.open(manifest).reviewed() == {p.resolve() for p in photos}  # none is asked again


def test_an_existing_manifest_keeps_its_columns_and_new_rows_go_to_train(tmp_path: Path):
    old = _photos(tmp_path, ["old.png", "old_val.png", "dog.png", "dog_val.png"])
    new = _photos(tmp_path, ["new.png", "junk.png"])
    manifest = tmp_path / "photos.csv"
    manifest.write_text(
        "path,label,split,note\nold.png,cat,train,first\nold_val.png,cat,val,\ndog.png,dog,train,\ndog_val.png,dog,val,\n"
    )
    answers = Answers.open(manifest)
    answers.record(new[0], "cat")
    assert _rows(manifest)[-1] == ["new.png", "cat", "train", ""]
    answers.record(new[1], None)  # needs a keep column: added, the earlier rows kept
    assert _rows(manifest) == [
        ["path", "label", "split", "note", "keep"],
        ["old.png", "cat", "train", "first", "true"],
        ["old_val.png", "cat", "val", "", "true"],
        ["dog.png", "dog", "train", "", "true"],
        ["dog_val.png", "dog", "val", "", "true"],
        ["new.png", "cat", "train", "", "true"],
        ["junk.png", NOT_ANY_CLASS, "train", "", "false"],
    ]
    source = scan_source(manifest)
    assert {(Path(i.relpath).name, i.split) for i in source.images} == {
        ("old.png", "train"),
        ("old_val.png", "val"),
        ("dog.png", "train"),
        ("dog_val.png", "val"),
        ("new.png", "train"),
    }
    assert Answers.open(manifest).reviewed() == {p.resolve() for p in old + new}


@pytest.mark.parametrize(
    "text,message",
    [
        ("file,class\na.png,cat\n", "the first line must be the header 'path,label'"),
        ("path,label\na.png,cat,extra\n", ":2: expected 2 columns, got 3"),
        (b"path,label\n\xff\xfe.png,cat\n", ":2: not UTF-8 text"),
    ],
)
def test_a_manifest_the_converter_would_refuse_is_refused_naming_it(tmp_path: Path, text, message: str):
    manifest = tmp_path / "bad.csv"
    manifest.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(UserError, match=f"^{manifest}{message}" if message.startswith(":") else message):
        Answers.open(manifest)


def test_a_manifest_in_a_missing_folder_is_refused(tmp_path: Path):
    with pytest.raises(UserError, match="does not exist"):
        Answers.open(tmp_path / "nowhere" / "review.csv")


def test_a_photo_copied_from_one_the_manifest_names_is_found_by_its_bytes(tmp_path: Path):
    named = _photos(tmp_path / "data", ["a.png", "b.png", "c.png"])
    answers = Answers.open(tmp_path / "review.csv")
    for photo in named:
        answers.record(photo, "cat")
    new = _photos(tmp_path / "new", ["x.png", "y.png"])  # the colours of a.png and b.png: the same bytes
    same_size = tmp_path / "new" / "z.png"  # as large as c.png, other bytes
    same_size.write_bytes(bytes(reversed(named[2].read_bytes())))
    gone = tmp_path / "new" / "gone.png"  # listed, then deleted: not a copy of anything
    assert answers.copies([*new, same_size, gone]) == set(new)
    (tmp_path / "data" / "a.png").unlink()  # a named photo that is gone is no longer matched
    assert answers.copies([*new, same_size]) == {new[1]}
