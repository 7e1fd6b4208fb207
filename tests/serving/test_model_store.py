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


def test_a_version_whose_files_differ_from_the_exported_list_is_refused_even_where_it_would_load(
    tmp_path: Path, caplog
):
    """Swapped labels load without complaint in any runtime: only the export's list of sizes and
    SHA-256 sums tells them apart."""
    good = _export(tmp_path)
    store = ModelStore(good.parent, runtime="tf")
    changed = good.parent / "2"
    shutil.copytree(good, changed)
    labels = changed / "assets" / "labels.txt"
    labels.write_text(labels.read_text().replace("a", "x"))  # same size, other bytes
    store.poll_once()
    assert store.current.version == 1
    assert "assets/labels.txt differs from the file exported (SHA-256)" in caplog.text


def test_at_start_a_newest_version_still_being_copied_is_passed_over_for_the_last_whole_one(tmp_path: Path, caplog):
    good = _export(tmp_path)
    copying = good.parent / "2"
    shutil.copytree(good, copying)
    variables = next((copying / "variables").glob("*.data-*"))
    size = variables.stat().st_size
    variables.write_bytes(variables.read_bytes()[: size // 2])
    store = ModelStore(good.parent, runtime="tf")
    assert store.current.version == 1
    assert f"has {size // 2} of its {size} bytes" in caplog.text
    shutil.copy2(good / variables.relative_to(copying), variables)
    store.poll_once()
    assert store.current.version == 2


def test_a_version_without_its_assets_is_refused_even_without_a_list_of_files(tmp_path: Path, caplog):
    """An export from before the list (or not from photoclf) is still checked for the assets its
    SavedModel names: TensorFlow loads it without them and answers without labels."""
    good = _export(tmp_path)
    store = ModelStore(good.parent, runtime="tf")
    bare = good.parent / "2"
    shutil.copytree(good, bare)
    shutil.rmtree(bare / "assets")
    store.poll_once()
    assert store.current.version == 1
    assert "assets/" in caplog.text and "is missing" in caplog.text


def test_at_start_a_newest_version_whose_metadata_is_cut_short_is_passed_over(tmp_path: Path, caplog):
    good = _export(tmp_path)
    copying = good.parent / "2"
    shutil.copytree(good, copying)
    metadata = copying / "assets" / "metadata.json"
    metadata.write_bytes(metadata.read_bytes()[:20])
    assert ModelStore(good.parent, runtime="tf").current.version == 1
    assert "assets/metadata.json cannot be read" in caplog.text
