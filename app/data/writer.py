"""Folder/manifest of images → sharded JPEG TFRecords + labels.txt + dataset.json.

Shards are written by worker processes into a hidden temporary folder inside OUT and moved
into place only when every shard is complete; dataset.json is written last. Readers list
shards from dataset.json, so an interrupted run never leaves a shard a reader would pick up.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import multiprocessing as mp
import os
import queue
import random
import signal
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from app import storage
from app.data import duplicates, schema, side_features
from app.data.convert import DEFAULT_MAX_PIXELS, ImageRejected, convert_image
from app.data.install import install
from app.data.sources import (
    SPLITS,
    Source,
    SourceImage,
    check_out_beside_src,
    photo_labels,
    refuse_classes_left_empty,
    refused_by_strict,
    scan_source,
)
from app.errors import UserError
from app.progress import progress_bar

DEFAULT_TARGET_SHARD_MB = 150  # big enough to stream efficiently, small enough to parallelise
# Below this many images a worker process costs more to start (it imports TensorFlow) than it saves.
MIN_IMAGES_FOR_WORKERS = 1000


@dataclass(frozen=True)
class ShardTask:
    split: str
    name: str
    images: list[SourceImage]
    labels: dict[str, int]
    max_side: int | None
    max_pixels: int
    side: list[dict] = field(default_factory=list)  # the fitted side-feature columns (side_features.fit)
    multi_label: bool = False


@dataclass
class ShardResult:
    name: str
    split: str
    counts: Counter = field(default_factory=Counter)  # photos per class (multi-label: per label)
    written: int = 0  # records
    skipped: list[dict[str, str]] = field(default_factory=list)
    reencoded: int = 0
    bytes_written: int = 0
    side_missing: Counter = field(default_factory=Counter)  # side-feature column → missing or unseen cells

    @property
    def records(self) -> int:
        return self.written


_progress: mp.Queue | None = None


def _init_worker(progress: mp.Queue) -> None:
    global _progress
    _progress = progress


def write_shard(task: ShardTask, directory: str) -> ShardResult:
    """Convert and write one shard. Bad images are skipped and reported, never written."""
    import tensorflow as tf  # imported here so `spawn`ed workers pay for it once, lazily

    result = ShardResult(name=task.name, split=task.split)
    with tf.io.TFRecordWriter(storage.join(directory, task.name)) as writer:
        for image in task.images:
            try:
                converted = convert_image(image.path.read_bytes(), task.max_side, task.max_pixels)
            except ImageRejected as err:
                result.skipped.append({"path": image.relpath, "reason": str(err)})
            else:
                side = None
                if task.side:
                    side, missing = side_features.encode(task.side, image.side)
                    result.side_missing.update(c["name"] for c, m in zip(task.side, missing) if m)
                names = photo_labels(image.class_name) if task.multi_label else [image.class_name]
                ids = [task.labels[n] for n in names]
                example = schema.make_example(
                    converted.jpeg,
                    ids if task.multi_label else ids[0],
                    image.class_name,
                    converted.height,
                    converted.width,
                    image.relpath,
                    side,
                )
                writer.write(example.SerializeToString())
                result.counts.update(names)
                result.written += 1
                result.reencoded += converted.reencoded
                result.bytes_written += len(converted.jpeg)
            if _progress is not None:
                _progress.put(1)
    return result


def plan_shards(
    source: Source, num_shards: int | None, target_shard_mb: float, seed: int, max_side: int | None, max_pixels: int
) -> list[ShardTask]:
    """Mix classes within each shard (seeded shuffle, round-robin) and size shards by bytes."""
    labels = {name: i for i, name in enumerate(source.classes)}
    side = side_features.fit(list(source.side_columns), [im.side for im in source.images if im.split == "train"])
    tasks = []
    for split in SPLITS:
        images = [im for im in source.images if im.split == split]
        if not images:
            continue
        random.Random(f"{seed}:{split}").shuffle(images)
        if num_shards is None:
            total_mb = sum(im.path.stat().st_size for im in images) / 2**20
            count = max(1, math.ceil(total_mb / target_shard_mb))
        else:
            count = num_shards
        count = min(count, len(images))
        for index in range(count):
            name = schema.shard_name(split, index, count)
            tasks.append(
                ShardTask(
                    split, name, images[index::count], labels, max_side, max_pixels, side, source.task == "multi_label"
                )
            )
    return tasks


def writer_part_name(index: int, count: int) -> str:
    """Per-writer metadata in split-writer mode; scripts/merge_tfrecords.py combines them."""
    return f"dataset.writer-{index:05d}-of-{count:05d}.json"


def _checked_part(src: Path, out: str, overwrite: bool, writer_index: int, num_writers: int) -> str | None:
    """This writer's part name (None for a single writer), once OUT is checked to take its shards."""
    check_out_beside_src(src, out)
    part = writer_part_name(writer_index, num_writers) if num_writers > 1 else None
    _check_out(out, overwrite, part)
    return part


