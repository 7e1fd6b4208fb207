"""`--runtime auto`'s measurement, remembered per export and host: the first command times every
runtime that may serve the export, later ones load only the one it found fastest.

Loading and timing all of them costs seconds and a model's memory each (TensorFlow's SavedModel,
an OpenVINO compile, an ONNX Runtime session), which a short `predict` would pay every time. The
key holds everything the answer depends on: the export's metadata.json (its files' SHA-256 and
parity checks), the CPU, the batch, the runtimes' package versions and what is timed; any
change measures again. Kept in the user's cache (`app.storage.cache_root`), one JSON object;
deleting it measures again too.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from importlib import metadata as packages
from pathlib import Path

from app import storage
from app.export import layout

FILE = "runtime_choices.json"
KEEP = 200  # measurements kept, the newest: one per export, host and batch
PACKAGES = ("tensorflow", "ai-edge-litert", "openvino", "onnxruntime")
# What was timed: a choice timed otherwise is measured again.
TIMED = "each model's pass on decoded pixels; LiteRT side by side where faster"


def choices_path() -> Path:
    return storage.cache_root() / FILE


def cpu_name() -> str:
    """The CPU's model name, as the kernel reports it."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "unknown CPU")


def _cpu() -> str:
    return f"{cpu_name()}, {os.cpu_count()} cores"


def _version(package: str) -> str:
    try:
        return packages.version(package)
    except packages.PackageNotFoundError:
        return "absent"


def choice_key(version: Path, batch: int, litert_mode: str) -> str:
    """What the fastest runtime depends on, as one digest."""
    facts = {
        "metadata": hashlib.sha256(layout.metadata_path(version).read_bytes()).hexdigest(),
        "cpu": _cpu(),
        "batch": batch,
        "litert_mode": litert_mode,
        "packages": {p: _version(p) for p in PACKAGES},
        "timed": TIMED,
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def _read() -> dict:
    try:
        found = json.loads(choices_path().read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def recall(key: str) -> dict | None:
    """{"runtime", "label", "figures", "measured"} as `remember` kept it, or None."""
    found = _read().get(key)
    return found if isinstance(found, dict) and isinstance(found.get("runtime"), str) else None


def remember(key: str, runtime: str, label: str, figures: str) -> None:
    """Keep a measurement; the cache being unwritable only costs the next command a measurement."""
    choices = _read()
    choices[key] = {"runtime": runtime, "label": label, "figures": figures,
                    "measured": time.strftime("%Y-%m-%d %H:%M:%S")}  # fmt: skip
    newest = sorted(choices, key=lambda k: str(choices[k].get("measured")) if isinstance(choices[k], dict) else "")
    choices = {k: choices[k] for k in newest[-KEEP:]}
    try:
        choices_path().parent.mkdir(parents=True, exist_ok=True)
        storage.write_json_atomic(choices_path(), choices)
    except OSError:
        pass
