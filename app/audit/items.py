"""What the audit looks at: every image of DATA with its split and label, and the ones it could not read.

DATA is anything `photoclf convert` accepts (class folders, a pre-split tree, a CSV manifest;
class folders are split as the converter would split them, same fractions and seed) or a
TFRecord folder it wrote. Files are read through the converter's own `convert_image`, so the
audit sees what training would see, and rejects what the converter would reject, with its reason.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import tensorflow as tf

from app.data import schema
from app.data.convert import ImageRejected, convert_image
from app.data.manifest import SeveralLabels
from app.data.pipeline import dataset_fingerprint, load_dataset_info
from app.data.sources import scan_source
from app.errors import UserError

SINGLE_LABEL_ONLY = "the audit reads single-label data only"


@dataclass(frozen=True)
class AuditItem:
    name: str  # the path relative to DATA (or the record's stored filename)
    split: str
    label: str
    source: str  # the file to show and to write into a manifest: an absolute path, or "" for records


@dataclass(frozen=True)
class AuditInput:
    root: str  # DATA as given
    items: list[AuditItem]
    classes: list[str]
    unreadable: list[dict[str, str]]  # {path, reason}: skipped before or while reading
    read: Callable[[], Iterator[tuple[int, bytes]]]  # (item index, JPEG bytes) for every readable item
    fingerprint: str  # changes when any file, label or split changes: keys the embedding cache


def load_audit_input(data: str | Path) -> AuditInput:
    data = Path(data)
    if (data / schema.METADATA_FILE).is_file():
        return _from_records(data)
    try:
        source = scan_source(data)
    except SeveralLabels as err:
        raise SeveralLabels(err.where, err.label, advice=f"a multi-label dataset, and {SINGLE_LABEL_ONLY}") from None
    items = [AuditItem(i.relpath, i.split, i.class_name, str(i.path)) for i in source.images]
    unreadable = list(source.skipped)

    def read() -> Iterator[tuple[int, bytes]]:
        for index, item in enumerate(items):
            try:
                yield index, convert_image(Path(item.source).read_bytes()).jpeg
            except (ImageRejected, OSError) as err:
                unreadable.append({"path": item.name, "reason": str(err)})

    stats = [
        (i.name, i.split, i.label, Path(i.source).stat().st_size, Path(i.source).stat().st_mtime_ns) for i in items
    ]
    return AuditInput(str(data), items, source.classes, unreadable, read, _digest(stats))


def _digest(value: object) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()


def _from_records(data: Path) -> AuditInput:
    """Items from one parse of the shards; `read` streams the payloads again rather than holding
    every JPEG of the dataset in memory."""
    info = load_dataset_info(data)
    if info.multi_label:  # its label checks compare one class per photo
        raise UserError(f"{data}: a multi-label dataset; {SINGLE_LABEL_ONLY}")
    paths = [(split, path) for split in sorted(info.shards) for path in info.shard_paths(split)]

    def records():
        for split, path in paths:
            for raw in tf.data.TFRecordDataset(path):
                yield split, tf.io.parse_single_example(raw, schema.FEATURE_SPEC)

    items = [
        AuditItem(schema.stored_filename(ex[schema.FILENAME].numpy()), split, info.classes[int(ex[schema.LABEL])], "")
        for split, ex in records()
    ]
    if not items:
        raise UserError(f"{data}: the TFRecord folder holds no records")

    def read() -> Iterator[tuple[int, bytes]]:
        for index, (_, ex) in enumerate(records()):
            yield index, ex[schema.ENCODED].numpy()

    return AuditInput(str(data), items, info.classes, [], read, dataset_fingerprint(data))
