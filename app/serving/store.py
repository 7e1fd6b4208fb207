"""The model a server is serving: the newest version under a TF Serving model folder, hot-swapped.

A background thread polls for new numeric version folders and loads a new one completely
before swapping it in; requests already running keep the version they started with, so a swap
drops nothing. Folders whose names are not numbers (the exporter's hidden temp dirs) are ignored.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path

import tensorflow as tf

from app.errors import UserError
from app.export import layout

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedModel:
    version: int
    path: Path
    module: object

    @property
    def signatures(self) -> dict:
        return dict(self.module.signatures)

    def metadata(self) -> dict:
        return layout.read_metadata(self.path)


class ModelStore:
    def __init__(self, base: Path, poll_seconds: float = 2.0) -> None:
        self.base = Path(base)
        self.name = self.base.name
        if not self.base.is_dir():
            raise UserError(f"{self.base}: no such model folder (expected EXPORT_DIR/<name> with version subfolders)")
        versions = layout.versions(self.base)
        if not versions:
            raise UserError(f"{self.base}: no version folders holding a saved_model.pb")
        self._lock = threading.Lock()
        self._current = self._load(versions[-1])
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, args=(poll_seconds,), daemon=True, name="model-poller")

    def _load(self, version: int) -> LoadedModel:
        path = self.base / str(version)
        model = LoadedModel(version, path, tf.saved_model.load(str(path)))
        log.info("loaded %s version %d", self.name, version)
        return model

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
                newest = max(layout.versions(self.base), default=0)
                if newest > self.current.version:
                    loaded = self._load(newest)  # fully loaded before anyone sees it
                    with self._lock:
                        self._current = loaded
            except Exception:  # a half-copied or broken version must not kill the server
                log.exception("could not load a new version from %s; still serving %d", self.base, self.current.version)
