"""The CSV manifest: `path,label[,split][,keep]` and further columns (side features, an audit's
findings), its limits, its label cells (one label, or a multi-label list joined by
LABEL_SEPARATOR) and its rows read into {split: {class: paths}}, every row checked at its line
before any image is looked at."""

from __future__ import annotations

import csv
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.data.side_features import Column, parse_numeric
from app.errors import UserError

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class ManifestLimits:
    rows: int = 10_000_000  # ten times the largest photo sets users bring
    columns: int = 256  # path, label, split, keep and side features
    cell_chars: int = 4096  # a path's limit on Linux (PATH_MAX); labels and features are shorter


MANIFEST_LIMITS = ManifestLimits()
LABEL_SEPARATOR = "|"  # between the labels of one photo in a multi-label manifest
_OTHER_SEPARATORS = (";", ",", "/", "+")  # a label list written with one of these is a mistake, not a label


KEEP_COLUMN = "keep"  # optional manifest column: rows marked false/0/no are left out
STANDARD_COLUMNS = ("path", "label", "split", KEEP_COLUMN)  # read in any case: "Path,Label" from a spreadsheet
_FALSE = {"false", "0", "no", "n"}


def _manifest_header(csv_path: Path, header: list[str]) -> tuple[bool, int | None]:
    """(has a split column, index of the keep column). Further columns (e.g. an audit's
    findings) are allowed and ignored."""
    names = header_names(header)
    if names[:2] != ["path", "label"]:
        other = next((sep for sep in (";", "\t", "|") if len(header) == 1 and sep in header[0]), None)
        hint = f"; its columns are separated by {other!r}: save it with commas" if other else ""
        found = ",".join(header)
        hint = hint or f", not {found[:60] + ('...' if len(found) > 60 else '')!r}"
        raise UserError(
            f"{csv_path}: the first line must be the header 'path,label' or 'path,label,split'"
            f" (more columns may follow){hint}"
        )
    return "split" in names[2:3], names.index(KEEP_COLUMN) if KEEP_COLUMN in names else None


def header_names(header: list[str]) -> list[str]:
    """The header's names as the converter reads them: stripped, and the standard ones lower-cased
    (side-feature columns keep their case: their names are the user's)."""
    names = [h.strip() for h in header]
    return [n.lower() if n.lower() in STANDARD_COLUMNS else n for n in names]


def _side_columns_at(csv_path: Path, header: list[str], columns: tuple[Column, ...]) -> list[int]:
    names = header_names(header)
    for column in columns:
        if column.name not in names:
            raise UserError(f"{csv_path}: no column '{column.name}' for --feature-columns (it has: {', '.join(names)})")
    return [names.index(c.name) for c in columns]


def _side_cells(row: list[str], at: list[int], columns: tuple[Column, ...], where: str) -> tuple[str, ...]:
    """The row's side-feature cells; a numeric column's cells must be numbers or missing."""
    cells = tuple(row[i] for i in at)
    for column, cell in zip(columns, cells):
        if column.kind == "numeric":
            parse_numeric(cell, where, column.name)
    return cells


Manifest = dict[str, dict[str, list[Path]]]  # {split: {class: paths}}


class SeveralLabels(UserError):
    """A manifest read as single-label whose label cell lists several: a command that reads
    multi-label data says how; one that does not (the audit) says so instead."""

    def __init__(self, where: str, label: str, advice: str = "pass --multi-label for a multi-label dataset"):
        self.where, self.label = where, label
        super().__init__(f"{where}: label '{label}' lists several labels; {advice}")


def _label_key(label: str, multi_label: bool, where: str) -> str:
    """A manifest's label cell → the class name it is filed under: itself, or (multi-label) its
    labels sorted and joined by LABEL_SEPARATOR ('' for none). A line break cannot be part of a
    label: labels.txt holds one per line."""
    if "\n" in label or "\r" in label:
        raise UserError(f"{where}: label {label!r} holds a line break; a label is one line of text")
    if not multi_label:
        if LABEL_SEPARATOR in label:
            raise SeveralLabels(where, label)
        if not label:
            raise UserError(f"{where}: empty label")
        return label
    names = sorted({n.strip() for n in label.split(LABEL_SEPARATOR) if n.strip()})
    for name in names:
        if any(sep in name for sep in _OTHER_SEPARATORS):
            raise UserError(
                f"{where}: label '{name}' looks like a list; separate a photo's labels with '{LABEL_SEPARATOR}'"
            )
    return LABEL_SEPARATOR.join(names)


def _expanded(cell: str) -> str:
    """~/a.jpg as a shell reads it; ~nobody stays. A name no file can have ("~a" with a NUL byte,
    on which the user lookup fails) stays as it is, for `_is_file` to pass over."""
    try:
        return os.path.expanduser(cell)
    except ValueError:
        return cell


def _is_file(path: Path) -> bool:
    """False, not an error, for a name no file can have (a NUL byte, too long for the system)."""
    try:
        return path.is_file()
    except (ValueError, OSError):
        return False


