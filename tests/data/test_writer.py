"""write_tfrecords: round trip, pixel fidelity, parallel workers, and nothing half-written."""

from __future__ import annotations

import io
import json
import re
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from app import storage
from app.data import schema, writer
from app.data.pipeline import load_dataset_info, make_eval_dataset, make_train_dataset
from app.data.summary import format_summary
from app.data.writer import write_tfrecords
from app.errors import UserError
from app.labels import LABELS_FILE, read_labels


def _read_all(out: str | Path) -> list[dict]:
    """Every record of every split, parsed directly (no pipeline in between)."""
    info = load_dataset_info(out)
    records = []
    for split in info.shards:
        for path in info.shard_paths(split):
            for raw in tf.data.TFRecordDataset(path):
                ex = tf.io.parse_single_example(raw, schema.FEATURE_SPEC)
                records.append({"split": split, **{k: ex[k].numpy() for k in ex}})
    return records


def _source_files(images: Path) -> dict[str, str]:
    """relpath → class for every file the writer should accept."""
    bad = {"circle/truncated.jpg", "square/not_an_image.jpg", "star/empty.jpg"}
    return {
        str(p.relative_to(images)): p.parent.name
        for p in images.rglob("*")
        if p.is_file() and not p.name.startswith(".") and str(p.relative_to(images)) not in bad
    }


def test_every_image_lands_once_with_its_label(demo_images: Path, demo_records: Path):
    records = _read_all(demo_records)
    classes = read_labels(demo_records / LABELS_FILE)
    names = [r[schema.FILENAME].decode() for r in records]
    assert Counter(names) == Counter(_source_files(demo_images).keys())  # each exactly once
    expected = _source_files(demo_images)
    for r in records:
        name = r[schema.FILENAME].decode()
        assert classes[r[schema.LABEL]] == r[schema.TEXT].decode() == expected[name]


def test_pipelines_see_each_record_once_per_epoch(demo_images: Path, demo_records: Path):
    info = load_dataset_info(demo_records)
    seen = Counter()
    for split in info.shards:
        for _, _labels, files in make_eval_dataset(demo_records, split=split, image_size=32, with_filenames=True):
            seen.update(f.decode() for f in files.numpy())
    assert seen == Counter(_source_files(demo_images).keys())
    train = make_train_dataset(demo_records, image_size=32, batch_size=5)
    labels = np.concatenate([y.numpy() for _, y in train])
    expected = Counter({info.classes.index(c): n for c, n in info.counts["train"].items()})
    assert Counter(labels.tolist()) == expected


def test_skipped_files_are_reported(demo_records: Path):
    meta = json.loads((demo_records / schema.METADATA_FILE).read_text())
    reasons = {s["path"]: s["reason"] for s in meta["skipped"]}
    assert set(reasons) == {"circle/truncated.jpg", "square/not_an_image.jpg", "star/empty.jpg"}
    assert "truncated" in reasons["circle/truncated.jpg"]
    assert meta["shards"]["train"] == ["train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord"]
    assert sum(meta["shard_records"].values()) == sum(sum(c.values()) for c in meta["counts"].values())


def test_stored_images_decode_to_source_pixels(demo_images: Path, demo_records: Path):
    by_name = {r[schema.FILENAME].decode(): r for r in _read_all(demo_records)}
    checked = Counter()
    for name, record in by_name.items():
        source_bytes = (demo_images / name).read_bytes()
        source = np.asarray(Image.open(io.BytesIO(source_bytes)).convert("RGB"), dtype=np.int16)
        stored = tf.io.decode_jpeg(record[schema.ENCODED], channels=3).numpy().astype(np.int16)
        assert stored.shape == source.shape
        assert (record[schema.HEIGHT], record[schema.WIDTH]) == source.shape[:2]
        if name.endswith(".png"):  # re-encoded once at quality 95, 4:2:0 chroma
            assert np.abs(stored - source).mean() < 4.0
            checked["png"] += 1
        elif Image.open(io.BytesIO(source_bytes)).mode == "RGB":
            assert record[schema.ENCODED] == source_bytes  # byte for byte
            assert np.abs(stored - source).mean() < 1.5  # TF vs Pillow decoder: same file, ±few levels
            checked["jpeg"] += 1
        else:  # grayscale JPEG → RGB JPEG
            assert np.abs(stored - source).mean() < 4.0
            checked["gray"] += 1
    assert checked["png"] and checked["jpeg"] and checked["gray"]


@pytest.mark.slow  # several processes
def test_two_workers_write_the_same_records(demo_images: Path, demo_records: Path, tmp_path: Path):
    write_tfrecords(demo_images, tmp_path, val_fraction=0.25, test_fraction=0.25, num_shards=2, workers=2)

    def key(r):
        return (r["split"], r[schema.FILENAME], r[schema.ENCODED])  # noqa: E704

    assert sorted(map(key, _read_all(tmp_path))) == sorted(map(key, _read_all(demo_records)))


