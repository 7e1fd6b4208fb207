"""Backbone outputs kept across runs, keyed by each photo's content.

A frozen backbone maps a given photo (and a given augmented view of it) to the same output in
every run, so a run over a dataset that grew, or one started from an earlier run, needs the
backbone only for photos it has not seen. The store keeps those outputs by content key
(`app.data.keyed.content_keys`: the photo's bytes, not its name) in spaces: one file per kind of
output (pooled features, or activations where phase 2's trained layers begin) of one backbone
with given weights, image size, decode and view.

Layout, ROOT/<space id>.npz: `space` (what decides the rows, JSON), `keys` (int64, sorted,
unique) and `rows`. Files are replaced atomically; two runs adding to one space at once keep the last one's
rows (the other's are computed again when next needed). Past `STORE_LIMIT` bytes the least
recently used spaces are removed.

`load_or_compute` is the audit's cache of its embeddings: one npz file per audit, with the key
it was computed for.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from app import storage
from app.run_dir import RunDir

log = logging.getLogger(__name__)
STORE_LIMIT = 20 * 2**30  # bytes on disk before the least recently used spaces go
RUN_STORE = "run"  # the feature_store setting that keeps the store in the run dir


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
        self._last_read: dict[Path, tuple[tuple[int, int], np.ndarray, np.ndarray]] = {}  # by (mtime, size)

    def lookup(self, space: dict, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """(found [N] bool, rows [found.sum(), ...] for the found keys, in `keys`' order) from
        `space`; rows is None when the space holds none of them."""
        with contextlib.suppress(FileNotFoundError):
            os.utime(self._path(space))  # recently used: pruned last (before reading, so `add` finds it read)
        stored_keys, rows = self._read(space)
        if stored_keys is None or not len(stored_keys):
            return np.zeros(len(keys), bool), None
        where = np.minimum(np.searchsorted(stored_keys, keys), len(stored_keys) - 1)
        found = stored_keys[where] == keys
        return found, (rows[where[found]] if found.any() else None)

    def add(self, space: dict, keys: np.ndarray, rows: np.ndarray) -> None:
        """Add rows (keyed like `lookup`'s) to `space`, keeping what it holds."""
        if not len(keys):
            return
        old_keys, old_rows = self._read(space)
        if old_keys is not None:
            keys, rows = np.concatenate([old_keys, keys]), np.concatenate([old_rows, rows])
        unique_keys, first = np.unique(keys, return_index=True)
        path = self._path(space)
        self.root.mkdir(parents=True, exist_ok=True)
        with storage.atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.savez(f, space=json.dumps(space, sort_keys=True), keys=unique_keys, rows=rows[first])
        self._prune(keep=path)

    def _read(self, space: dict) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The space's (keys, rows), or (None, None) when it has no file or one that cannot be read
        (said once; its rows are computed again and the file replaced)."""
        path = self._path(space)
        if not path.exists():
            return None, None
        try:
            stamp = (path.stat().st_mtime_ns, path.stat().st_size)
            if path in self._last_read and self._last_read[path][0] == stamp:
                return self._last_read[path][1:]  # read by `lookup`, again by `add`: once from disk
            with np.load(path) as stored:
                if json.loads(str(stored["space"])) != json.loads(json.dumps(space)):
                    return None, None  # two spaces whose names collide: the other is replaced
                self._last_read[path] = (stamp, stored["keys"], stored["rows"])
                return self._last_read[path][1:]
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
            log.warning("feature store: %s cannot be read (%s); its rows are computed again", path, err)
            return None, None

    def _path(self, space: dict) -> Path:
        digest = hashlib.sha256(json.dumps(space, sort_keys=True).encode()).hexdigest()[:24]
        return self.root / f"{space.get('kind', 'rows')}-{digest}.npz"

    def _prune(self, keep: Path) -> None:
        """Remove the least recently used spaces while the store is over its limit."""
        files = sorted(self.root.glob("*.npz"), key=lambda p: p.stat().st_mtime)
        total = sum(p.stat().st_size for p in files)
        for path in files:
            if total <= self.limit:
                break
            if path != keep:
                total -= path.stat().st_size
                path.unlink(missing_ok=True)
                log.info("feature store: removed %s (least recently used; the store keeps %d GiB)", path,
                         self.limit // 2**30)  # fmt: skip


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
