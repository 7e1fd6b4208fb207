"""Atomic writes: readers see the old content or the new, never half, and a failed write leaves nothing."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from app import storage
from app.errors import UserError


@pytest.mark.parametrize("base", ["local", "url"])
def test_atomic_write_replaces_whole_or_not_at_all(tmp_path: Path, base: str):
    folder = str(tmp_path) if base == "local" else f"ram://{tmp_path.name}-atomic"
    storage.makedirs(folder)
    path = storage.join(folder, "data.json")
    storage.write_text_atomic(path, "old")
    with pytest.raises(RuntimeError), storage.atomic_path(path) as tmp:
        storage.write_bytes_atomic(tmp, b"half")  # whatever was written to the temp name...
        raise RuntimeError("killed mid-write")
    assert storage.read_text(path) == "old"  # ...never reaches the real name
    assert storage.listdir(folder) == ["data.json"]  # and no temp file is left behind
    storage.write_json_atomic(path, {"new": 1})
    assert storage.read_text(path) == '{\n  "new": 1\n}\n'
    assert storage.listdir(folder) == ["data.json"]


def test_temp_name_keeps_the_suffixes_writers_check(tmp_path: Path):
    with storage.atomic_path(tmp_path / "best.weights.h5") as tmp:
        assert tmp.endswith(".weights.h5") and Path(tmp).name.startswith(".")  # hidden until renamed
        Path(tmp).write_bytes(b"x")
    assert (tmp_path / "best.weights.h5").read_bytes() == b"x"


def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def _half_then_no_space(data, f, **kwargs):
    f.write('{"accu')
    _no_space()


def test_a_full_disk_is_one_line_naming_the_file_and_keeps_the_old_content(tmp_path: Path, monkeypatch):
    report = tmp_path / "metrics.json"
    storage.write_json_atomic(report, {"accuracy": 0.5})
    with monkeypatch.context() as patched:
        patched.setattr(storage.json, "dump", _half_then_no_space)  # the disk fills while the new content is written
        with pytest.raises(UserError, match=rf"^{report}: no space left on the device; nothing half-written"):
            storage.write_json_atomic(report, {"accuracy": 0.9})
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]  # no temp file left
    assert json.loads(report.read_text()) == {"accuracy": 0.5}
    storage.write_json_atomic(report, {"accuracy": 0.9})  # space is back: the same call completes
    assert json.loads(report.read_text()) == {"accuracy": 0.9}


def test_tensorflows_words_for_a_full_disk_count_too():
    assert storage.is_out_of_space(RuntimeError("/tmp/x.tfrecord; No space left on device"))
    assert storage.is_out_of_space(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert not storage.is_out_of_space(OSError(errno.EACCES, "Permission denied"))


def test_an_output_folder_that_is_or_lies_under_a_file_is_refused_naming_the_flag(tmp_path: Path):
    (tmp_path / "notes").write_text("a file")
    for folder in (tmp_path / "notes", tmp_path / "notes" / "a" / "b"):
        with pytest.raises(UserError, match=f"^--report {folder}: {tmp_path / 'notes'} is a file, not a folder$"):
            storage.check_output_folder(folder, "--report")
    storage.check_output_folder(tmp_path / "new" / "deeper", "--report")  # created later, by the write
    storage.check_output_folder(tmp_path, "--report")
    storage.check_output_folder("gs://bucket/notes", "--report")  # left to the write
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes"]  # the checks leave nothing behind


def test_an_output_file_needs_an_existing_folder_and_must_not_be_one(tmp_path: Path):
    (tmp_path / "notes").write_text("a file")
    cases = {
        tmp_path / "missing" / "out.csv": f"folder {tmp_path / 'missing'} does not exist",
        tmp_path / "notes" / "out.csv": f"{tmp_path / 'notes'} is a file, not a folder",
        tmp_path: "is a folder; give the file to write",
    }
    for path, reason in cases.items():
        with pytest.raises(UserError, match=f"^--output {path}: {reason}"):
            storage.check_output_file(path, "--output")
    storage.check_output_file(tmp_path / "out.csv", "--output")
    storage.check_output_file(tmp_path / "notes", "--output")  # an existing file is replaced whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes"]  # the check leaves nothing behind


def test_an_output_file_in_a_folder_that_refuses_files_is_refused_before_the_work(tmp_path: Path, monkeypatch):
    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "touch", refuse)  # a read-only folder, as root too (root ignores chmod)
    with pytest.raises(
        UserError, match=f"^--output {tmp_path / 'out.csv'}: cannot write in {tmp_path} \\(Permission denied\\)$"
    ):
        storage.check_output_file(tmp_path / "out.csv", "--output")
