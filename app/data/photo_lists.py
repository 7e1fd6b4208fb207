"""Which photo files a command was pointed at: a folder, a glob or a list of paths.

Used by the commands that take photos without labels (`predict`, `review`); TensorFlow-free, so
a wrong INPUT is said before seconds of import.
"""

from __future__ import annotations

import csv
import glob
import io
import os
from pathlib import Path

from app.data.folder_names import METADATA_FILE
from app.data.sources import files_and_broken_links
from app.errors import UserError


def _from_list(list_file: Path) -> list[Path]:
    """A .txt (one path per line) or .csv (a `path` column, else the first) of paths, relative
    to the list's own folder unless absolute or at the home folder (~/...)."""
    try:
        text = list_file.read_text(encoding="utf-8-sig")  # a spreadsheet's CSV opens with a byte-order mark
    except UnicodeDecodeError:
        raise UserError(f"{list_file}: a list of paths must be UTF-8 text") from None
    if list_file.suffix.lower() == ".csv":
        rows = list(csv.reader(io.StringIO(text)))
        column = rows[0].index("path") if rows and "path" in rows[0] else 0
        names = [r[column] for r in rows[1 if rows and "path" in rows[0] else 0 :] if r]
    else:
        names = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    # os.path's expanduser leaves ~nobody/a.jpg as it is, where Path's raises for an unknown user
    return [list_file.parent / os.path.expanduser(name) for name in names]  # an absolute path stays as it is


LIST_SUFFIXES = (".txt", ".csv")


def read_or_reason(path: Path) -> bytes | str:
    """The file's bytes, or why it cannot be read (a link whose target is gone, no permission):
    that photo's row says so, and the others are still answered."""
    try:
        return path.read_bytes()
    except OSError as err:
        return f"cannot read: {err.strerror or err}"


def evaluate_instead(model_dir: str | Path, source: str) -> str:
    """predict's hint for a TFRecord folder given as INPUT."""
    return f"evaluate reads TFRecords: photoclf evaluate {model_dir} --data {source}"


def check_input(source: str, flag: str = "INPUT", tfrecords_hint: str = "") -> None:
    """Refuse, without listing anything, a `source` that is neither a folder, a file nor a glob,
    and a TFRecord folder (its shards are no photos; `tfrecords_hint` says what reads them)."""
    path = Path(source)
    if path.is_dir() and (path / METADATA_FILE).is_file():
        raise UserError(
            f"{flag} {source}: a TFRecord folder ({METADATA_FILE}), not photo files (a folder of photos, a glob"
            f" or a list of paths){'; ' + tfrecords_hint if tfrecords_hint else ''}"
        )
    if not path.is_dir() and not path.is_file() and not glob.has_magic(source):
        raise UserError(f"{flag} {source}: no such folder, list file or matching glob")


def list_inputs(source: str, flag: str = "INPUT", tfrecords_hint: str = "") -> list[Path]:
    """A folder (recursively, hidden files skipped), a glob pattern, a .txt/.csv list of paths, or
    one photo; none is an error naming `flag`, and so is a TFRecord folder (`check_input`)."""
    check_input(source, flag, tfrecords_hint)
    path = Path(source)
    if path.is_dir():  # a broken link gets its row ("cannot read"), as a missing file in a list does
        found, broken = files_and_broken_links(path)
        files = sorted(found + broken)
    elif path.is_file():
        files = _from_list(path) if path.suffix.lower() in LIST_SUFFIXES else [path]
    else:  # a glob: check_input refused anything else
        files = sorted(Path(p) for p in glob.glob(source, recursive=True) if Path(p).is_file())
    if not files:
        said = "matches no files" if glob.has_magic(source) and not path.exists() else "no files in it"
        raise UserError(f"{flag} {source}: {said}")
    return files