def _check_out(out: str, overwrite: bool, part: str | None = None) -> None:
    storage.check_url(out, "OUT")
    if storage.exists(out) and not storage.isdir(out):
        raise UserError(f"{out}: exists and is not a folder")
    storage.check_output_folder(out, "OUT")
    if part is not None:  # split-writer mode: other writers' shards are expected here
        for name in (part, schema.METADATA_FILE):
            if storage.exists(storage.join(out, name)) and not overwrite:
                raise UserError(f"{out}: already holds {name}; pass --overwrite to replace")
        return
    if not overwrite:
        existing = [n for n in storage.listdir(out) if n.endswith(".tfrecord") or n == schema.METADATA_FILE]
        if existing:
            raise UserError(
                f"{out}: already holds {existing[0]} (and {len(existing) - 1} more); pass --overwrite to replace"
            )


def _run_tasks(tasks: list[ShardTask], directory: str, workers: int) -> list[ShardResult]:
    total = sum(len(t.images) for t in tasks)
    bar = progress_bar(total, "img", "Writing shards")
    if workers <= 1:
        results = []
        for task in tasks:
            results.append(write_shard(task, directory))
            bar.update(len(task.images))
        bar.close()
        return results
    ctx = mp.get_context("spawn")  # TensorFlow is not fork-safe
    progress = ctx.Queue()
    with _ctrl_c_ignored():  # the workers inherit it: Ctrl-C stops the main process, which ends them
        pool = ctx.Pool(workers, initializer=_init_worker, initargs=(progress,))
    with pool:  # leaving it terminates the workers, a shard half-written included (staging is removed)
        pending = [pool.apply_async(write_shard, (task, directory)) for task in tasks]
        while not all(r.ready() for r in pending) or bar.n < total:
            try:
                bar.update(progress.get(timeout=0.2))
            except queue.Empty:
                if any(r.ready() and not r.successful() for r in pending):
                    break
        bar.close()
        return [r.get() for r in pending]


