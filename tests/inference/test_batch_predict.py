"""scripts/predict.py: every file gets a row, bad ones with their reason, and the run never stops."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from app.errors import UserError
from app.export.layout import resolve_model_dir
from app.inference.batch_predict import list_inputs, predict_files
from app.inference.runtime import TFRuntime, answers_or_reasons, load_runtime

ROOT = Path(__file__).resolve().parents[2]
BOMB = b"\x89PNG\r\n\x1a\n" + struct.pack(">I4sII", 13, b"IHDR", 50_000, 50_000) + bytes(13)


@pytest.fixture
def photos(demo_images: Path, tmp_path: Path) -> Path:
    """The demo images (with their truncated JPEG, text file and empty file) plus a bomb."""
    folder = Path(shutil.copytree(demo_images, tmp_path / "photos"))
    (folder / "square" / "huge.png").write_bytes(BOMB)
    return folder


def test_a_folder_gives_one_csv_row_per_file_with_reasons_for_the_bad_ones(
    trained_run: Path, photos: Path, tmp_path: Path
):
    (photos / "star" / "moved.jpg").symlink_to(tmp_path / "gone.jpg")
    out = tmp_path / "predictions.csv"
    summary = predict_files(trained_run, str(photos), out, runtime="litert", top_k=2, batch_size=8)
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == len(list_inputs(str(photos))) == 4 * 12 + 5
    assert list(rows[0]) == [
        "path", "answer", "label_1", "score_1", "label_2", "score_2", "unknown", "ood_score", "error"
    ]  # fmt: skip
    errors = {Path(r["path"]).name: r["error"] for r in rows if r["error"]}
    assert errors.pop("truncated.jpg").startswith("undecodable: image file is truncated (")  # Pillow's words
    assert errors == {
        "not_an_image.jpg": "not an image (unrecognised format)",  # convert's words: a TIFF or HEIC is read
        "empty.jpg": "zero-byte file",
        "huge.png": "image is 50000x50000 pixels; the limit is 70 megapixels",
        "moved.jpg": "cannot read: No such file or directory",
    }
    assert summary.predicted == 48 and len(summary.failed) == 5 and summary.runtime == "litert float32"
    assert summary.warning.startswith("this model was trained from random initialisation")  # weights none
    # the scores are the SavedModel's probabilities, best first
    good = [r for r in rows if not r["error"]][:5]
    expected = TFRuntime(trained_run / "export" / "shapes" / "1").run(
        "serving_default", {"image_bytes": np.array([Path(r["path"]).read_bytes() for r in good], dtype=object)}
    )
    for i, (row, probabilities, classes) in enumerate(zip(good, expected["probabilities"], expected["classes"])):
        assert row["label_1"] == classes[0].decode()
        assert float(row["score_1"]) == pytest.approx(probabilities.max(), abs=1e-4)
        assert float(row["score_1"]) >= float(row["score_2"])
        assert float(row["ood_score"]) == pytest.approx(expected["ood_score"][i], abs=1e-4)  # the graph's own
        assert row["unknown"] == ("yes" if expected["unknown"][i] else "no")
        # the answer first: "unknown" where the photo is none of the classes, else the top class
        assert row["answer"] == ("unknown" if expected["unknown"][i] else row["label_1"])
    assert {(r["unknown"], r["answer"]) for r in rows if r["error"]} == {("", "")}
    assert summary.unknown == sum(r["unknown"] == "yes" for r in rows)


def test_a_tiff_and_an_iphone_heic_are_answered_as_convert_stores_them_for_training(
    trained_run: Path, demo_images: Path, tmp_path: Path
):
    """The eval decode reads JPEG, PNG, GIF, BMP and WebP; a photo in a format only Pillow reads
    was a row with an error, though `photoclf convert` trains on such photos."""
    from PIL import Image

    from app.data.convert import convert_image, read_heif

    read_heif()  # Pillow writes HEIC once taught it
    folder = tmp_path / "phone"
    folder.mkdir()
    photo = Image.open(demo_images / "star" / "star_000.jpg")
    files = [folder / "star.tiff", folder / "star.heic", folder / "star.bmp"]
    for file, fmt in zip(files, ("TIFF", "HEIF")):
        photo.save(file, fmt)
    photo.convert("P", palette=Image.ADAPTIVE).save(files[2], "BMP")  # a palette BMP TensorFlow misreads
    out = tmp_path / "predictions.csv"
    summary = predict_files(trained_run, str(folder), out, runtime="litert", top_k=1, batch_size=8)
    rows = {Path(r["path"]).name: r for r in csv.DictReader(out.open())}
    as_trained = np.array([convert_image(f.read_bytes()).jpeg for f in files], dtype=object)
    expected = TFRuntime(trained_run / "export" / "shapes" / "1").run("serving_default", {"image_bytes": as_trained})
    assert summary.predicted == 3 and not summary.failed
    for file, probabilities in zip(files, expected["probabilities"]):
        assert rows[file.name]["error"] == ""
        assert float(rows[file.name]["score_1"]) == pytest.approx(probabilities.max(), abs=1e-4)
    from app.inference.runtime import answers_or_reasons

    runtime = TFRuntime(trained_run / "export" / "shapes" / "1")
    over = answers_or_reasons(runtime, [files[1].read_bytes()], max_megapixels=photo.width * photo.height / 2e6)
    assert over == [
        f"decompression bomb: {photo.width}x{photo.height} exceeds {photo.width * photo.height // 2} pixels"
    ]


def test_a_list_file_with_a_missing_path_and_jsonl_output(trained_run: Path, photos: Path, tmp_path: Path):
    listing = tmp_path / "paths.txt"
    listing.write_text(f"# photos to label\nphotos/circle/circle_000.png\n{photos / 'star'}\nmissing.jpg\n")
    shutil.copy(next((photos / "circle").glob("circle_000.*")), tmp_path / "photos" / "circle" / "circle_000.png")
    summary = predict_files(trained_run, str(listing), tmp_path / "out.jsonl", runtime="tf", top_k=1)
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [Path(r["path"]).name for r in rows] == ["circle_000.png", "star", "missing.jpg"]
    assert len(rows[0]["predictions"]) == 1 and rows[0]["error"] is None
    assert rows[1]["error"].startswith("cannot read") and rows[2]["error"].startswith("cannot read: No such file")
    assert summary.predicted == 1
    predict_files(trained_run, str(listing), tmp_path / "out.json", runtime="tf", top_k=1)
    assert json.loads((tmp_path / "out.json").read_text()) == rows  # .json: one array, as json.load reads it


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "json"])
def test_file_names_in_any_script_or_not_utf8_at_all_come_back_as_paths_that_open(
    trained_run: Path, photos: Path, tmp_path: Path, fmt: str
):
    """A CSV ended in UnicodeEncodeError after every photo was predicted, on a name that is not UTF-8."""
    folder = tmp_path / "named"
    folder.mkdir()
    photo = next((photos / "circle").glob("circle_000.*")).read_bytes()
    (folder / "日本の写真.png").write_bytes(photo)
    try:
        Path(os.fsdecode(bytes(folder) + b"/\xff\xfe.png")).write_bytes(photo)
    except OSError:
        pytest.skip("this file system takes UTF-8 names only")
    out = tmp_path / f"out.{fmt}"
    assert predict_files(trained_run, str(folder), out, runtime="tf", fmt=fmt).predicted == 2
    text = out.read_text(encoding="utf-8", errors="surrogateescape")
    if fmt == "csv":
        rows = list(csv.DictReader(io.StringIO(text, newline="")))
    else:
        rows = json.loads(text) if fmt == "json" else [json.loads(line) for line in text.splitlines()]
        assert "日本の写真.png" in text  # as written, not \u-escaped
    assert sorted(Path(row["path"]).read_bytes() == photo for row in rows) == [True, True]


def test_bad_arguments_fail_before_any_work(trained_run: Path, tmp_path: Path):
    with pytest.raises(UserError, match="no such folder, list file or matching glob"):
        predict_files(trained_run, str(tmp_path / "nowhere"), tmp_path / "p.csv")
    with pytest.raises(UserError, match="does not exist"):
        predict_files(trained_run, str(tmp_path), tmp_path / "no" / "p.csv")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no files in it"):
        predict_files(trained_run, str(tmp_path / "empty"), tmp_path / "p.csv")
    with pytest.raises(UserError, match=r"/none\*/\*.jpg: matches no files"):
        predict_files(trained_run, f"{tmp_path}/none*/*.jpg", tmp_path / "p.csv")
    with pytest.raises(UserError, match="is a folder; give the file to write"):
        predict_files(trained_run, str(tmp_path / "empty"), tmp_path / "empty")
    (tmp_path / "paths.csv").write_bytes(b"\xff\xd8\xff\xe0 not text")
    with pytest.raises(UserError, match="paths.csv: a list of paths must be UTF-8 text"):
        predict_files(trained_run, str(tmp_path / "paths.csv"), tmp_path / "p.csv")
    with pytest.raises(
        UserError, match=r"^--output .*p.xml: .xml is none of .csv, .jsonl, .json; name the file so, or"
    ):
        predict_files(trained_run, str(tmp_path), tmp_path / "p.xml")  # was written as a CSV, silently
    with pytest.raises(UserError, match="^--batch-size must be >= 1, got 0$"):
        predict_files(trained_run, str(tmp_path), tmp_path / "p.csv", batch_size=0)
    (tmp_path / "records").mkdir()
    (tmp_path / "records" / "dataset.json").write_text("{}")  # TFRecords, given where photos are asked for
    with pytest.raises(
        UserError, match=r"^INPUT .*records: a TFRecord folder \(dataset.json\), not photo files .*; evaluate reads"
    ):
        predict_files(trained_run, str(tmp_path / "records"), tmp_path / "p.csv")


def test_one_photo_is_an_input_of_its_own(trained_run: Path, photos: Path, tmp_path: Path):
    photo = next((photos / "star").glob("star_000.*"))
    summary = predict_files(trained_run, str(photo), tmp_path / "one.csv", runtime="tf", top_k=2)
    rows = list(csv.DictReader((tmp_path / "one.csv").open()))
    assert [Path(r["path"]).name for r in rows] == [photo.name] and rows[0]["error"] == ""
    assert summary.predicted == 1 and rows[0]["label_1"] in ("circle", "square", "star")


@pytest.mark.slow  # a subprocess or a second run: the fast tier stays under 3 minutes
def test_the_script_on_a_glob_prints_a_summary_and_leaves_no_temp_files(
    trained_run: Path, photos: Path, tmp_path: Path
):
    out = tmp_path / "results" / "p.csv"
    out.parent.mkdir()
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts/predict.py"), str(trained_run), f"{photos}/s*/*", "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "24 photo(s) predicted" in run.stdout and "3 file(s) could not be predicted" in run.stdout
    assert len(list(csv.DictReader(out.open()))) == 27
    assert [p.name for p in out.parent.iterdir()] == ["p.csv"]


def test_explain_writes_an_overlay_and_a_map_of_the_photo_s_size_for_each_predicted_photo(
    trained_run: Path, photos: Path, tmp_path: Path
):
    from PIL import Image

    from app.inference.explain import explained_paths

    out = tmp_path / "why"
    predict_files(trained_run, str(photos), tmp_path / "p.csv", runtime="litert", explain=out)
    rows = list(csv.DictReader((tmp_path / "p.csv").open()))
    good = [Path(r["path"]) for r in rows if not r["error"]]
    assert len(good) == 48
    for path in good[::12]:
        overlay, cam = explained_paths(out, path.relative_to(photos))
        heat = np.load(cam)
        with Image.open(path) as photo, Image.open(overlay) as shown:
            assert heat.shape == (photo.height, photo.width) and shown.size == photo.size
        assert heat.dtype == np.float32 and heat.min() >= 0.0 and heat.max() <= 1.0
    written = {p.relative_to(out) for p in out.rglob("*") if p.is_file()}
    assert len(written) == 2 * 48  # none for the files that failed
    assert not any(p.name.startswith(".") for p in written)


def test_explain_needs_the_run_dir(trained_run: Path, photos: Path, tmp_path: Path):
    export = Path(shutil.copytree(trained_run / "export" / "shapes", tmp_path / "alone" / "shapes"))
    with pytest.raises(UserError, match="--explain: .* is not inside its run dir"):
        predict_files(export, str(photos), tmp_path / "p.csv", explain=tmp_path / "why")
    assert not (tmp_path / "p.csv").exists()


def test_explain_inside_the_photo_folder_is_refused_before_the_model_loads(trained_run: Path, photos: Path, tmp_path):
    """Its overlays are PNGs: the next predict of the folder would answer them as photos."""
    with pytest.raises(UserError, match=f"^--explain {photos / 'why'} is inside INPUT {photos}: a later predict"):
        predict_files(trained_run, str(photos), tmp_path / "p.csv", explain=photos / "why")
    assert not (photos / "why").exists() and not (tmp_path / "p.csv").exists()


def test_a_photo_without_an_answer_gets_the_header_s_words_where_it_named_the_format_else_convert_s(trained_run: Path):
    """Predict reads TIFF and HEIC as convert does, so "not a JPEG, PNG, GIF, BMP or WebP image"
    would mislead for a file that is no image at all; a damaged header of a format read says so."""
    runtime = load_runtime(resolve_model_dir(trained_run), "litert")
    png = io.BytesIO()
    Image.new("RGB", (30, 30)).save(png, "PNG")
    reasons = answers_or_reasons(runtime, [b"", b"hello", png.getvalue()[:20]], max_megapixels=70)
    assert reasons == [
        "zero-byte file",
        "not an image (unrecognised format)",
        "cannot read the image header: truncated PNG header",
    ]
