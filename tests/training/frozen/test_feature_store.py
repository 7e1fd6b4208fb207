"""The feature store: rows by content key, per space; added in shards, never rewritten; pruned by last use."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest

from app.run_dir import RunDir
from app.training.frozen import DiskRows, FeatureStore, store_root
from app.training.frozen import rows as rows_module
from app.training.frozen.rows import new_rows

SPACE = {"kind": "features", "backbone": "b", "weights": "w1", "view": 0}


def _rows(keys: list[int]) -> np.ndarray:
    return np.array([[k, 10 * k] for k in keys], np.float32)


def test_lookup_finds_rows_by_key_in_the_asked_order_and_says_which_are_missing(tmp_path: Path):
    store = FeatureStore(tmp_path)
    store.add(SPACE, np.array([30, 10, 20], np.int64), _rows([30, 10, 20]))
    found, rows = store.lookup(SPACE, np.array([20, 99, 10, 20], np.int64))
    assert found.tolist() == [True, False, True, True]
    assert rows.tolist() == _rows([20, 10, 20]).tolist()  # duplicates asked twice get the row twice
    assert store.lookup(SPACE, np.array([99, -5], np.int64))[0].tolist() == [False, False]
    assert store.lookup({**SPACE, "weights": "w2"}, np.array([10], np.int64)) == (pytest.approx([False]), None)


def test_a_lookup_reads_its_rows_a_chunk_at_a_time_into_the_room_it_is_given(tmp_path: Path, monkeypatch):
    """Found rows go where the caller says (rows.new_rows: a file where a run's rows are on disk),
    read from several shards a few rows at a time: never all of a space in memory at once."""
    monkeypatch.setattr(rows_module, "COPY_BYTES", 3 * 2 * 4)  # three rows a copy
    store = FeatureStore(tmp_path / "store")
    store.add(SPACE, np.arange(0, 20, 2, dtype=np.int64), _rows(list(range(0, 20, 2))))
    store.add(SPACE, np.arange(1, 20, 2, dtype=np.int64), _rows(list(range(1, 20, 2))))
    asked = np.array([19, 4, 7, 7, 100, 0, 12, 13], np.int64)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    found, rows = store.lookup(SPACE, asked, lambda count, shape, dtype: new_rows(count, shape, dtype, scratch))
    assert isinstance(rows, DiskRows) and found.tolist() == [True] * 4 + [False] + [True] * 3
    np.testing.assert_array_equal(rows[:], _rows([19, 4, 7, 7, 0, 12, 13]))
    np.testing.assert_array_equal(store.lookup(SPACE, asked)[1], rows[:])  # in memory by default: the same


def test_add_keeps_what_the_space_holds_and_the_first_row_of_a_key(tmp_path: Path):
    store = FeatureStore(tmp_path)
    store.add(SPACE, np.array([1, 2], np.int64), _rows([1, 2]))
    store.add(SPACE, np.array([2, 3], np.int64), _rows([5, 3]))  # key 2 again: the stored row stays
    found, rows = store.lookup(SPACE, np.array([1, 2, 3], np.int64))
    assert found.all() and rows.tolist() == _rows([1, 2, 3]).tolist()
    assert list(tmp_path.rglob(".tmp*")) == []  # written whole, then renamed


def test_an_add_writes_only_the_new_keys_and_leaves_what_is_stored_untouched(tmp_path: Path):
    store = FeatureStore(tmp_path)
    store.add(SPACE, np.arange(100, dtype=np.int64), _rows(list(range(100))))
    (first,) = _shard_files(tmp_path)
    before = {p: (p.stat().st_ino, p.stat().st_mtime_ns, p.read_bytes()) for p in first}
    store.add(SPACE, np.arange(90, 110, dtype=np.int64), _rows(list(range(90, 110))))
    first_again, second = _shard_files(tmp_path)
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns, p.read_bytes()) for p in first_again} == before
    assert np.load(second[0]).tolist() == list(range(100, 110))  # the keys it lacked, and only those
    found, rows = FeatureStore(tmp_path).lookup(SPACE, np.array([105, 3, 99], np.int64))
    assert found.all() and rows.tolist() == _rows([105, 3, 99]).tolist()


def test_rows_in_any_order_are_written_a_chunk_at_a_time_sorted_by_key(tmp_path: Path, monkeypatch):
    """A shard's rows are copied into its file a few at a time (never a second array of all of
    them), in its keys' sorted order, whatever order they came in."""
    from app.training.frozen import store as store_module

    monkeypatch.setattr(store_module, "WRITE_CHUNK", 3)
    keys = np.array([7, 3, 11, 5, 2, 13, 3, 1], np.int64)  # 3 twice: its first row is kept
    rows = _rows(keys.tolist()) + np.arange(len(keys), dtype=np.float32)[:, None]  # a row for each position
    FeatureStore(tmp_path).add(SPACE, keys, rows)
    ((keys_file, rows_file),) = _shard_files(tmp_path)
    assert np.load(keys_file).tolist() == [1, 2, 3, 5, 7, 11, 13]
    assert np.load(rows_file).tolist() == rows[[7, 4, 1, 3, 0, 2, 5]].tolist()


