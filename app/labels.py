"""labels.txt, the one class-list file: one class per line, line index = label id.

The same file sits in a TFRecord folder, in an export's assets/ and beside a TFLite model, so
any tool (TF Serving clients, a phone app) maps ids to names the same way.
"""

from __future__ import annotations

from pathlib import Path

from app import storage
from app.errors import UserError

LABELS_FILE = "labels.txt"


def write_labels(path: str | Path, classes: list[str]) -> None:
    storage.write_text_atomic(path, "".join(f"{name}\n" for name in classes))


def read_labels(path: str | Path) -> list[str]:
    if not storage.exists(path):
        raise UserError(f"{path}: no such labels file")
    return storage.read_text(path).splitlines()
