"""The review's answers, kept as a manifest that `photoclf convert` reads.

Each answer is a row: the photo's path (relative to the manifest's folder, as the converter
resolves it) and its label. A photo that is none of the classes gets `keep` = false, so the
converter lists it as left out and never makes a class of it; a skipped photo gets no row and
is asked again next time. An existing manifest keeps its own columns: a new row's `split` is
train (photos chosen for being hard are no random sample, so the evaluation splits stay as they
were), its other columns empty. A new manifest is `path,label,keep`: the converter splits it.
The whole file is written to a temp name and renamed at every answer: a crash loses at most the
answer being written, never the file.
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass
from pathlib import Path

from app import storage
from app.data.manifest import KEEP_COLUMN, header_names, read_manifest_table
from app.errors import UserError
from app.export import layout

NOT_ANY_CLASS = "(not any class)"  # the label cell of a photo that is none of the classes
NEW_HEADER = ("path", "label", KEEP_COLUMN)
REVIEWED_SPLIT = "train"


@dataclass
class Answers:
    path: Path
    header: list[str]
    rows: list[list[str]]

    @classmethod
    def open(cls, path: Path) -> Answers:
        """The manifest at `path`, or a new one; one that the converter would refuse is refused here."""
        storage.check_output_file(path, "--manifest")
        if not path.exists():
            return cls(path, list(NEW_HEADER), [])
        header, rows = read_manifest_table(path)
        return cls(path, header_names(header), [r for r in rows if r])

    @classmethod
    def combined(cls, path: Path, photos_root: Path, index: list[tuple[str, str, str]]) -> Answers:
        """A new manifest that starts with every photo of the run's dataset in its own split
        (`index`: split, path relative to `photos_root`, class), so that converting it gives
        those photos and the answers together; written with the first answer."""
        folder = path.parent.resolve()
        rows = [[_relative(photos_root / relpath, folder), label, split, "true"] for split, relpath, label in index]
        return cls(path, ["path", "label", "split", KEEP_COLUMN], rows)

    @property
    def has_splits(self) -> bool:
        """Whether the manifest says each photo's split (a converter keeps them, and the answers
        join the training split of the photos the run was trained on)."""
        return "split" in self.header and any(row[self.header.index("split")].strip() == "val" for row in self.rows)

    def remove_last(self, photo: Path) -> None:
        """Takes back the last answer, which must be `photo`'s (the page's undo); then writes the file."""
        if not self.rows or (self.path.parent / self.rows[-1][0].strip()).resolve() != photo.resolve():
            raise UserError(f"{self.path}: its last row is not {photo}; nothing was taken back")
        self.rows.pop()
        self._write()

    def reviewed(self) -> set[Path]:
        """Every photo the manifest already names, resolved as the converter resolves it."""
        return {(self.path.parent / row[0].strip()).resolve() for row in self.rows}

    def copies(self, photos: list[Path]) -> set[Path]:
        """Those of `photos` whose bytes are a photo's the manifest names under another path (a
        copy of a training photo, or of a val or test one, which answered would leak into train).
        Only files of a size both sides have are read."""
        sizes = {photo: _size(photo) for photo in photos}
        shared = set(sizes.values()) - {None}
        digests = {_digest(path) for path in self.reviewed() if _size(path) in shared} - {None}  # unreadable: no match
        return {photo for photo, size in sizes.items() if size in shared and _digest(photo) in digests}

    def record(self, photo: Path, label: str | None) -> None:
        """Adds the answer for `photo`: a class, or None for "not any class"; then writes the file."""
        if label is None and KEEP_COLUMN not in self.header:
            self.header.append(KEEP_COLUMN)
            self.rows = [[*row, "true"] for row in self.rows]
        cells = {
            "path": _relative(photo, self.path.parent.resolve()),
            "label": NOT_ANY_CLASS if label is None else label,
            "split": REVIEWED_SPLIT,
            KEEP_COLUMN: "false" if label is None else "true",
        }
        self.rows.append([cells.get(name, "") for name in self.header])
        self._write()

    def _write(self) -> None:
        text = io.StringIO()
        writer = csv.writer(text, lineterminator="\n")
        writer.writerow(self.header)
        writer.writerows(self.rows)
        storage.write_text_atomic(self.path, text.getvalue())


def _relative(photo: Path, folder: Path) -> str:
    return os.path.relpath(photo.resolve(), folder)


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def _digest(path: Path) -> str | None:
    try:
        return layout.sha256_of(path)
    except OSError:
        return None
