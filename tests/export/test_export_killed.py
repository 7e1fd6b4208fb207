"""kill -9 in the middle of an export: the server keeps its version and never sees the partial one,
and the next export completes (and clears what the killed one left)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import with_tiny_backbone

from app.export import layout
from app.serving.store import ModelStore


def export(run: Path, export_dir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        with_tiny_backbone("export.py", str(run), "--export-dir", str(export_dir), "--name", "m"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def wait_for_staging(model_dir: Path, proc: subprocess.Popen, seconds: float = 120) -> Path:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        found = list(model_dir.glob(f"{layout.STAGING_PREFIX}*"))
        if found:
            return found[0]
        time.sleep(0.01)
    pytest.fail(f"no staging folder appeared (export exited {proc.poll()}: {proc.stderr.read().decode()[-1500:]})")


@pytest.mark.slow  # two export processes (TensorFlow's import, a SavedModel and a LiteRT file each)
def test_kill_9_during_export_keeps_the_served_version_and_the_next_export_completes(trained_run: Path, tmp_path: Path):
    model_dir = tmp_path / "export" / "m"
    shutil.copytree(trained_run / "export" / "shapes" / "1", model_dir / "1")
    store = ModelStore(model_dir, runtime="tf")

    killed = export(trained_run, tmp_path / "export")
    staging = wait_for_staging(model_dir, killed)
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=30)
    assert staging.exists() and layout.versions(model_dir) == [1]  # the partial export is hidden
    store.poll_once()
    assert store.current.version == 1

    again = export(trained_run, tmp_path / "export")
    said, errors = again.communicate(timeout=300)
    assert again.returncode == 0, errors.decode()[-2000:]
    lines = said.decode().splitlines()  # what it wrote, and each file's check in a line
    assert lines[0] == f"model: {model_dir / '2'}" and lines[-1].endswith(str(layout.metadata_path(model_dir / "2")))
    assert any(line.startswith("litert: float32 file agrees with the SavedModel on") for line in lines)
    assert layout.versions(model_dir) == [1, 2] and not staging.exists()  # the killed one's folder cleared
    store.poll_once()
    assert store.current.version == 2
    assert store.current.runtime.run("serving_default", {"image_bytes": _one_jpeg()})["classes"].shape[0] == 1


def _one_jpeg():
    import numpy as np

    from app.inference.runtime import tiny_jpeg

    return np.array([tiny_jpeg()], dtype=object)