def _manifest_rows(csv_path: Path) -> list[list[str]]:
    """The CSV's rows; UTF-8, with or without a spreadsheet's byte-order mark (not part of 'path'),
    within MANIFEST_LIMITS, each refused at its line before more of the file is read."""
    rows: list[list[str]] = []
    try:
        with csv_path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            for row in reader:
                _check_manifest_row(csv_path, reader.line_num, row, len(rows))
                rows.append(row)
    except UnicodeDecodeError as err:
        line = csv_path.read_bytes()[: err.start].count(b"\n") + 1
        raise UserError(f"{csv_path}:{line}: not UTF-8 text (save the manifest as UTF-8 CSV)") from None
    except csv.Error as err:
        raise UserError(f"{csv_path}:{reader.line_num}: not a readable CSV ({err})") from None
    return rows


def _check_manifest_row(csv_path: Path, line_no: int, row: list[str], rows_before: int) -> None:
    limits = MANIFEST_LIMITS
    if rows_before >= limits.rows:
        raise UserError(f"{csv_path}:{line_no}: more than {limits.rows:,} rows; split the manifest")
    if len(row) > limits.columns:
        raise UserError(f"{csv_path}:{line_no}: {len(row)} columns (at most {limits.columns})")
    longest = max((len(cell) for cell in row), default=0)
    if longest > limits.cell_chars:
        raise UserError(f"{csv_path}:{line_no}: a cell of {longest:,} characters (at most {limits.cell_chars:,})")


def read_manifest_table(csv_path: Path) -> tuple[list[str], list[list[str]]]:
    """A manifest's header and rows (blank ones as []), checked as the converter checks them
    before it looks at any file: UTF-8, the header, each row's number of columns."""
    rows = _manifest_rows(csv_path)
    if not rows:
        raise UserError(f"{csv_path}: the first line must be the header 'path,label' or 'path,label,split'")
    _manifest_header(csv_path, rows[0])
    for line_no, row in enumerate(rows[1:], start=2):
        if row and len(row) != len(rows[0]):
            raise UserError(f"{csv_path}:{line_no}: expected {len(rows[0])} columns, got {len(row)}")
    return rows[0], rows[1:]


def _listed_before(
    listed: dict[Path, tuple[int, str, str]], path: Path, label_split: tuple[str, str], where: str, multi_label: bool
) -> bool:
    """Whether an earlier row names the same photo alike (the repeat is skipped). Named with another
    label or split it is refused: filed twice, one photo would be trained on as two classes, or
    tested on after being trained on."""
    if path not in listed:
        return False
    line, *first = listed[path]
    if tuple(first) == label_split:
        return True
    hint = f" (its labels in one cell, separated by '{LABEL_SEPARATOR}')" if multi_label else ""
    raise UserError(
        f"{where} was listed at line {line} as {_as(*first)} and here as {_as(*label_split)};"
        f" keep one row a photo{hint}"
    )


def _as(label: str, split: str) -> str:
    return f"'{label}'" + (f" in {split}" if split else "")


def read_manifest(
    csv_path: Path,
    skipped: list[dict[str, str]],
    screen: Callable[[Path], bool],
    columns: tuple[Column, ...] = (),
    multi_label: bool = False,
) -> tuple[Manifest, bool, dict[Path, tuple[str, ...]]]:
    """Returns {split: {class: paths}} (split '' when the manifest has no split column), whether
    it has a split column, and each path's side-feature cells. Rows left out (keep column, missing
    file) are added to `skipped`; `screen` decides on each file that exists."""
    header, rows = read_manifest_table(csv_path)
    has_split, keep_at = _manifest_header(csv_path, header)
    side_at = _side_columns_at(csv_path, header, columns)
    by_split: Manifest = {}
    cells: dict[Path, tuple[str, ...]] = {}
    listed: dict[Path, tuple[int, str, str]] = {}  # each photo's first row: line, label, split
    for line_no, row in enumerate(rows, start=2):
        if not row:
            continue
        named = csv_path.parent / _expanded(row[0].strip())
        label = _label_key(row[1].strip(), multi_label, f"{csv_path}:{line_no}")
        split = row[2].strip() if has_split else ""
        if has_split and split not in SPLITS:
            raise UserError(f"{csv_path}:{line_no}: split must be one of {SPLITS}, got '{split}'")
        if keep_at is not None and row[keep_at].strip().lower() in _FALSE:
            skipped.append(
                {"path": row[0].strip(), "reason": f"{KEEP_COLUMN} = {row[keep_at].strip()} in the manifest"}
            )
            continue
        if not _is_file(named):
            skipped.append({"path": row[0].strip(), "reason": f"no such file (line {line_no} of the manifest)"})
            continue
        path = named.resolve()
        if _listed_before(listed, path, (label, split), f"{csv_path}:{line_no}: {row[0].strip()}", multi_label):
            skipped.append({"path": row[0].strip(), "reason": f"listed again (line {listed[path][0]}), kept once"})
            continue
        listed[path] = (line_no, label, split)
        cells[path] = _side_cells(row, side_at, columns, f"{csv_path}:{line_no}")
        if screen(path):
            by_split.setdefault(split, {}).setdefault(label, []).append(path)
    return by_split, has_split, cells