def test_refuses_to_overwrite_without_flag(demo_images: Path, tmp_path: Path):
    write_tfrecords(demo_images, tmp_path, num_shards=1)
    before = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    with pytest.raises(UserError, match="--overwrite"):
        write_tfrecords(demo_images, tmp_path, num_shards=1)
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == before
    meta = write_tfrecords(demo_images, tmp_path, num_shards=2, overwrite=True)
    assert sorted(p.name for p in tmp_path.glob("*.tfrecord")) == sorted(n for s in meta["shards"].values() for n in s)


def test_two_converts_into_one_out_at_once_never_mix_and_the_later_one_replaces_nothing(
    demo_images: Path, tmp_path: Path, monkeypatch
):
    """Both said "wrote OUT": the second silently replaced the first's dataset, and installs that
    overlapped could leave one's val shard under the other's dataset.json."""
    other = Path(shutil.copytree(demo_images / "star", tmp_path / "other" / "star"))
    shutil.copytree(demo_images / "circle", other.parent / "circle")
    real = writer._run_tasks

    def another_convert_finishes_meanwhile(*args, **kwargs):
        monkeypatch.setattr(writer, "_run_tasks", real)  # the other convert runs as it would
        results = real(*args, **kwargs)
        write_tfrecords(other.parent, tmp_path / "out", num_shards=1)
        return results

    monkeypatch.setattr(writer, "_run_tasks", another_convert_finishes_meanwhile)
    with pytest.raises(UserError, match="another convert installed a dataset here while this one ran; nothing"):
        write_tfrecords(demo_images, tmp_path / "out", num_shards=1)
    assert read_labels(tmp_path / "out" / LABELS_FILE) == ["circle", "star"]  # the other's, whole
    assert [p.name for p in (tmp_path / "out").iterdir() if p.name.startswith(".")] == []  # no staging left
    monkeypatch.undo()
    with (
        storage.claimed(tmp_path / "out", "held"),  # as another convert's install holds it
        pytest.raises(UserError, match="another convert is installing its shards here; wait for it"),
    ):
        write_tfrecords(demo_images, tmp_path / "out", num_shards=1, overwrite=True)
    assert read_labels(tmp_path / "out" / LABELS_FILE) == ["circle", "star"]


def test_crash_mid_write_leaves_nothing_a_reader_would_pick_up(demo_images: Path, tmp_path: Path, monkeypatch):
    calls = Counter()
    real = writer.convert_image

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 20:
            raise RuntimeError("simulated crash")
        return real(*args, **kwargs)

    monkeypatch.setattr(writer, "convert_image", failing)
    with pytest.raises(RuntimeError, match="simulated crash"):
        write_tfrecords(demo_images, tmp_path / "out", workers=1)
    assert not (tmp_path / "out").exists()  # the OUT it created is gone with its staging folder


def test_bad_options_fail_before_writing(demo_images: Path, tmp_path: Path):
    for kwargs, message in [
        ({"num_shards": 0}, "--num-shards"),
        ({"max_side": 4}, "--max-side"),
        ({"workers": 0}, "--workers"),
    ]:
        with pytest.raises(UserError, match=message):
            write_tfrecords(demo_images, tmp_path / "o", **kwargs)
        assert not any((tmp_path / "o").glob("*.tfrecord"))


def test_out_inside_a_folder_src_is_refused_before_writing(demo_images: Path, tmp_path: Path):
    src = shutil.copytree(demo_images, tmp_path / "photos")
    with pytest.raises(UserError, match=f"^OUT {src / 'records'} is inside SRC {src}: a later convert of SRC would"):
        write_tfrecords(src, src / "records")  # the next convert of photos/ would read records/ as a class
    assert sorted(p.name for p in src.iterdir()) == sorted(p.name for p in demo_images.iterdir())


def test_a_class_whose_files_all_fail_to_convert_is_refused_and_no_out_is_left(demo_images: Path, tmp_path: Path):
    src = shutil.copytree(demo_images, tmp_path / "photos")
    (src / "notes").mkdir()
    for k in range(12):  # files, so the scan finds a class with photos in every split; none decodes
        (src / "notes" / f"{k}.txt").write_text("not a photo")
    out = tmp_path / "made" / "records"
    with pytest.raises(UserError, match=r"class 'notes' has no photo in split '\w+' that converts"):
        write_tfrecords(src, out, workers=1)
    assert not (tmp_path / "made").exists()  # the folders it created are gone
    (tmp_path / "kept").mkdir()
    with pytest.raises(UserError, match="class 'notes'"):
        write_tfrecords(src, tmp_path / "kept", workers=1)
    assert (tmp_path / "kept").is_dir() and not any((tmp_path / "kept").iterdir())  # the user's own folder stays


