"""The server's model store: a broken or half-copied new version is refused once, the last good
one keeps serving, and the version loads when its files are complete."""

from __future__ import annotations

import shutil
from pathlib import Path

import keras

from app.export.saved_model import export_saved_model
from app.serving.store import ModelStore


def _export(root: Path) -> Path:
    inputs = keras.Input((16, 16, 3))
    model = keras.Model(
        inputs, keras.layers.Dense(2, activation="softmax")(keras.layers.GlobalAveragePooling2D()(inputs))
    )
    return export_saved_model(model, ["a", "b"], 16, root, "m", version=1)


def test_a_broken_version_is_refused_once_and_loads_when_its_files_are_whole(tmp_path: Path, monkeypatch):
    good = _export(tmp_path)
    store = ModelStore(good.parent, runtime="tf")
    broken = good.parent / "2"
    shutil.copytree(good, broken)
    pb = broken / "saved_model.pb"
    pb.write_bytes(pb.read_bytes()[:100])  # cut short, as by a copy in progress or a full disk
    loads = []
    real_load = store._load
    monkeypatch.setattr(store, "_load", lambda version: loads.append(version) or real_load(version))
    store.poll_once()
    store.poll_once()  # unchanged files: not loaded again
    assert store.current.version == 1 and loads == [2]
    shutil.copy2(good / "saved_model.pb", pb)  # the copy completes
    store.poll_once()
    assert store.current.version == 2 and loads == [2, 2]
