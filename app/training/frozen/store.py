"""Backbone outputs kept across runs, keyed by each photo's content.

A frozen backbone maps a given photo (and a given augmented view of it) to the same output in
every run, so a run over a dataset that grew, or one started from an earlier run, needs the
backbone only for photos it has not seen. The store keeps those outputs by content key
(`app.data.keyed.content_keys`: the photo's bytes, not its name) in spaces: one folder per kind
of output (pooled features, or activations where phase 2's trained layers begin) of one backbone
with given weights, image size, decode and view.

Layout, ROOT/<kind>-<space id>/: `space.json` (what decides the rows) and shards, each a pair
`<n>.keys.npy` (int64, sorted, unique) and `<n>.rows.npy`, named by when they were written. An
add writes one new shard of the keys the space lacks, never rewriting the others; a lookup reads
the shards' keys and only the rows it found, a chunk at a time, so neither loads a space whole. Each
file is written under a temporary name and renamed; a shard counts once its keys file is there.
Two runs adding to one space at once both keep their rows. Past `STORE_LIMIT` bytes the least
recently used spaces are removed. A space in the older one-file layout (`<kind>-<id>.npz`) is
read once into a shard of the new one.

Float32 rows are kept in float16 (half the disk; a lookup gives float32 back) where a shard's
largest value lies in `HALF_RANGE`: there float16's spacing is at most 2^-11 of a value, and a
value small enough to lose more beside the largest is one the next layers cannot see. Outside it
(the tiny activations of a randomly initialised backbone, or values float16 cannot hold) they
stay float32.

`load_or_compute` is the audit's cache of its embeddings: one npz file per audit, with the key
it was computed for.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from app import storage
from app.run_dir import RunDir
from app.training.frozen.rows import DiskRows, copy_rows

log = logging.getLogger(__name__)
STORE_LIMIT = 20 * 2**30  # bytes on disk before the least recently used spaces go
RUN_STORE = "run"  # the feature_store setting that keeps the store in the run dir
KEYS, ROWS = ".keys.npy", ".rows.npy"
WRITE_CHUNK = 1024  # rows copied into a shard's file at a time
HALF_RANGE = (1.0, 6.0e4)  # a shard's largest magnitude for which its float32 rows are kept in float16


def store_root(setting: str, run: RunDir) -> Path:
    """The store's folder for the `feature_store` config value: `auto` → $PHOTOCLF_CACHE_DIR,
    else $XDG_CACHE_HOME/photoclf, else ~/.cache/photoclf (then /features); `run` → inside the
    run dir (nothing shared between runs); anything else is the folder itself."""
    if setting == RUN_STORE:
        return run.feature_store
    if setting != "auto":
        return Path(setting).expanduser()
    return storage.cache_root() / "features"


class FeatureStore:
    def __init__(self, root: Path, limit: int = STORE_LIMIT) -> None:
        self.root, self.limit = root, limit

    def lookup(self, space: dict, keys: np.ndarray, room: Callable | None = None) -> tuple[np.ndarray, object | None]:
        """(found [N] bool, rows [found.sum(), ...] for the found keys, in `keys`' order) from
        `space`; rows is None when the space holds none of them. `room(count, row_shape, dtype)`
        gives where the rows go (in memory by default; rows.new_rows on disk); they are read into
        it a chunk at a time, from the shards' files, never all at once."""
        folder = self._folder(space)
        if not folder.is_dir():
            return np.zeros(len(keys), bool), None
        with contextlib.suppress(OSError):  # a store others share read-only is still read
            os.utime(folder)  # recently used: pruned last
        found, parts = np.zeros(len(keys), bool), []
        for shard, stored in self._shards(folder):
            where, held = _held(stored, keys)
            new = ~found & held
            if new.any() and (rows := _shard_rows(shard, len(stored))) is not None:
                parts.append((np.flatnonzero(new), rows, where[new]))
                found |= new
        if not parts:
            return found, None
        place = np.cumsum(found) - 1  # a found key's place among the found, in `keys`' order
        first = parts[0][1]
        dtype = np.float32 if first.dtype == np.float16 else first.dtype  # float16: kept so on disk only
        out = (room or _in_memory)(int(found.sum()), first.shape[1:], dtype)
        for at, rows, where in parts:
            copy_rows(out, place[at], rows, where)
        return found, out

    def add(self, space: dict, keys: np.ndarray, rows: np.ndarray) -> None:
        """Add rows (keyed like `lookup`'s) to `space`: one new shard of the keys it lacks (the
        first row of a key asked twice)."""
        keys, first = np.unique(keys, return_index=True)
        folder = self._folder(space)
        for _, stored in self._shards(folder) if folder.is_dir() else ():
            lacking = ~_held(stored, keys)[1]
            keys, first = keys[lacking], first[lacking]
        if not len(keys):
            return
        folder.mkdir(parents=True, exist_ok=True)
        if not (folder / "space.json").exists():
            storage.write_json_atomic(folder / "space.json", space)
        _write_shard(folder / f"{time.time_ns():020d}-{os.getpid()}", keys, rows, first)
        self._prune(keep=folder)

    def _shards(self, folder: Path) -> list[tuple[Path, np.ndarray]]:
        """(shard, its keys) of each complete shard, oldest first; a shard whose keys cannot be read
        is said and removed (its rows are computed again)."""
        shards = []
        for keys_file in sorted(folder.glob("[!.]*" + KEYS)):  # not another writer's temporary file
            shard = keys_file.with_name(keys_file.name[: -len(KEYS)])
            try:
                shards.append((shard, np.load(keys_file)))
            except (OSError, ValueError, EOFError) as err:
                _remove_broken(shard, err)
        return [(shard, stored) for shard, stored in shards if len(stored)]

    def _folder(self, space: dict) -> Path:
        digest = hashlib.sha256(json.dumps(space, sort_keys=True).encode()).hexdigest()[:24]
        folder = self.root / f"{space.get('kind', 'rows')}-{digest}"
        _adopt_single_file(folder.with_suffix(".npz"), folder, space)
        return folder

    def _prune(self, keep: Path) -> None:
        """Remove the least recently used spaces (folders, or files of the older layout not read
        since) while the store is over its limit."""
        spaces = sorted((p for p in self.root.iterdir() if _is_space(p)), key=lambda p: p.stat().st_mtime)
        sizes = {p: sum(f.stat().st_size for f in p.iterdir()) if p.is_dir() else p.stat().st_size for p in spaces}
        total = sum(sizes.values())
        for space in spaces:
            if total <= self.limit:
                break
            if space != keep:
                total -= sizes[space]
                if space.is_dir():
                    shutil.rmtree(space, ignore_errors=True)
                else:
                    space.unlink(missing_ok=True)
                log.info("feature store: removed %s (least recently used; the store keeps %d GiB)", space,
                         self.limit // 2**30)  # fmt: skip


def _is_space(path: Path) -> bool:
    """A space's folder, or a space's file of the older layout: nothing else in the folder (a
    user may point `feature_store` at one that holds other files) is ever removed."""
    if path.is_dir():
        return (path / "space.json").is_file()
    return path.suffix == ".npz" and re.fullmatch(r"[a-z_]+-[0-9a-f]{24}", path.stem) is not None


def _held(stored: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(where each key would sit in the sorted `stored`, whether it is there)."""
    where = np.minimum(np.searchsorted(stored, keys), len(stored) - 1)
    return where, stored[where] == keys


def _write_shard(shard: Path, keys: np.ndarray, rows: np.ndarray, order: np.ndarray | None = None) -> None:
    """`rows[order]` (all of them, in order, without `order`), then the keys: a shard counts once
    its keys file is there, so it is whole. The rows are written a chunk at a time, never copied
    into a second array of them all nor mapped (a written map's pages count in the process's
    memory until it is closed)."""
    order = np.arange(len(rows)) if order is None else order
    with storage.atomic_path(shard.with_name(shard.name + ROWS)) as tmp, open(tmp, "wb") as f:
        dtype = _disk_dtype(rows, order) if len(order) else np.dtype(rows.dtype)
        header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
                  "shape": (len(order), *rows.shape[1:])}  # fmt: skip
        np.lib.format.write_array_header_2_0(f, header)
        for start in range(0, len(order), WRITE_CHUNK):
            f.write(np.ascontiguousarray(rows[order[start : start + WRITE_CHUNK]], dtype).tobytes())
    with storage.atomic_path(shard.with_name(shard.name + KEYS)) as tmp, open(tmp, "wb") as f:
        np.save(f, keys.astype(np.int64))


def _disk_dtype(rows: np.ndarray, order: np.ndarray) -> np.dtype:
    """float16 for float32 rows whose largest magnitude lies in HALF_RANGE, else their own dtype."""
    if rows.dtype != np.float32:
        return rows.dtype
    largest = max(float(np.abs(rows[order[i : i + WRITE_CHUNK]]).max()) for i in range(0, len(order), WRITE_CHUNK))
    return np.dtype(np.float16) if HALF_RANGE[0] <= largest <= HALF_RANGE[1] else rows.dtype


def _shard_rows(shard: Path, count: int) -> DiskRows | None:
    """A shard's `count` rows, read as they are indexed; None (said, and the shard removed) when
    its file cannot be read or does not hold them."""
    try:
        rows = DiskRows.npy(shard.with_name(shard.name + ROWS))
        if len(rows) != count:
            raise ValueError(f"{len(rows)} rows for {count} keys")
        return rows
    except (OSError, ValueError, EOFError) as err:
        _remove_broken(shard, err)
        return None


def _in_memory(count: int, row_shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return np.empty((count, *row_shape), dtype)


def _remove_broken(shard: Path, err: Exception) -> None:
    log.warning("feature store: %s cannot be read (%s); its rows are computed again", shard, err)
    for suffix in (KEYS, ROWS):
        shard.with_name(shard.name + suffix).unlink(missing_ok=True)


def _adopt_single_file(path: Path, folder: Path, space: dict) -> None:
    """A space in the older one-file layout becomes the first shard of its folder (once)."""
    if not path.exists():
        return
    try:
        with np.load(path) as stored:
            if json.loads(str(stored["space"])) == json.loads(json.dumps(space)):
                keys, rows = stored["keys"], stored["rows"]
                folder.mkdir(parents=True, exist_ok=True)
                storage.write_json_atomic(folder / "space.json", space)
                _write_shard(folder / f"{0:020d}-adopted", keys, rows)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
        log.warning("feature store: %s cannot be read (%s); its rows are computed again", path, err)
    path.unlink(missing_ok=True)


def weights_fingerprint(model) -> str:
    """sha256 of the backbone's weight values: the same file replaced in place is a change too."""
    digest = hashlib.sha256()
    for weight in model.weights:
        digest.update(np.ascontiguousarray(weight.numpy()).tobytes())
    return digest.hexdigest()


def load_or_compute(
    path: Path, key: dict, compute: Callable[[], dict[str, np.ndarray]], what: str
) -> dict[str, np.ndarray]:
    """Arrays stored in `path` (npz) with the `key` they were computed for: reused when the key
    matches, recomputed (and stored atomically) when it does not. The audit's embeddings use it."""
    if path.exists():
        with np.load(path) as stored:
            if json.loads(str(stored["key"])) == key:
                log.info("%s: reusing %s", what, path)
                return {name: stored[name] for name in stored.files if name != "key"}
        log.info("%s: %s was made for other data or settings; recomputing it", what, path)
    arrays = compute()
    with storage.atomic_path(path) as tmp:
        np.savez(tmp, key=json.dumps(key), **arrays)
    return arrays
