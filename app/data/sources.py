"""Find the images to convert and assign each to a split, before any file is written.

Three source layouts are accepted: a folder of class folders (split here, stratified and
seeded), a folder already split into train/val[/test], or a CSV manifest `path,label[,split]`
(whose further columns may be side features, app/data/side_features.py).
Everything that can be checked without decoding images is checked here, so a bad SRC fails
in a second instead of after an hour of conversion.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from app import storage
from app.data.folder_names import METADATA_FILE
from app.data.manifest import KEEP_COLUMN, LABEL_SEPARATOR, SPLITS, Manifest, read_manifest
from app.data.side_features import Column
from app.errors import UserError

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


def photo_labels(class_name: str) -> list[str]:
    """A multi-label source image's labels ([] for a photo with none)."""
    return [n for n in class_name.split(LABEL_SEPARATOR) if n]


SYSTEM_FILES = {"__macosx", "thumbs.db", "desktop.ini"}  # what macOS's zip and Windows' Explorer leave in folders


def _is_hidden(name: str) -> bool:
    """Dotfiles, and the files and folders operating systems leave beside photos: never a photo
    or a class (a zip made on a Mac holds a `__MACOSX` folder of `._` copies)."""
    return name.startswith(".") or name.lower() in SYSTEM_FILES


def files_and_broken_links(folder: Path) -> tuple[list[Path], list[Path]]:
    """Regular, non-hidden files below `folder` (recursively, through linked folders, each real
    folder once), and the links whose target is gone, each sorted for determinism, in one walk: a
    command that passed over the links, or the photos in a linked folder, would lose those photos
    without a word. A link to `folder` or above it is a loop, not photos: passed over."""
    top = Path(os.path.realpath(folder))
    files, broken, seen = [], [], set()
    for root, folders, names in os.walk(folder, followlinks=True):
        real = Path(os.path.realpath(root))
        if real in seen or real in top.parents:
            folders[:] = []
            continue
        seen.add(real)
        folders[:] = [name for name in folders if not _is_hidden(name)]
        for path in (Path(root) / name for name in names if not _is_hidden(name)):
            if path.is_file():
                files.append(path)
            elif path.is_symlink() and not path.exists():
                broken.append(path)
    return sorted(files), sorted(broken)


def list_files(folder: Path) -> list[Path]:
    """Regular, non-hidden files below `folder` (recursively), sorted for determinism."""
    return files_and_broken_links(folder)[0]


def class_dirs(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and not _is_hidden(p.name))


def check_out_beside_src(
    src: Path, out: str | Path, flag: str = "OUT", src_flag: str = "SRC", reader: str = "convert"
) -> None:
    """An output inside a folder of photos would be read as a class, or as photos of one, by the
    next `reader` of that folder."""
    if storage.is_url(str(out)) or not src.is_dir() or not Path(out).resolve().is_relative_to(src.resolve()):
        return
    raise UserError(
        f"{flag} {out} is inside {src_flag} {src}: a later {reader} of {src_flag} would read it as photos;"
        f" write it beside {src_flag}"
    )


def refuse_classes_left_empty(
    source: Source, counts: dict[str, dict[str, int]], skipped: list[dict[str, str]], src: Path
) -> None:
    """A class whose photos in a split were all skipped as they converted (none decoded) is refused
    as the scan refuses a class with none: trained on, it is an output no photo teaches."""
    asked = {image.split for image in source.images}
    for split in sorted(asked):
        for name in source.classes:
            if counts.get(split, {}).get(name, 0) == 0:
                first = next(iter(skipped), {"path": "?", "reason": "?"})
                raise UserError(
                    f"{src}: class '{name}' has no photo in split '{split}' that converts (skipped: {len(skipped)}"
                    f" file(s), the first {first['path']}: {first['reason']})"
                )


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

    A class's photos are ordered by a seeded hash of each file's name: val takes the first, test
    the next, train the rest. So the split does not depend on where the folder is, adding a class
    moves no other class's photos, and photos added to a class leave almost every earlier one in
    its split: a new photo that hashes low pushes an earlier val or test photo towards train (never
    the other way), and only where val and test grow by more than the new photos that land in them
    does an earlier training photo join them."""
    splits: dict[str, dict[str, list[Path]]] = {s: {} for s in SPLITS}
    for name, paths in sorted(by_class.items()):
        paths = sorted(paths, key=lambda p: (_name_hash(p.name, seed), str(p)))
        n_val, n_test = _held_out(len(paths), val_fraction), _held_out(len(paths), test_fraction)
        splits["val"][name] = paths[:n_val]
        splits["test"][name] = paths[n_val : n_val + n_test]
        splits["train"][name] = paths[n_val + n_test :]
    return splits


def _name_hash(name: str, seed: int) -> bytes:
    """By the name's bytes as image/filename stores them: a name that is not UTF-8 hashes too."""
    return hashlib.sha256(f"{seed}:{name}".encode("utf-8", "surrogateescape")).digest()


