"""benchmarks/large_photos.py: phone-sized copies keep each photo's class path, and the scores are
computed per photo."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from benchmarks.large_photos import (
    accuracy,
    agreement,
    format_result,
    phone_size,
    repeated_tree,
    top1_by_photo,
    upscale_tree,
)


def test_copies_are_phone_sized_keep_orientation_and_path_and_skip_non_photos(tmp_path: Path):
    src = tmp_path / "photos"
    (src / "cat").mkdir(parents=True)
    (src / "dog").mkdir()
    Image.new("RGB", (64, 48), "red").save(src / "cat" / "a.png")
    Image.new("RGB", (48, 64), "blue").save(src / "dog" / "b.jpg")
    (src / "dog" / "notes.txt").write_text("not a photo")
    assert upscale_tree(src, tmp_path / "phone") == 2
    with (
        Image.open(tmp_path / "phone" / "cat" / "a.jpg") as landscape,
        Image.open(tmp_path / "phone" / "dog" / "b.jpg") as portrait,
    ):
        assert (landscape.size, landscape.format) == ((4000, 3000), "JPEG")
        assert portrait.size == (3000, 4000)
    assert phone_size(500, 500) == (4000, 3000)


def test_accuracy_and_agreement_are_per_photo_by_class_and_name(tmp_path: Path):
    def predictions(name: str, rows: list[tuple[str, str]]) -> Path:
        path = tmp_path / name
        path.write_text("path,label_1,score_1,error\n" + "".join(f"{p},{label},0.9,\n" for p, label in rows))
        return path

    originals = top1_by_photo(
        predictions("o.csv", [("x/cat/a.png", "cat"), ("x/dog/b.jpg", "dog"), ("x/dog/c.jpg", "cat")])
    )
    copies = top1_by_photo(
        predictions("c.csv", [("y/cat/a.jpg", "cat"), ("y/dog/b.jpg", "cat"), ("y/dog/c.jpg", "cat")])
    )
    assert accuracy(originals) == 2 / 3 and accuracy(copies) == 1 / 3
    assert agreement(originals, copies) == 2 / 3  # a and c agree, b does not


def test_the_table_gives_each_command_its_times_rates_and_ratio():
    result = {
        "photos": 10, "runtime": "litert", "accuracy_original": 0.9, "accuracy_phone": 0.8, "agreement": 0.95,
        "seconds": {"predict original": 2.0, "predict phone": 4.0, "evaluate original": 3.0, "evaluate phone": 3.0},
        "images_per_s": {"predict original": 5.0, "predict phone": 2.5, "evaluate original": 3.3,
                         "evaluate phone": 3.3},
    }  # fmt: skip
    text = format_result(result)
    assert "accuracy 0.9000 original, 0.8000 phone-sized; top-1 agreement 0.9500" in text
    predict = next(line for line in text.splitlines() if line.startswith("predict"))
    assert predict.split() == ["predict", "2.0", "4.0", "5.0", "2.5", "0.50x"]


def test_a_repeated_tree_lists_every_photo_n_times_under_its_class(tmp_path: Path):
    src = tmp_path / "photos"
    (src / "cat").mkdir(parents=True)
    (src / "cat" / "a.jpg").write_bytes(b"cat bytes")
    assert repeated_tree(src, tmp_path / "x1", 1) == src
    tree = repeated_tree(src, tmp_path / "x3", 3)
    names = sorted(p.name for p in (tree / "cat").iterdir())
    assert names == ["a~0.jpg", "a~1.jpg", "a~2.jpg"]
    assert {(tree / "cat" / n).read_bytes() for n in names} == {b"cat bytes"}