@pytest.mark.parametrize(
    "scale, kept",
    [(1.0, np.float16), (1e4, np.float16), (0.01, np.float32), (1e6, np.float32)],
    ids=["activations", "large", "tiny", "beyond_float16"],
)
def test_float32_rows_are_kept_in_float16_where_it_holds_them_and_read_back_as_float32(
    tmp_path: Path, scale: float, kept: type
):
    """Half the disk: a shard whose largest value lies where float16 keeps every value within
    2^-11 of it is written in float16; a lookup answers float32. Rows too small (a random
    backbone's activations) or too large for float16 stay float32, exactly."""
    rows = (np.random.default_rng(0).standard_normal((300, 4, 4, 8)) * scale / 4).astype(np.float32)
    rows[0, 0, 0, 0] = scale  # the shard's largest magnitude
    store = FeatureStore(tmp_path)
    store.add(SPACE, np.arange(300, dtype=np.int64), rows)
    (files,) = _shard_files(tmp_path)
    on_disk = np.load(files[1], mmap_mode="r")
    assert on_disk.dtype == kept and on_disk.nbytes == rows.size * np.dtype(kept).itemsize
    found, read = store.lookup(SPACE, np.arange(299, -1, -1, dtype=np.int64))
    assert found.all() and read.dtype == np.float32
    np.testing.assert_allclose(read[::-1], rows, rtol=2**-11 if kept == np.float16 else 0, atol=2**-25 * scale)
    if kept == np.float32:
        np.testing.assert_array_equal(read[::-1], rows)


def test_two_runs_adding_to_one_space_both_keep_their_rows(tmp_path: Path):
    one, other = FeatureStore(tmp_path), FeatureStore(tmp_path)
    one.add(SPACE, np.array([1, 2], np.int64), _rows([1, 2]))
    other.add(SPACE, np.array([3], np.int64), _rows([3]))
    found, rows = one.lookup(SPACE, np.array([3, 1, 2], np.int64))
    assert found.all() and rows.tolist() == _rows([3, 1, 2]).tolist()


def _shard_files(root: Path) -> list[tuple[Path, Path]]:
    """(keys, rows) files of each shard, oldest first."""
    return [(k, k.with_name(k.name.replace(".keys.npy", ".rows.npy"))) for k in sorted(root.glob("*/*.keys.npy"))]


def test_a_space_in_the_older_one_file_layout_is_read_into_shards_once(tmp_path: Path):
    """Stores written before shards hold one npz per space (some with `seconds_per_row` too)."""
    digest = hashlib.sha256(json.dumps(SPACE, sort_keys=True).encode()).hexdigest()[:24]
    old = tmp_path / f"features-{digest}.npz"
    with open(old, "wb") as f:
        np.savez(f, space=json.dumps(SPACE, sort_keys=True), keys=np.array([1, 2], np.int64), rows=_rows([1, 2]),
                 seconds_per_row=np.float64(0.25))  # fmt: skip
    found, rows = FeatureStore(tmp_path).lookup(SPACE, np.array([2, 3], np.int64))
    assert found.tolist() == [True, False] and rows.tolist() == _rows([2]).tolist()
    assert not old.exists() and len(_shard_files(tmp_path)) == 1


