"""`photoclf review`: the queue from a real (tiny) export, the page's API, and bad input in one line."""

from __future__ import annotations

import asyncio
import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from conftest import with_tiny_backbone
from PIL import Image

from app.export.layout import metadata_path, resolve_model_dir
from app.review.answers import NOT_ANY_CLASS, Answers
from app.review.queue import rank_photos
from app.review.server import Review, make_app


@pytest.fixture(scope="module")
def unlabelled(demo_images: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three photos of each shape, and a burst: four copies of one more. Each is a demo photo saved
    again (new bytes, as a new photo has): a byte-for-byte copy of one of the run's photos is
    not asked about."""
    folder = tmp_path_factory.mktemp("unlabelled")
    for shape in ("circle", "square", "star", "triangle"):
        for photo in sorted((demo_images / shape).glob(f"{shape}_*.jpg"))[:3]:
            Image.open(photo).save(folder / photo.name, quality=90)
    Image.open(sorted((demo_images / "star").glob("star_*.jpg"))[5]).save(folder / "burst_0.jpg", quality=90)
    for i in range(1, 4):
        shutil.copy(folder / "burst_0.jpg", folder / f"burst_{i}.jpg")
    (folder / "notes.txt").write_text("not a photo")
    return folder


def test_the_queue_asks_the_least_sure_first_and_one_photo_of_a_burst_early(trained_run: Path, unlabelled: Path):
    photos = sorted(p for p in unlabelled.iterdir())
    queue = rank_photos(resolve_model_dir(trained_run), photos, runtime="tf")
    assert [Path(f["path"]).name for f in queue.failed] == ["notes.txt"]
    assert len(queue.candidates) == 16 and queue.classes == ["circle", "square", "star", "triangle"]
    burst_places = [i for i, c in enumerate(queue.candidates) if c.path.name.startswith("burst_")]
    assert burst_places[1:] == [13, 14, 15]  # three copies wait behind every other photo
    front = queue.candidates[:13]
    assert [c.priority for c in front] == sorted((c.priority for c in front), reverse=True)
    for c in queue.candidates:
        assert c.guesses[0][1] >= c.guesses[1][1] >= c.guesses[2][1] and c.unknown is not None


def _call(app, calls):
    async def go():
        async with TestClient(TestServer(app)) as client:
            out = []
            for method, path, body in calls:
                response = await client.request(method, path, data=body)
                out.append((response.status, await response.read()))
            return out

    return asyncio.run(go())


def test_the_pages_api_hands_out_batches_and_writes_each_answer(trained_run: Path, unlabelled: Path, tmp_path: Path):
    photos = sorted(p for p in unlabelled.iterdir() if p.suffix == ".jpg")
    queue = rank_photos(resolve_model_dir(trained_run), photos, runtime="tf")
    manifest = tmp_path / "review.csv"
    review = Review(queue, Answers.open(manifest), unlabelled)
    first, second, third = (json.dumps({"id": i, **a}) for i, a in enumerate(
        [{"label": "star"}, {"action": "not_any_class"}, {"action": "skip"}]))  # fmt: skip
    results = _call(
        make_app(review),
        [
            ("GET", "/api/state", None),
            ("GET", "/api/batch?size=5", None),
            ("GET", "/api/photo/0", None),
            ("POST", "/api/answer", first),
            ("POST", "/api/answer", second),
            ("POST", "/api/answer", third),
            ("GET", "/api/batch?size=5", None),
            ("POST", "/api/answer", first),
            ("POST", "/api/answer", json.dumps({"id": 4, "label": "hexagon"})),
            ("POST", "/api/answer", json.dumps({"id": 99, "label": "star"})),
            ("POST", "/api/answer", "{not json"),
            ("GET", "/api/photo/../../etc/passwd", None),
            ("GET", "/api/batch?size=0", None),
            ("POST", "/api/answer", '{"id": 5, "label": ' + "[" * 20_000 + "]" * 20_000 + "}"),  # was a 500
            ("POST", "/api/answer", json.dumps({"id": 5, "label": "star", **{f"k{i}": 0 for i in range(8)}})),
        ],
    )
    state, batch, photo, *answered, later = (json.loads(b) if i != 2 else b for i, (_, b) in enumerate(results[:7]))
    assert state["classes"] == queue.classes and state["remaining"] == 16
    assert [p["id"] for p in batch["photos"]] == [0, 1, 2, 3, 4]
    assert batch["photos"][0]["name"] == queue.candidates[0].path.name
    assert photo == queue.candidates[0].path.read_bytes()
    assert answered[-1] == {"remaining": 13, "answered": 2, "skipped": 1}
    assert [p["id"] for p in later["photos"]] == [3, 4, 5, 6, 7]  # answered and skipped photos are not asked again
    assert [status for status, _ in results[7:]] == [409, 400, 404, 400, 404, 400, 400, 400]
    assert "hexagon" in json.loads(results[8][1])["error"]
    assert json.loads(results[13][1])["error"].endswith("nested deeper than 1 levels")
    assert json.loads(results[14][1])["error"].endswith("more than 16 values")
    with manifest.open(newline="") as f:
        rows = list(csv.reader(f))
    assert rows == [
        ["path", "label", "keep"],
        [os.path.relpath(queue.candidates[0].path, tmp_path), "star", "true"],
        [os.path.relpath(queue.candidates[1].path, tmp_path), NOT_ANY_CLASS, "false"],
    ]


WITHOUT_TENSORFLOW = """
import sys
sys.modules["tensorflow"] = None
from app.commands import main
main(sys.argv[1:])
"""


@pytest.mark.parametrize(
    "args,message",
    [
        (["{tmp}/nowhere", "{tmp}/photos"], "{tmp}/nowhere: no such run dir or export"),
        (["{tmp}/m/1", "{tmp}/photos/*.png"], "UNLABELLED {tmp}/photos/*.png: matches no files"),
        (["{tmp}/m/1", "{tmp}/photos", "--manifest", "{tmp}/bad.csv"], "{tmp}/bad.csv: the first line must be"),
        (["{tmp}/m/1", "{tmp}/photos", "--manifest", "{tmp}/no/r.csv"], "--manifest {tmp}/no/r.csv: folder"),
        (["{tmp}/m/1", "{tmp}/photos", "--manifest", "{tmp}/done.csv"], "{tmp}/photos: every photo is already in"),
        (["{tmp}/multi/1", "{tmp}/photos"], "{tmp}/multi/1: a multi-label model"),
        (["{tmp}/m/1", "{tmp}/photos", "--batch-size", "0"], "--batch-size must be >= 1, got 0"),
        (["{tmp}/m/1", "{tmp}/records"], "UNLABELLED {tmp}/records: a TFRecord folder (dataset.json), not photo"),
    ],
)
def test_bad_input_is_one_line_before_tensorflow(tmp_path: Path, args: list[str], message: str):
    for name, metadata in (("m", {}), ("multi", {"thresholds": [0.5, 0.5]})):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "1" / "saved_model.pb").write_bytes(b"")
        metadata_path(tmp_path / name / "1").parent.mkdir()
        metadata_path(tmp_path / name / "1").write_text(json.dumps(metadata))
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "a.jpg").write_bytes(b"\xff\xd8")
    (tmp_path / "records").mkdir()
    (tmp_path / "records" / "dataset.json").write_text("{}")  # what convert wrote: its shards are no photos
    (tmp_path / "bad.csv").write_text("file,class\n")
    (tmp_path / "done.csv").write_text("path,label\nphotos/a.jpg,cat\n")
    filled = [a.format(tmp=tmp_path) for a in ["review", *args, "--top", "3"]]
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_TENSORFLOW, *filled], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"error: {message.format(tmp=tmp_path)}") and done.stderr.count("\n") == 1


def test_a_folder_without_a_photo_the_model_reads_is_one_error_not_an_empty_page(trained_run: Path, tmp_path: Path):
    from app.commands import build_parser
    from app.errors import UserError

    (tmp_path / "notes.txt").write_text("no photo here")
    (tmp_path / "broken.jpg").write_bytes(b"\xff\xd8\xff")
    args = build_parser().parse_args(
        ["review", str(trained_run), str(tmp_path), "--manifest", str(tmp_path / "r.csv"), "--top", "1"]
    )
    with pytest.raises(UserError, match=r"none of its 2 file\(s\) is a photo the model reads"):
        args.run(args)
    assert not (tmp_path / "r.csv").exists()


def test_the_page_gets_a_phone_sized_photo_shrunk_and_a_small_one_as_it_is(tmp_path: Path):
    import io

    from PIL import Image

    from app.review.server import PAGE_SIDE, for_the_page

    big = io.BytesIO()
    Image.new("RGB", (4000, 3000), (200, 40, 40)).save(big, format="JPEG")
    body, content_type = for_the_page(big.getvalue(), "phone.jpg")
    with Image.open(io.BytesIO(body)) as shown:
        assert content_type == "image/jpeg" and max(shown.size) == PAGE_SIDE and shown.size[0] > shown.size[1]
        assert abs(shown.getpixel((10, 10))[0] - 200) < 8
    small = io.BytesIO()
    Image.new("RGB", (300, 200)).save(small, format="PNG")
    assert for_the_page(small.getvalue(), "small.png") == (small.getvalue(), "image/png")
    assert for_the_page(b"not a photo", "odd.jpg") == (b"not a photo", "image/jpeg")
    from app.data.convert import read_heif

    read_heif()  # Pillow writes HEIC once taught it
    for fmt in ("TIFF", "HEIF"):  # formats a browser may not show, however small: sent as JPEG
        odd = io.BytesIO()
        Image.new("RGB", (300, 200), (40, 200, 40)).save(odd, format=fmt)
        body, content_type = for_the_page(odd.getvalue(), f"small.{fmt.lower()}")
        with Image.open(io.BytesIO(body)) as shown:
            assert content_type == "image/jpeg" and shown.format == "JPEG" and shown.size == (300, 200)


def test_undo_takes_back_the_last_answer_and_its_manifest_row(trained_run: Path, unlabelled: Path, tmp_path: Path):
    photos = sorted(p for p in unlabelled.iterdir() if p.suffix == ".jpg")
    queue = rank_photos(resolve_model_dir(trained_run), photos, runtime="tf")
    manifest = tmp_path / "review.csv"
    review = Review(queue, Answers.open(manifest), unlabelled)
    results = _call(
        make_app(review),
        [
            ("POST", "/api/undo", None),  # nothing yet
            ("POST", "/api/answer", json.dumps({"id": 0, "label": "star"})),
            ("POST", "/api/answer", json.dumps({"id": 1, "action": "skip"})),
            ("POST", "/api/answer", json.dumps({"id": 2, "label": "circle"})),
            ("POST", "/api/undo", None),  # circle, and its row
            ("POST", "/api/undo", None),  # the skip
            ("GET", "/api/batch?size=3", None),
        ],
    )
    assert [status for status, _ in results] == [409, 200, 200, 200, 200, 200, 200]
    assert json.loads(results[4][1]) == {"id": 2, "remaining": 14, "answered": 1, "skipped": 1}
    assert json.loads(results[5][1]) == {"id": 1, "remaining": 15, "answered": 1, "skipped": 0}
    assert [p["id"] for p in json.loads(results[6][1])["photos"]] == [1, 2, 3]  # asked again
    with manifest.open(newline="") as f:
        assert [row[1] for row in csv.reader(f)] == ["label", "star"]


def test_a_combined_manifest_starts_with_the_runs_photos_in_their_splits(
    trained_run: Path, demo_images: Path, demo_records: Path, tmp_path: Path
):
    from app.data.pipeline import load_dataset_info
    from app.review import loop
    from app.run_dir import RunDir

    run = RunDir(trained_run)
    assert loop.source_of(run, None) == demo_images.resolve()  # dataset.json names where its photos are
    answers = loop.start_combined(tmp_path / "all.csv", run, demo_images)
    assert not (tmp_path / "all.csv").exists()  # written with the first answer
    answers.record(next(p for p in (demo_images / "star").iterdir()), "star")
    with (tmp_path / "all.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    info = load_dataset_info(demo_records)
    for split in ("train", "val", "test"):  # the answer is a training photo
        assert sum(r["split"] == split for r in rows) == info.num_examples(split) + (split == "train")
    assert all((tmp_path / r["path"]).resolve().is_file() and r["keep"] == "true" for r in rows)
    assert answers.has_splits and not Answers.open(tmp_path / "answers-only.csv").has_splits
    steps = loop.next_steps(answers, run)
    assert steps[0] == f"photoclf convert {tmp_path / 'all.csv'} {demo_records}-reviewed"
    new_run = f"--init-from {trained_run} --out {trained_run}-reviewed"
    assert steps[1].startswith(f"photoclf train --data {demo_records}-reviewed {new_run} --set backbone=tiny_cnn")


@pytest.mark.slow
def test_the_finished_pages_commands_convert_everything_and_train_again_from_the_run(
    trained_run: Path, demo_images: Path, unlabelled: Path, tmp_path: Path
):
    """The loop closes: the commands the finished page prints give a dataset of the run's photos
    (in their splits) and the answers (in train), and a run started from the earlier one."""
    import shlex

    from app.data.pipeline import load_dataset_info
    from app.review import loop
    from app.run_dir import RunDir

    run = RunDir(trained_run)
    answers = loop.start_combined(tmp_path / "all.csv", run, demo_images)
    photos = sorted(p for p in unlabelled.iterdir() if p.suffix == ".jpg")
    queue = rank_photos(resolve_model_dir(trained_run), photos, runtime="tf")
    review = Review(queue, answers, unlabelled, next_steps=loop.next_steps(answers, run))
    said = [{"id": 0, "label": "star"}, {"id": 1, "label": "circle"}, {"id": 2, "action": "not_any_class"}]
    results = _call(
        make_app(review), [("POST", "/api/answer", json.dumps(a)) for a in said] + [("GET", "/api/state", None)]
    )
    steps = json.loads(results[-1][1])["next_steps"]
    assert "--set image_size=64" in steps[1] and "--set max_steps_per_epoch=2" in steps[1]  # the run's own settings
    for step in steps:
        command = with_tiny_backbone(*shlex.split(step))  # photoclf ...: the run's backbone is the tests' own
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=600, env={**os.environ, "PHOTOCLF_WEIGHTS": ""}
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    before = load_dataset_info(run.read_config().data)
    after = load_dataset_info(f"{run.read_config().data}-reviewed")
    assert after.num_examples("train") == before.num_examples("train") + 2  # "not any class" is left out
    assert [after.counts[s] for s in ("val", "test")] == [before.counts[s] for s in ("val", "test")]
    metrics = json.loads((Path(f"{trained_run}-reviewed") / "metrics.json").read_text())
    assert metrics["init_from"]["run"] == str(trained_run)
