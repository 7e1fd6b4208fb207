"""Atomic writes: readers see the old content or the new, never half, and a failed write leaves nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from app import storage


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