def test_an_unreadable_shard_is_said_and_treated_as_empty_then_replaced(tmp_path: Path, caplog):
    store = FeatureStore(tmp_path)
    store.add(SPACE, np.array([1], np.int64), _rows([1]))
    ((_, rows_file),) = _shard_files(tmp_path)
    rows_file.write_bytes(rows_file.read_bytes()[:40])  # cut short, as a full disk would leave a copy made by hand
    with caplog.at_level(logging.WARNING):
        assert store.lookup(SPACE, np.array([1], np.int64))[0].tolist() == [False]
    assert "cannot be read" in caplog.text and rows_file.name.replace(".rows.npy", "") in caplog.text
    store.add(SPACE, np.array([2], np.int64), _rows([2]))
    assert store.lookup(SPACE, np.array([1, 2], np.int64))[0].tolist() == [False, True]


def test_past_its_limit_the_least_recently_used_spaces_go(tmp_path: Path):
    store = FeatureStore(tmp_path, limit=3000)
    spaces = [{**SPACE, "view": view} for view in range(3)]
    for age, space in enumerate(spaces):
        before = set(tmp_path.iterdir())
        store.add(space, np.arange(100, dtype=np.int64), np.zeros([100, 2], np.float32))  # ~2 KB each
        (folder,) = set(tmp_path.iterdir()) - before
        os.utime(folder, (1e9 + age, 1e9 + age))  # each used after the one before
    remaining = store.lookup(spaces[0], np.array([1], np.int64))[0], store.lookup(spaces[2], np.array([1], np.int64))[0]
    assert remaining[0].tolist() == [False] and remaining[1].tolist() == [True]  # the oldest went, the newest stays


def test_the_store_is_the_users_cache_unless_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    run = RunDir(tmp_path / "run")
    monkeypatch.setenv("PHOTOCLF_CACHE_DIR", str(tmp_path / "mine"))
    assert store_root("auto", run) == tmp_path / "mine" / "features"
    monkeypatch.delenv("PHOTOCLF_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert store_root("auto", run) == tmp_path / "xdg" / "photoclf" / "features"
    assert store_root("run", run) == run.feature_store
    assert store_root(str(tmp_path / "there"), run) == tmp_path / "there"


def test_files_of_the_older_layout_count_against_the_limit_and_go_first_when_unused(tmp_path: Path):
    old = tmp_path / "features-000000000000000000000000.npz"  # a space no run has read since
    old.write_bytes(b"x" * 2000)
    os.utime(old, (1e9, 1e9))
    store = FeatureStore(tmp_path, limit=3000)
    store.add(SPACE, np.arange(100, dtype=np.int64), np.zeros([100, 2], np.float32))  # ~2 KB
    assert not old.exists() and store.lookup(SPACE, np.array([1], np.int64))[0].tolist() == [True]


def test_pruning_never_touches_what_is_not_the_stores(tmp_path: Path):
    mine = tmp_path / "my-notes.npz", tmp_path / "photos"
    mine[0].write_bytes(b"x" * 5000)
    (mine[1] / "a.jpg").parent.mkdir()
    (mine[1] / "a.jpg").write_bytes(b"y" * 5000)
    for path in (*mine, mine[1] / "a.jpg"):
        os.utime(path, (1e9, 1e9))
    FeatureStore(tmp_path, limit=3000).add(SPACE, np.arange(100, dtype=np.int64), np.zeros([100, 2], np.float32))
    assert mine[0].read_bytes() == b"x" * 5000 and (mine[1] / "a.jpg").read_bytes() == b"y" * 5000