@contextlib.contextmanager
def _ctrl_c_ignored() -> Iterator[None]:
    """SIGINT ignored while worker processes start: they keep ignoring it (each printed its own
    KeyboardInterrupt traceback, often from inside TensorFlow's import, on one Ctrl-C)."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread sets handlers
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _check_options(
    num_shards: int | None, max_side: int | None, workers: int | None, num_writers: int, writer_index: int
) -> None:
    if num_shards is not None and num_shards < 1:
        raise UserError(f"--num-shards must be >= 1, got {num_shards}")
    if max_side is not None and max_side < 16:
        raise UserError(f"--max-side must be >= 16, got {max_side}")
    if workers is not None and workers < 1:
        raise UserError(f"--workers must be >= 1, got {workers}")
    if num_writers < 1 or not 0 <= writer_index < num_writers:
        raise UserError(f"--writer-index must be in [0, --num-writers), got {writer_index} of {num_writers}")


def _scan(
    src: Path,
    val_fraction: float,
    test_fraction: float,
    seed: int,
    drop_duplicates: bool,
    feature_columns: str | None,
    multi_label: bool,
    strict: bool,
) -> tuple[Source, list[list[SourceImage]]]:
    """The source to convert, and its byte-identical groups (the same on every writer: they
    plan the same shards), dropped from it with `drop_duplicates`. `strict` refuses a missing
    or empty file here, before any work."""
    source = scan_source(
        src, val_fraction, test_fraction, seed, tuple(side_features.parse_columns(feature_columns)), multi_label
    )
    if strict:
        _refuse_skipped(refused_by_strict(source.skipped))
    groups = duplicates.duplicate_groups(source)
    return (duplicates.drop_duplicates(source, groups) if drop_duplicates else source), groups


def write_tfrecords(
    src: Path,
    out: str | Path,
    *,
    val_fraction: float = 0.1,
    test_fraction: float = 0.1,
    seed: int = 0,
    num_shards: int | None = None,
    target_shard_mb: float = DEFAULT_TARGET_SHARD_MB,
    max_side: int | None = None,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    workers: int | None = None,
    overwrite: bool = False,
    num_writers: int = 1,
    writer_index: int = 0,
    drop_duplicates: bool = False,
    feature_columns: str | None = None,
    multi_label: bool = False,
    strict: bool = False,
) -> dict:
    """Convert SRC (a folder or CSV) into shards in OUT (local or a tf.io.gfile URL); returns
    dataset.json. N writers (writer_index 0..N-1) each write every N-th shard of one plan, then
    merge_writers(OUT). Unreadable files are skipped and listed, or with `strict` refused."""
    src, out = Path(src), str(out)
    _check_options(num_shards, max_side, workers, num_writers, writer_index)
    part = _checked_part(src, out, overwrite, writer_index, num_writers)
    source, groups = _scan(
        src, val_fraction, test_fraction, seed, drop_duplicates, feature_columns, multi_label, strict
    )
    tasks = plan_shards(source, num_shards, target_shard_mb, seed, max_side, max_pixels)
    if part is not None:
        tasks, source = _writers_share(tasks, source, writer_index, num_writers)
    options = {"val_fraction": val_fraction, "test_fraction": test_fraction, "seed": seed, "num_shards": num_shards,
               "target_shard_mb": target_shard_mb, "max_side": max_side, "max_pixels": max_pixels,
               "layout": source.layout, "drop_duplicates": drop_duplicates}  # fmt: skip
    created = storage.makedirs(out)
    staging = storage.make_temp_dir(out, ".incomplete-")
    try:
        with storage.space_named(out):
            results = _run_tasks(tasks, staging, _worker_count(workers, source, tasks))
        metadata = _metadata(source, results, src, options) | _kind_metadata(source, tasks, results, feature_columns)
        metadata["duplicates"] = {**duplicates.describe(groups), "dropped": drop_duplicates}
        _refuse_what_failed(source, results, metadata, src, strict, whole=part is None)
        if part is not None:
            metadata["writer"] = {"index": writer_index, "count": num_writers}
        install([r.name for r in results], staging, out, metadata, source.classes, part, overwrite)
    finally:
        storage.rmtree(staging)
        storage.remove_if_empty(created)  # a failed first conversion leaves no empty OUT
    return metadata


def _refuse_what_failed(
    source: Source, results: list[ShardResult], metadata: dict, src: Path, strict: bool, whole: bool
) -> None:
    """Before anything is installed: with `strict`, any file skipped as it converted; and a class
    left with no photo in a split (checked on the whole dataset: one writer's share may lack one)."""
    if strict:
        _refuse_skipped([s for r in results for s in r.skipped])
    if whole and source.task == "single_label":
        refuse_classes_left_empty(source, metadata["counts"], metadata["skipped"], src)


def _writers_share(
    tasks: list[ShardTask], source: Source, writer_index: int, num_writers: int
) -> tuple[list[ShardTask], Source]:
    """One writer's shards of the plan every writer makes; the files the scan rejected are
    reported once, by writer 0."""
    skipped = source.skipped if writer_index == 0 else []
    return tasks[writer_index::num_writers], dataclasses.replace(source, skipped=skipped)


def _refuse_skipped(skipped: list[dict[str, str]]) -> None:
    if skipped:
        first = skipped[0]
        more = f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else ""
        raise UserError(f"--strict: {first['path']}: {first['reason']}{more}; nothing written")


def _worker_count(workers: int | None, source: Source, tasks: list[ShardTask]) -> int:
    if workers is None:
        workers = 1 if len(source.images) < MIN_IMAGES_FOR_WORKERS else os.cpu_count() or 1
    return max(1, min(workers, len(tasks)))


def _kind_metadata(
    source: Source, tasks: list[ShardTask], results: list[ShardResult], feature_columns: str | None
) -> dict:
    """dataset.json's keys for side features and for multi-label data; none for a plain dataset."""
    extra = {}
    if tasks and tasks[0].side:
        extra.update(_side_metadata(tasks[0].side, results, feature_columns))
    if source.task == "multi_label":  # counts are then photos per label; examples, photos per split
        extra.update(task=source.task, examples=_examples_per_split(results))
    return extra


def _examples_per_split(results: list[ShardResult]) -> dict[str, int]:
    examples: Counter = Counter()
    for result in results:
        examples[result.split] += result.written
    return dict(examples)


def _side_metadata(side: list[dict], results: list[ShardResult], feature_columns: str) -> dict:
    """The fitted columns (what the model needs) and the missing cells per split and column."""
    missing: dict[str, dict[str, int]] = {}
    for result in results:
        per_column = missing.setdefault(result.split, {c["name"]: 0 for c in side})
        for name, n in result.side_missing.items():
            per_column[name] += n
    return {"side_features": side, "side_feature_missing": missing, "feature_columns": feature_columns}


def _metadata(source: Source, results: list[ShardResult], src: Path, options: dict) -> dict:
    counts: dict[str, dict[str, int]] = {}
    shards: dict[str, list[str]] = {}
    for result in sorted(results, key=lambda r: r.name):
        per_class = counts.setdefault(result.split, {c: 0 for c in source.classes})
        for name, n in result.counts.items():
            per_class[name] += n
        shards.setdefault(result.split, []).append(result.name)
    return {
        "schema_version": schema.SCHEMA_VERSION,
        "source": str(Path(src).resolve()),  # where the photos are: photoclf review adds to them
        "classes": source.classes,
        "counts": counts,
        "shards": shards,
        "shard_records": {r.name: r.records for r in sorted(results, key=lambda r: r.name)},
        "reencoded": sum(r.reencoded for r in results),
        "bytes": sum(r.bytes_written for r in results),
        "options": options,
        "skipped": source.skipped + [s for r in results for s in r.skipped],
    }
