"""What the review asks of an export: one label per photo, from the photo alone."""

from __future__ import annotations

from pathlib import Path

from app.errors import UserError
from app.export import layout


def check_reviewable(version: Path) -> dict:
    """The export's metadata; one line, before any photo is read, for an export whose answers
    the ranking cannot use."""
    metadata = layout.read_metadata(version)
    if metadata.get("thresholds"):
        raise UserError(f"{version}: a multi-label model; review ranks the classes of single-label models")
    side = [c["name"] for c in metadata.get("side_features", [])]
    if side:
        raise UserError(f"{version} also takes side features ({', '.join(side)}), which photo files do not carry")
    return metadata