def test_a_file_name_that_is_not_utf8_is_converted_and_stored_as_its_bytes(demo_images: Path, tmp_path: Path):
    """An old camera roll's names (Latin-1 bytes on a UTF-8 system) ended convert in UnicodeEncodeError."""
    import os

    from app.data.pipeline import photo_index

    src = shutil.copytree(demo_images, tmp_path / "photos")
    photo = next((src / "circle").iterdir())
    try:
        photo.rename(os.fsdecode(bytes(src / "circle") + b"/caf\xe9.png"))
    except OSError:
        pytest.skip("this file system takes UTF-8 names only")
    out = tmp_path / "records"
    write_tfrecords(src, out, workers=1)
    stored = {name for _, name, _ in photo_index(load_dataset_info(out))}
    assert "circle/caf\udce9.png" in stored
    assert (src / "circle" / "caf\udce9.png").exists()  # the stored name is the file's


@pytest.mark.parametrize("where", ["local", "url"])
def test_split_writers_produce_the_same_records_as_one_writer(
    demo_images: Path, demo_records: Path, tmp_path: Path, where: str
):
    """`url` writes through tf.io.gfile to TensorFlow's in-memory file system (ram://), the
    code path gs:// takes, without a network."""
    from app.data.merge import merge_writers

    out = str(tmp_path / "split") if where == "local" else f"ram://{tmp_path.name}/split"
    for index in (1, 0):  # any order
        write_tfrecords(
            demo_images,
            out,
            val_fraction=0.25,
            test_fraction=0.25,
            num_shards=2,
            workers=1,
            num_writers=2,
            writer_index=index,
        )
        if index == 1:
            assert not storage.exists(storage.join(out, schema.METADATA_FILE))
            missing = "writer 0 of 2 has not finished (no dataset.writer-00000-of-00002.json): "
            with pytest.raises(UserError, match=re.escape(missing + "run the same convert with --writer-index 0, ")):
                merge_writers(out)
    merged = merge_writers(out)
    with pytest.raises(UserError, match=r"already one dataset \(dataset.json\): nothing to merge$"):
        merge_writers(out)  # run twice: the parts are merged
    with pytest.raises(UserError, match=r"split-nowhere: no such folder$"):
        merge_writers(out + "-nowhere")
    with pytest.raises(UserError, match=r"files to merge \(convert --num-writers N writes them\)$"):
        merge_writers(demo_images)
    single = json.loads((demo_records / schema.METADATA_FILE).read_text())
    assert merged["counts"] == single["counts"] and merged["shards"] == single["shards"]
    assert sorted(s["path"] for s in merged["skipped"]) == sorted(s["path"] for s in single["skipped"])

    def key(r):
        return (r["split"], r[schema.FILENAME], r[schema.ENCODED])  # noqa: E704

    assert sorted(map(key, _read_all(out))) == sorted(map(key, _read_all(demo_records)))
    with pytest.raises(UserError, match="--writer-index"):
        write_tfrecords(demo_images, tmp_path / "x", num_writers=2, writer_index=2)


def test_a_merge_with_writers_missing_names_them(demo_images: Path, tmp_path: Path):
    from app.data.merge import merge_writers

    out = tmp_path / "split"
    write_tfrecords(
        demo_images, out, val_fraction=0.25, test_fraction=0.25, num_shards=3, num_writers=3, writer_index=1
    )
    with pytest.raises(
        UserError, match=r": writers 0, 2 of 3 have not finished \(no dataset\.writer-\*\.json of theirs\)"
    ):
        merge_writers(out)
    assert not (out / "dataset.json").exists()


def test_url_output_feeds_the_training_pipeline(demo_images: Path, demo_records: Path, tmp_path: Path):
    out = f"ram://{tmp_path.name}/records"
    write_tfrecords(demo_images, out, val_fraction=0.25, test_fraction=0.25, num_shards=2, workers=1)
    assert not [n for n in storage.listdir(out) if n.startswith(".")]  # no staging dir or temp file left

    def labels(data, split):
        return Counter(int(y) for _, ys in make_eval_dataset(data, split=split, image_size=32) for y in ys)  # noqa: E704

    for split in ("train", "val", "test"):
        assert labels(out, split) == labels(demo_records, split)
    with pytest.raises(UserError, match="already holds"):
        write_tfrecords(demo_images, out, num_shards=2, workers=1)