def _held_out(photos: int, fraction: float) -> int:
    """A class's photos for an evaluation split: its fraction, but at least MIN_EVAL_PHOTOS where
    the class can spare them (a quarter of it each), so 25 photos at 0.1 give 5, not 2."""
    if fraction <= 0:
        return 0
    return max(round(photos * fraction), min(MIN_EVAL_PHOTOS, photos // 4))


def _split_here(by_split: Manifest, src: Path, val_fraction: float, multi_label: bool = False) -> Manifest:
    """A split made here, refused where val got no photo although asked for: photoclf train
    needs val photos, and would refuse the data only after it was written."""
    if val_fraction > 0 and not any(by_split["val"].values()):
        sizes = [len(paths) for paths in by_split["train"].values()]
        few = f"its {sum(sizes)} photos are" if multi_label else f"the largest class has {max(sizes)}:"
        raise UserError(
            f"{src}: no photo goes to val ({few} too few at --val-fraction {val_fraction:g}); photoclf train"
            " needs val photos: add photos, or split them yourself (train/ and val/ folders, or a split column)"
        )
    return by_split


def _check_fractions(val_fraction: float, test_fraction: float) -> None:
    for flag, value in (("--val-fraction", val_fraction), ("--test-fraction", test_fraction)):
        if not 0.0 <= value < 1.0:
            raise UserError(f"{flag} must be in [0, 1), got {value}")
    if val_fraction + test_fraction >= 1.0:
        raise UserError("--val-fraction + --test-fraction must leave images for training")


def case_twins(names: list[str]) -> list[list[str]]:
    """Groups of names that differ only in case ('Tulip', 'tulip'): two classes to the converter
    (a letter's 'A' and 'a' may well be), most often one class typed two ways."""
    groups: dict[str, list[str]] = {}
    for name in sorted(names):
        groups.setdefault(name.casefold(), []).append(name)
    return [group for group in groups.values() if len(group) > 1]


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
                twins = next((g for g in case_twins(classes) if name in g), None)
                hint = f"; {' and '.join(map(repr, twins))} differ only in case" if twins else ""
                raise UserError(
                    f"{src}: class '{name}' gets no images in split '{split}'"
                    f" (add images, or change --val-fraction/--test-fraction){hint}"
                )
    return classes


def _from_folders(src: Path, class_root: Path, skipped: list[dict[str, str]]) -> dict[str, list[Path]]:
    by_class: dict[str, list[Path]] = {}
    for class_dir in class_dirs(class_root):
        if not class_dir.name.isprintable():  # labels.txt holds a label a line, and each must be text
            raise UserError(f"{class_dir}: a class folder's name becomes the model's label, and this one is not"
                            " printable UTF-8 text (a byte shown as \\udcXX, a tab, a newline); rename it")  # fmt: skip
        found, broken = files_and_broken_links(class_dir)
        files = [p for p in found if _screen(p, src, skipped)]
        skipped += [{"path": _relpath(p, src), "reason": "broken link (its target is missing)"} for p in broken]
        if not files:
            raise UserError(f"{class_dir}: class folder holds no usable files (add photos, or move it out)")
        by_class[class_dir.name] = files
    return by_class


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

    def screen(path: Path) -> bool:
        return _screen(path, path.parent, skipped)

    manifest, has_split, cells = read_manifest(src, skipped, screen, feature_columns, multi_label)
    if not manifest:
        missing = [s["path"] for s in skipped if s["reason"].startswith("no such file")]
        if missing:
            raise UserError(
                f"{src}: no row names a file that exists ({len(missing)} missing, the first '{missing[0]}');"
                f" a relative path is read from the manifest's folder, {src.parent.resolve()}"
            )
        raise UserError(f"{src}: the manifest lists no images")
    if has_split:
        return {s: manifest.get(s, {}) for s in SPLITS}, cells
    if multi_label:
        by_split = {s: {} for s in SPLITS} | _split_multi_label(manifest, val_fraction, test_fraction, seed)
        return _split_here(by_split, src, val_fraction, multi_label=True), cells
    return _split_here(split_stratified(manifest[""], val_fraction, test_fraction, seed), src, val_fraction), cells


def _folder_splits(
    src: Path, skipped: list[dict[str, str]], val_fraction: float, test_fraction: float, seed: int
) -> tuple[Manifest, str]:
    """A folder of class folders (split here) or of train/val[/test] → ({split: {class: paths}}, layout)."""
    subdirs = {p.name for p in class_dirs(src)}
    if not subdirs:
        raise UserError(_no_class_folders(src))
    if subdirs <= set(SPLITS) and subdirs & {"train", "val"}:
        if not {"train", "val"} <= subdirs:
            raise UserError(f"{src}: looks pre-split ({sorted(subdirs)}) but needs both train/ and val/")
        return {s: (_from_folders(src, src / s, skipped) if s in subdirs else {}) for s in SPLITS}, "presplit"
    by_split = split_stratified(_from_folders(src, src, skipped), val_fraction, test_fraction, seed)
    return _split_here(by_split, src, val_fraction), "folders"


def _no_class_folders(src: Path) -> str:
    """What to say of a folder with no class folders in it: a TFRecord folder given again, photos
    not yet sorted into classes, or nothing at all."""
    if (src / METADATA_FILE).is_file():
        return f"{src}: a TFRecord folder ({METADATA_FILE}), converted already: photoclf train --data {src}"
    photos = list_files(src)
    if photos:
        return (
            f"{src}: {len(photos)} file(s) but no class folders; put each class's photos in a subfolder named"
            f" after the class ({src / 'CLASS' / photos[0].name}), or give the folder that holds {src.name}/"
        )
    return f"{src}: empty; expected one subfolder per class (or train/ and val/)"


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
