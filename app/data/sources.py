"""Find the images to convert and assign each to a split, before any file is written.

Three source layouts are accepted: a folder of class folders (split here, stratified and
seeded), a folder already split into train/val[/test], or a CSV manifest `path,label[,split]`
(whose further columns may be side features, app/data/side_features.py).
Everything that can be checked without decoding images is checked here, so a bad SRC fails
in a second instead of after an hour of conversion.
"""

from __future__ import annotations

import csv
import random
from dataclasses import dataclass
from pathlib import Path

from app import storage
from app.data.side_features import Column, parse_numeric
from app.errors import UserError

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class ManifestLimits:
    rows: int = 10_000_000  # ten times the largest photo sets users bring
    columns: int = 256  # path, label, split, keep and side features
    cell_chars: int = 4096  # a path's limit on Linux (PATH_MAX); labels and features are shorter


MANIFEST_LIMITS = ManifestLimits()
MIN_EVAL_PHOTOS = 5  # a class's photos in val or test below which its figures move by 20+ points a photo


@dataclass(frozen=True)
class SourceImage:
    path: Path  # absolute path of the source file
    relpath: str  # path relative to SRC (stored as image/filename)
    class_name: str
    split: str
    side: tuple[str, ...] = ()  # the manifest's cells of each side-feature column, as written


@dataclass(frozen=True)
class Source:
    images: list[SourceImage]
    classes: list[str]  # sorted; index = label id
    skipped: list[dict[str, str]]  # {path, reason} for files rejected before conversion
    layout: str  # "folders", "presplit" or "manifest"
    side_columns: tuple[Column, ...] = ()
    task: str = "single_label"  # or "multi_label": class_name is then the image's labels joined by LABEL_SEPARATOR


LABEL_SEPARATOR = "|"  # between the labels of one photo in a multi-label manifest
_OTHER_SEPARATORS = (";", ",", "/", "+")  # a label list written with one of these is a mistake, not a label


def photo_labels(class_name: str) -> list[str]:
    """A multi-label source image's labels ([] for a photo with none)."""
    return [n for n in class_name.split(LABEL_SEPARATOR) if n]


def _is_hidden(name: str) -> bool:
    return name.startswith(".")


def list_files(folder: Path) -> list[Path]:
    """Regular, non-hidden files below `folder` (recursively), sorted for determinism."""
    files = []
    for path in sorted(folder.rglob("*")):
        if any(_is_hidden(part) for part in path.relative_to(folder).parts):
            continue
        if path.is_file():
            files.append(path)
    return files


def class_dirs(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and not _is_hidden(p.name))


def refused_by_strict(skipped: list[dict[str, str]]) -> list[dict[str, str]]:
    """The skipped files `--strict` refuses: missing or unreadable ones, not the rows a manifest's
    keep column leaves out on purpose."""
    return [s for s in skipped if not s["reason"].startswith(f"{KEEP_COLUMN} = ")]


def _screen(path: Path, root: Path, skipped: list[dict[str, str]]) -> bool:
    """Cheap pre-checks; content checks (decodability, size) happen at conversion."""
    if path.stat().st_size == 0:
        skipped.append({"path": str(path.relative_to(root)), "reason": "zero-byte file"})
        return False
    return True


def split_stratified(
    by_class: dict[str, list[Path]], val_fraction: float, test_fraction: float, seed: int
) -> dict[str, dict[str, list[Path]]]:
    """Split each class on its own, so every split keeps the class balance of the whole; an
    evaluation split gets at least MIN_EVAL_PHOTOS of a class that can spare them.

        The shuffle is seeded per class by name, so adding a class does not reshuffle the others.
    """
    splits: dict[str, dict[str, list[Path]]] = {s: {} for s in SPLITS}
    for name, paths in sorted(by_class.items()):
        paths = sorted(paths)
        random.Random(f"{seed}:{name}").shuffle(paths)
        n_val, n_test = _held_out(len(paths), val_fraction), _held_out(len(paths), test_fraction)
        splits["val"][name] = paths[:n_val]
        splits["test"][name] = paths[n_val : n_val + n_test]
        splits["train"][name] = paths[n_val + n_test :]
    return splits