def test_url_without_a_file_system_is_one_clear_error(demo_images: Path):
    with pytest.raises(UserError, match=r"OUT: TensorFlow has no file system for s3:// here \(s3:// needs"):
        write_tfrecords(demo_images, "s3://bucket/records")
    with pytest.raises(UserError, match="--data: TensorFlow has no file system for s3://"):
        load_dataset_info("s3://bucket/records")


def test_byte_identical_files_are_reported_and_dropped_on_request(tmp_path: Path):
    src = tmp_path / "photos"
    for split in ("train", "val"):
        for label, colour in (("red", (200, 30, 30)), ("blue", (30, 30, 200))):
            (src / split / label).mkdir(parents=True)
            for k in range(3):
                Image.new("RGB", (48, 40), tuple(c + 7 * k + (split == "val") for c in colour)).save(
                    src / split / label / f"{k}.png"
                )
    shutil.copy(src / "train" / "red" / "0.png", src / "val" / "red" / "leaked.png")  # a leak
    shutil.copy(src / "train" / "blue" / "1.png", src / "train" / "blue" / "again.png")  # a duplicate within train
    meta = write_tfrecords(src, tmp_path / "kept", num_shards=1, workers=1)
    assert sorted(map(sorted, meta["duplicates"]["exact_groups"])) == [
        ["train/blue/1.png", "train/blue/again.png"],
        ["train/red/0.png", "val/red/leaked.png"],
    ]
    assert meta["duplicates"]["leaks"] == 1 and meta["duplicates"]["leaked_images"] == {"val": 1, "test": 0}
    assert meta["counts"]["val"]["red"] == 4
    assert "WARNING: exact duplicates (byte-identical files): 2 group(s), 1 across splits (1 val" in format_summary(
        meta, "x"
    )
    dropped = write_tfrecords(src, tmp_path / "dropped", num_shards=1, workers=1, drop_duplicates=True)
    assert dropped["counts"]["val"]["red"] == 3 and dropped["counts"]["train"]["blue"] == 3
    assert sorted(s["path"] for s in dropped["skipped"]) == ["train/blue/again.png", "val/red/leaked.png"]


def test_strict_refuses_what_would_be_skipped_and_writes_nothing(demo_images: Path, tmp_path: Path):
    out = tmp_path / "strict"
    with pytest.raises(UserError, match=r"^--strict: star/empty.jpg: zero-byte file; nothing written$"):
        write_tfrecords(demo_images, out, strict=True)  # refused by the scan, before any conversion
    undecodable = tmp_path / "photos"
    for name in ("a", "b"):
        (undecodable / name).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (16, 16), (40 * i, 90, 30)).save(undecodable / name / f"{i}.jpg")
    (undecodable / "b" / "0.jpg").write_bytes(b"not a photo at all")
    with pytest.raises(UserError, match=r"^--strict: b/0.jpg: .*; nothing written$"):
        write_tfrecords(undecodable, out, strict=True, val_fraction=0.34)
    assert not out.exists() or not any(out.iterdir())
    assert write_tfrecords(undecodable, out, val_fraction=0.34)["skipped"][0]["path"] == "b/0.jpg"


def test_a_full_disk_mid_shard_is_one_line_and_the_same_command_then_finishes(
    demo_images: Path, tmp_path: Path, monkeypatch
):
    real, written = tf.io.TFRecordWriter, Counter()

    class FillingWriter(real):
        def write(self, record):
            written["n"] += 1
            if written["n"] > 20:  # a partial shard is on disk when the space runs out
                raise tf.errors.ResourceExhaustedError(None, None, "shard.tfrecord; No space left on device")
            super().write(record)

    out = tmp_path / "out"
    with monkeypatch.context() as patched:
        patched.setattr(tf.io, "TFRecordWriter", FillingWriter)
        with pytest.raises(UserError, match=rf"^{out}: no space left on the device; nothing half-written was kept"):
            write_tfrecords(demo_images, out, workers=1)
    assert not out.exists()  # no shard, no dataset.json, no staging folder: not even the OUT it created
    meta = write_tfrecords(demo_images, out, workers=1)
    assert load_dataset_info(out).shards == meta["shards"]


def test_workers_leave_ctrl_c_to_the_main_process_which_ends_them():
    """One Ctrl-C reaches every process of the terminal's group: each worker printed its own
    KeyboardInterrupt traceback (often from inside TensorFlow's import). Workers started under
    `_ctrl_c_ignored` ignore it, and the main process, whose handler is back, ends the pool."""
    import multiprocessing as mp
    import signal

    handler = signal.getsignal(signal.SIGINT)
    with writer._ctrl_c_ignored():
        pool = mp.get_context("spawn").Pool(1)
    with pool:
        assert pool.apply(signal.getsignal, (signal.SIGINT,)) == signal.SIG_IGN
    assert signal.getsignal(signal.SIGINT) is handler
