"""Write a file so that readers see the old content or the new, never half of it."""

from __future__ import annotations

import os
from pathlib import Path


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write a hidden temp file beside `path`, then rename it over `path` (atomic on POSIX)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode())