def _held_out(photos: int, fraction: float) -> int:
    """A class's photos for an evaluation split: its fraction, but at least MIN_EVAL_PHOTOS where
    the class can spare them (a quarter of it each), so 25 photos at 0.1 give 5, not 2."""
    if fraction <= 0:
        return 0
    return max(round(photos * fraction), min(MIN_EVAL_PHOTOS, photos // 4))


def _check_fractions(val_fraction: float, test_fraction: float) -> None:
    for flag, value in (("--val-fraction", val_fraction), ("--test-fraction", test_fraction)):
        if not 0.0 <= value < 1.0:
            raise UserError(f"{flag} must be in [0, 1), got {value}")
    if val_fraction + test_fraction >= 1.0:
        raise UserError("--val-fraction + --test-fraction must leave images for training")


def _check_classes(by_split: dict[str, dict[str, list[Path]]], src: Path) -> list[str]:
    """Every class must have images in every split that was asked for."""
    classes = sorted({c for per_class in by_split.values() for c in per_class})
    if len(classes) < 2:
        raise UserError(f"{src}: found {len(classes)} class(es) {classes}; a classifier needs at least 2")
    for split, per_class in by_split.items():
        if not any(per_class.values()):
            continue  # split not requested
        for name in classes:
            if not per_class.get(name):
                raise UserError(
                    f"{src}: class '{name}' gets no images in split '{split}'"
                    " (add images, or change --val-fraction/--test-fraction)"
                )
    return classes


def _from_folders(src: Path, class_root: Path, skipped: list[dict[str, str]]) -> dict[str, list[Path]]:
    by_class: dict[str, list[Path]] = {}
    for class_dir in class_dirs(class_root):
        files = [p for p in list_files(class_dir) if _screen(p, src, skipped)]
        if not files:
            raise UserError(f"{class_dir}: class folder holds no usable files")
        by_class[class_dir.name] = files
    return by_class


KEEP_COLUMN = "keep"  # optional manifest column: rows marked false/0/no are left out
_FALSE = {"false", "0", "no", "n"}


def _manifest_header(csv_path: Path, header: list[str]) -> tuple[bool, int | None]:
    """(has a split column, index of the keep column). Further columns (e.g. an audit's
    findings) are allowed and ignored."""
    names = [h.strip() for h in header]
    if names[:2] != ["path", "label"]:
        raise UserError(
            f"{csv_path}: the first line must be the header 'path,label' or 'path,label,split'"
            " (more columns may follow)"
        )
    return "split" in names[2:3], names.index(KEEP_COLUMN) if KEEP_COLUMN in names else None


def _side_columns_at(csv_path: Path, header: list[str], columns: tuple[Column, ...]) -> list[int]:
    names = [h.strip() for h in header]
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


def _label_key(label: str, multi_label: bool, where: str) -> str:
    """A manifest's label cell → the class name it is filed under: itself, or (multi-label) its
    labels sorted and joined by LABEL_SEPARATOR ('' for none). A line break cannot be part of a
    label: labels.txt holds one per line."""
    if "\n" in label or "\r" in label:
        raise UserError(f"{where}: label {label!r} holds a line break; a label is one line of text")
    if not multi_label:
        if LABEL_SEPARATOR in label:
            raise UserError(
                f"{where}: label '{label}' lists several labels; pass --multi-label for a multi-label dataset"
            )
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


def _from_manifest(
    csv_path: Path, skipped: list[dict[str, str]], columns: tuple[Column, ...] = (), multi_label: bool = False
) -> tuple[Manifest, bool, dict[Path, tuple[str, ...]]]:
    """Returns {split: {class: paths}} (split '' when the manifest has no split column), whether
    it has a split column, and each path's side-feature cells."""
    header, rows = read_manifest_table(csv_path)
    has_split, keep_at = _manifest_header(csv_path, header)
    side_at = _side_columns_at(csv_path, header, columns)
    by_split: Manifest = {}
    cells: dict[Path, tuple[str, ...]] = {}
    for line_no, row in enumerate(rows, start=2):
        if not row:
            continue
        named = csv_path.parent / row[0].strip()
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
        cells[path] = _side_cells(row, side_at, columns, f"{csv_path}:{line_no}")
        if _screen(path, path.parent, skipped):
            by_split.setdefault(split, {}).setdefault(label, []).append(path)
    return by_split, has_split, cells


def _relpath(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def _check_labels(by_split: dict[str, dict[str, list[Path]]], src: Path) -> list[str]:
    """Multi-label: every label needs a photo in training; a label missing from a requested
    split is allowed (its figures there are undefined, and the evaluation says so)."""
    labels = sorted({n for per_key in by_split.values() for key in per_key for n in photo_labels(key)})
    if len(labels) < 2:
        raise UserError(f"{src}: found {len(labels)} label(s) {labels}; a classifier needs at least 2")
    in_train = {n for key, paths in by_split["train"].items() if paths for n in photo_labels(key)}
    missing = [n for n in labels if n not in in_train]
    if missing:
        raise UserError(f"{src}: label(s) {missing} have no photo in the training split")
    return labels


def _split_multi_label(manifest: Manifest, val_fraction: float, test_fraction: float, seed: int) -> dict[str, Manifest]:
    """A seeded random split of all photos (label sets are too many to stratify by), filed back
    under their label sets."""
    key_of = {p: key for key, paths in manifest.get("", {}).items() for p in paths}
    shuffled = split_stratified({"all": list(key_of)}, val_fraction, test_fraction, seed)
    by_split: dict[str, Manifest] = {}
    for split, per in shuffled.items():
        for p in per.get("all", []):
            by_split.setdefault(split, {}).setdefault(key_of[p], []).append(p)
    return by_split


def _manifest_splits(
    src: Path,
    skipped: list[dict[str, str]],
    val_fraction: float,
    test_fraction: float,
    seed: int,
    feature_columns: tuple[Column, ...],
    multi_label: bool,
) -> tuple[Manifest, dict]:
    """A CSV manifest → ({split: {class: paths}}, each path's side-feature cells)."""
    if src.suffix.lower() != ".csv":
        raise UserError(f"{src}: expected a folder of class folders or a .csv manifest")
    manifest, has_split, cells = _from_manifest(src, skipped, feature_columns, multi_label)
    if not manifest:
        raise UserError(f"{src}: the manifest lists no images")
    if has_split:
        return {s: manifest.get(s, {}) for s in SPLITS}, cells
    if multi_label:
        return {s: {} for s in SPLITS} | _split_multi_label(manifest, val_fraction, test_fraction, seed), cells
    return split_stratified(manifest[""], val_fraction, test_fraction, seed), cells


def _folder_splits(
    src: Path, skipped: list[dict[str, str]], val_fraction: float, test_fraction: float, seed: int
) -> tuple[Manifest, str]:
    """A folder of class folders (split here) or of train/val[/test] → ({split: {class: paths}}, layout)."""
    subdirs = {p.name for p in class_dirs(src)}
    if not subdirs:
        raise UserError(f"{src}: empty; expected one subfolder per class (or train/ and val/)")
    if subdirs <= set(SPLITS) and subdirs & {"train", "val"}:
        if not {"train", "val"} <= subdirs:
            raise UserError(f"{src}: looks pre-split ({sorted(subdirs)}) but needs both train/ and val/")
        return {s: (_from_folders(src, src / s, skipped) if s in subdirs else {}) for s in SPLITS}, "presplit"
    return split_stratified(_from_folders(src, src, skipped), val_fraction, test_fraction, seed), "folders"


def scan_source(
    src: Path,
    val_fraction: float = 0.1,
    test_fraction: float = 0.1,
    seed: int = 0,
    feature_columns: tuple[Column, ...] = (),
    multi_label: bool = False,
) -> Source:
    """Resolve SRC into a list of images with class (multi-label: label set), split and
    side-feature cells. Raises UserError on bad input."""
    src = Path(src)
    _check_fractions(val_fraction, test_fraction)
    skipped: list[dict[str, str]] = []
    cells: dict[Path, tuple[str, ...]] = {}
    storage.must_exist(src)
    if feature_columns and not src.is_file():
        raise UserError(f"--feature-columns: {src} is a folder; side features come from a CSV manifest's columns")
    if multi_label and not src.is_file():
        raise UserError(
            f"--multi-label: {src} is a folder of class folders, one label per photo;"
            f" several labels per photo come from a CSV manifest ('car{LABEL_SEPARATOR}person')"
        )
    if src.is_file():
        root, layout = src.parent.resolve(), "manifest"
        by_split, cells = _manifest_splits(
            src, skipped, val_fraction, test_fraction, seed, tuple(feature_columns), multi_label
        )
    else:
        root = src
        by_split, layout = _folder_splits(src, skipped, val_fraction, test_fraction, seed)
    if not any(by_split["train"].values()):
        raise UserError(f"{src}: no training images")
    classes = _check_labels(by_split, src) if multi_label else _check_classes(by_split, src)
    images = [
        SourceImage(path=p.resolve(), relpath=_relpath(p, root), class_name=name, split=split, side=cells.get(p, ()))
        for split in SPLITS
        for name, paths in sorted(by_split[split].items())
        for p in paths
    ]
    return Source(
        images=images,
        classes=classes,
        skipped=skipped,
        layout=layout,
        side_columns=tuple(feature_columns),
        task="multi_label" if multi_label else "single_label",
    )
