"""The model a server is serving: the newest version under a TF Serving model folder, hot-swapped.

Each version is loaded into the runtime the server was started with (app.inference.runtime);
with `--runtime litert` a new version whose LiteRT check failed is not swapped in (logged).

A background thread polls for new numeric version folders and loads a new one completely
before swapping it in, once its files match the sizes and SHA-256 sums the exporter listed and
every asset its SavedModel names is there (a version still being copied, or damaged, is refused
and the last good one keeps serving); requests already running keep the version they started
with, so a swap drops nothing. Folders whose names are not numbers (the exporter's hidden temp
dirs) are ignored.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from app.errors import UserError
from app.export import layout
from app.inference.runtime import HostRuntime, TFRuntime, load_runtime

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedModel:
    version: int
    path: Path
    runtime: TFRuntime | HostRuntime

    @property
    def signatures(self) -> dict:
        """name → (input specs, output specs)"""
        return self.runtime.signatures()

    def metadata(self) -> dict:
        return layout.read_metadata(self.path)


class ModelStore:
    def __init__(
        self, base: Path, poll_seconds: float = 2.0, runtime: str = "auto", litert_mode: str = "float32"
    ) -> None:
        self.base = Path(base)
        self.runtime, self.litert_mode = runtime, litert_mode
        self.name = self.base.name
        versions = layout.served_versions(self.base)
        self._lock = threading.Lock()
        self._refused: dict[int, tuple] = {}  # version → its files when it failed to load
        self._current = self._load_newest_whole(versions)
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, args=(poll_seconds,), daemon=True, name="model-poller")

    def _load(self, version: int) -> LoadedModel:
        path = self.base / str(version)
        problem = layout.incomplete_file(path)  # e.g. a truncated saved_model.pb LiteRT would not notice
        if problem:
            raise UserError(f"{path}: not as exported: {problem}")
        model = LoadedModel(version, path, load_runtime(path, self.runtime, self.litert_mode))
        log.info("loaded %s version %d (runtime %s)", self.name, version, model.runtime.name)
        return model

    def _load_newest_whole(self, versions: list[int]) -> LoadedModel:
        """At start: the newest version not being copied or damaged (said in the log), else the
        newest one's reason as the error."""
        first_problem = None
        for version in reversed(versions):
            try:
                return self._load(version)
            except UserError as err:
                first_problem = first_problem or err
                self._refused[version] = _files_state(self.base / str(version))
                log.warning("not serving version %d: %s", version, err)
        raise first_problem

    @property
    def current(self) -> LoadedModel:
        with self._lock:
            return self._current

    def start(self) -> None:
        self._poller.start()

    def stop(self) -> None:
        self._stop.set()

    def _poll(self, seconds: float) -> None:
        while not self._stop.wait(seconds):
            try:
                self.poll_once()
            except Exception:  # e.g. a file removed while it was listed: the next poll sees the folder again
                log.exception("could not read %s; still serving %d", self.base, self.current.version)

    def poll_once(self) -> None:
        """Swap in the newest version if it is newer and loads. One that fails (broken, or still
        being copied) is logged once and tried again only when its files change, so a broken
        version costs one load, not one every poll."""
        newest = max(layout.versions(self.base), default=0)
        if newest <= self.current.version:
            return
        files = _files_state(self.base / str(newest))
        if self._refused.get(newest) == files:
            return
        try:
            loaded = self._load(newest)  # fully loaded before anyone sees it
        except Exception:  # a half-copied or broken version must not kill the server
            self._refused[newest] = files
            log.exception("could not load %s version %d; still serving %d", self.base, newest, self.current.version)
            return
        with self._lock:
            self._current = loaded


def _files_state(folder: Path) -> tuple:
    """(relative path, size, mtime) of every file under `folder`: what changes while it is copied."""
    return tuple(
        sorted(
            (str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns)
            for p in folder.rglob("*")
            if p.is_file()
        )
    )
